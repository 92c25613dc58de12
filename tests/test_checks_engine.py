"""evaluate / verdict / validity, parameter layering and the checklist TOML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.checks import (
    CHECK_IDS,
    REGISTRY,
    RUN_COMPLETED,
    Check,
    evaluate,
    judge_scenario,
    load_checklist,
    resolve_params,
    validity,
    verdict,
)
from harness.errors import ConfigError, ResultFormatError
from harness.testing.checks import counters, good_steady, hdr, result
from harness.testing.results import stage

ROOT = Path(__file__).resolve().parent.parent


def test_every_registered_check_states_its_threshold_op_unit_and_summary() -> None:
    # which ids must exist is pinned once, in tests/test_catalog.py
    assert tuple(REGISTRY) == CHECK_IDS
    for spec in REGISTRY.values():
        assert "threshold" in spec.defaults, spec.id
        assert spec.op in ("<=", ">=", "==") and spec.unit and spec.summary


def test_registry_matches_the_scenario_formats_check_ids() -> None:
    from harness.load.scenario import CHECK_IDS as SCENARIO_IDS

    assert set(SCENARIO_IDS) == set(CHECK_IDS)


# --- evaluate ---------------------------------------------------------------------------------


def test_evaluate_runs_listed_checks_plus_accounting() -> None:
    checks = evaluate(good_steady())
    assert [c.id for c in checks] == [
        "steady.p99_ms",
        "steady.error_rate",
        "steady.throughput",
        "accounting.balanced",
    ]
    assert all(c.passed for c in checks)
    assert verdict(checks, validity(good_steady())) == "pass"


def test_layers_defaults_then_scenario_then_checklist() -> None:
    sc = good_steady()
    sc["check_config"]["steady.p99_ms"] = {"stage": "steady", "threshold": 4}
    assert evaluate(sc)[0].threshold == 4 and evaluate(sc)[0].passed is False
    checks = evaluate(sc, {"steady.p99_ms": {"threshold": 50}})
    assert checks[0].threshold == 50 and checks[0].passed is True
    # a checklist entry for a check the scenario does not list adds nothing
    assert len(evaluate(sc, {"soak.rss_trend": {"threshold": 2}})) == 4
    p = resolve_params("steady.p99_ms", {"threshold": 4}, {"confidence": 0.95})
    assert p["threshold"] == 4 and p["confidence"] == 0.95 and p["enabled"] is True


def test_disabled_check_is_skipped_not_passed() -> None:
    checks = evaluate(good_steady(), {"steady.p99_ms": {"enabled": False}})
    assert checks[0].passed is None and "disabled" in checks[0].skipped


def test_unknown_ids_and_params_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown check id 'steady\.p98'.*Valid ids"):
        evaluate(good_steady(check_config={"steady.p98": {}}))
    with pytest.raises(
        ConfigError, match=r"no parameter 'treshold'.*Valid parameters: .*threshold"
    ):
        evaluate(good_steady(), {"steady.p99_ms": {"treshold": 1}})
    with pytest.raises(ConfigError, match=r"'threshold' has value 'fast'. Not a valid number"):
        resolve_params("steady.p99_ms", {"threshold": "fast"})
    with pytest.raises(ConfigError, match="Not a valid boolean"):
        resolve_params("soak.rss_trend", {"inconclusive_fails": 1})


def test_malformed_result_is_a_result_format_error() -> None:
    sc = good_steady()
    sc["stages"] = [{"name": "steady", "rate_rps": 100}]  # no start_s / end_s
    with pytest.raises(ResultFormatError, match=r"check 'steady.throughput' cannot read"):
        evaluate(sc)


# --- verdict and validity -------------------------------------------------------------------


def mk(passed: bool | None) -> Check:
    return Check("x", passed, 1, 1, "<=", "s", 1, "d", None if passed is not None else "why")


def test_verdict() -> None:
    assert verdict([mk(True), mk(None)]) == "pass"
    assert verdict([mk(True), mk(False), mk(None)]) == "fail"
    assert verdict([mk(True)], ["generator saturated"]) == "invalid"
    assert verdict([mk(False)], ["generator saturated"]) == "invalid"


def test_validity_flags_a_saturated_generator() -> None:
    t = [float(i) for i in range(40)]
    cpu = [40.0] * 20 + [97.0] * 10 + [40.0] * 10
    sc = good_steady(system={"series": {"t": t, "cpu_pct": cpu, "loadgen_cpu_pct": cpu}})
    reasons = validity(sc)
    assert len(reasons) == 1 and "load generator CPU" in reasons[0]
    assert verdict(evaluate(sc), reasons) == "invalid"
    blip = [40.0] * 40
    blip[5] = 99.0
    assert validity(good_steady(system={"series": {"t": t, "loadgen_cpu_pct": blip}})) == []
    assert validity(sc, {"validity": {"loadgen_sustain_s": 20}}) == []
    # two Locust worker processes: 97 % summed is half a core each
    assert validity({**sc, "load": {"workers": 2}}) == []


def test_validity_dispatch_lag_is_relative_to_the_scenarios_slo() -> None:
    lag = hdr([1000] * 980 + [15_000] * 20)  # p99 15 ms
    sc = good_steady(dispatch_lag_hdr=lag)
    assert validity(sc) == []  # default SLO 200 ms → 20 ms allowed
    sc["check_config"]["steady.p99_ms"]["threshold"] = 100  # → 10 ms allowed
    (reason,) = validity(sc)
    assert "dispatch lag p99 15.0 ms > 10.0 ms" in reason
    # the checklist's SLO counts too
    assert validity(good_steady(dispatch_lag_hdr=lag), {"steady.p99_ms": {"threshold": 100}})
    # a token scenario's SLO is its TTFT bound (2,000 ms → 200 ms allowed)
    slow = hdr([1000] * 980 + [150_000] * 20)  # p99 150 ms
    llm = good_steady(dispatch_lag_hdr=slow)
    llm["check_config"] = {"llm.ttft_p99": {"stage": "steady"}}
    assert validity(llm) == []
    llm["check_config"]["llm.ttft_p99"]["threshold"] = 1000  # → 100 ms allowed
    (reason,) = validity(llm)
    assert "dispatch lag p99 150.0 ms > 100.0 ms" in reason


def test_a_spikes_dispatch_lag_is_relative_to_its_ttft_and_refusal_bounds() -> None:
    """llm.overload times a spike's first tokens (ttft_ms) and its 429/503s (reject_ms)
    from the intended send, and spike.fail_fast the median 503/429 time: the tightest
    sets the lag allowed, not the 200 ms default of a scenario that judges no latency."""
    lag = hdr([1000] * 980 + [40_000] * 20)  # p99 40 ms: over 10 % of 200 ms
    spike = good_steady(dispatch_lag_hdr=lag)
    spike["check_config"] = {"llm.overload": {"stage": "steady"}}
    assert validity(spike) == []  # reject_ms 1,000 ms → 100 ms allowed
    spike["check_config"]["llm.overload"]["reject_ms"] = 300  # → 30 ms allowed
    (reason,) = validity(spike)
    assert "dispatch lag p99 40.0 ms > 30.0 ms" in reason
    spike["check_config"]["llm.overload"] = {"stage": "steady", "ttft_ms": 250}  # → 25 ms
    (reason,) = validity(spike)
    assert "dispatch lag p99 40.0 ms > 25.0 ms" in reason
    # a V2 spike's fail-fast bounds the median 503/429 time (1,000 ms → 100 ms allowed)
    spike["check_config"] = {"spike.fail_fast": {}, "spike.recovery_s": {}}
    assert validity(spike) == []
    spike["check_config"]["spike.fail_fast"]["max_reject_p50_ms"] = 250  # → 25 ms
    (reason,) = validity(spike)
    assert "dispatch lag p99 40.0 ms > 25.0 ms" in reason
    # a scenario with no latency bound keeps the default
    spike["check_config"] = {"llm.goodput": {"stage": "steady"}}
    (reason,) = validity(spike)
    assert "dispatch lag p99 40.0 ms > 20.0 ms" in reason


def test_validity_margins_report_how_close_a_run_came() -> None:
    from harness.checks.engine import validity_margins

    t = [float(i) for i in range(40)]
    cpu = [40.0] * 20 + [97.0] * 10 + [40.0] * 10
    cpu[28] = 70.0  # t = 20..25 still holds 97 % for 5 s
    lag = hdr([1000] * 980 + [15_000] * 20)
    sc = good_steady(dispatch_lag_hdr=lag, system={"series": {"t": t, "loadgen_cpu_pct": cpu}})
    m = validity_margins(sc)
    assert m["dispatch_lag_p99_ms"][0] == pytest.approx(15.0, rel=0.01)
    assert m["dispatch_lag_p99_ms"][1] == pytest.approx(20.0)
    assert m["loadgen_cpu_pct"] == (97.0, 90.0)
    cpu[23] = 70.0  # now no 5 s window holds 97 %: the held level is the dip's
    assert validity_margins(sc)["loadgen_cpu_pct"] == (70.0, 90.0)
    # the margin and the validity rule agree: invalid exactly when the held level
    # reaches the limit
    from harness.analysis.validity import loadgen_saturated, sustained_level

    for limit in (69.0, 70.0, 71.0):
        held = sustained_level(t, cpu, 5.0)
        assert (loadgen_saturated(t, cpu, max_pct=limit) is not None) == (held >= limit)
    assert validity_margins({**sc, "load": {"workers": 2}})["loadgen_cpu_pct"][1] == 180.0
    assert validity_margins({}) == {}


def test_validity_sampler_gaps_and_accounting() -> None:
    server = {"pid": 1, "interval_s": 1.0, "ticks": 50, "missed_ticks": 10, "series": {"t": []}}
    (reason,) = validity(good_steady(server=server))
    assert "missed 10 of 60 ticks" in reason
    sc = good_steady()
    sc["counters"] = {**counters(3960), "scheduled": 4000}
    (reason,) = validity(sc)
    assert "does not balance" in reason and "off by +40" in reason
    checks = evaluate(sc)
    assert checks[-1].id == "accounting.balanced" and checks[-1].passed is False
    assert verdict(checks, validity(sc)) == "invalid"


# --- checklist TOML ---------------------------------------------------------------------------


def test_load_checklist_both_layouts(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text('["steady.p99_ms"]\nthreshold = 80\n\n["soak.rss_trend"]\nbucket_s = 60\n')
    assert load_checklist(a) == {
        "steady.p99_ms": {"threshold": 80},
        "soak.rss_trend": {"bucket_s": 60},
    }
    b = tmp_path / "b.toml"
    b.write_text(
        '[checks."spike.recovery_s"]\nthreshold = 5\n[checks.validity]\nloadgen_max_pct = 80\n'
    )
    over = load_checklist(b)
    assert over["spike.recovery_s"] == {"threshold": 5}
    t = [float(i) for i in range(40)]
    cpu = [85.0] * 40
    sc = good_steady(system={"series": {"t": t, "loadgen_cpu_pct": cpu}})
    assert validity(sc) == [] and len(validity(sc, over)) == 1


def test_load_checklist_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_checklist(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[steady.p99_ms\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_checklist(bad)
    unknown = tmp_path / "u.toml"
    unknown.write_text('["steady.p95_ms"]\nthreshold = 1\n')
    with pytest.raises(ConfigError, match=r"unknown check id 'steady.p95_ms'"):
        load_checklist(unknown)
    param = tmp_path / "p.toml"
    param.write_text('["spike.recovery_s"]\nhold = 3\n')
    with pytest.raises(ConfigError, match=r"no parameter 'hold'.*hold_s"):
        load_checklist(param)
    val = tmp_path / "v.toml"
    val.write_text("[validity]\nloadgen_pct = 3\n")
    with pytest.raises(ConfigError, match=r"unknown parameter.*loadgen_max_pct"):
        load_checklist(val)


def test_evaluate_on_a_quick_spike_shaped_result() -> None:
    """One spike result as the plugin writes it (stage warm-up, late rows, dropped)."""
    rows = []
    for t in range(60):
        p = 12.0 if t < 20 or t >= 33 else 350.0
        errs = {"http_503": 40} if 20 <= t < 30 else {}
        for cls in ("default", "high"):
            rows.append(
                {
                    "t": float(t),
                    "class": cls,
                    "scheduled": 60,
                    "n": 50,
                    "ok": 50 - (errs.get("http_503", 0) // 2),
                    "errors": {k: v // 2 for k, v in errs.items()},
                    "p50_ms": p / 3,
                    "p99_ms": p,
                }
            )
    rows.append({**rows[70], "late": True, "p99_ms": 13.0})  # a late row for t = 35
    c = counters(5000, {"http_503": 400, "timeout": 4}, dropped=0)
    sc = result(
        stages=[
            stage("baseline", 0, 20, 50, warmup_s=5),
            stage("spike", 20, 30, 200),
            stage("recovery", 30, 60, 50),
        ],
        counters=c,
        windows={"width_s": 1.0, "rows": rows},
        error_latency_hdr=hdr([3000] * 404),
        check_config={
            "spike.recovery_s": {"baseline_stage": "baseline", "event_stage": "spike"},
            "spike.fail_fast": {},
            "accounting.balanced": {},
        },
    )
    checks = evaluate(sc)
    assert [x.id for x in checks] == ["spike.recovery_s", "spike.fail_fast", "accounting.balanced"]
    assert all(x.passed for x in checks), [x.detail for x in checks]
    assert checks[0].value == pytest.approx(3.0, abs=1.01)


# --- judge_scenario -----------------------------------------------------------------------


def test_judge_scenario_writes_checks_validity_and_verdict() -> None:
    sc = good_steady()
    out = judge_scenario(sc)
    assert out is sc and sc["verdict"] == "pass" and sc["validity"] == []
    assert [c["id"] for c in sc["checks"]][-1] == "accounting.balanced"
    assert set(sc["checks"][0]) == {
        "id",
        "passed",
        "value",
        "threshold",
        "op",
        "unit",
        "n",
        "detail",
        "skipped",
    }
    json.dumps(sc, allow_nan=False)
    judge_scenario(sc, {"steady.p99_ms": {"threshold": 1}})  # re-judging replaces
    assert sc["verdict"] == "fail" and len(sc["checks"]) == 4


def test_a_server_that_died_is_a_failed_check_with_the_cause() -> None:
    sc = good_steady(
        partial=True,
        sut_exit={
            "t_s": 12.5,
            "exit_code": -9,
            "cause": "the server under test exited (code -9) during the run",
        },
    )
    judge_scenario(sc)
    died = sc["checks"][-1]
    assert died["id"] == RUN_COMPLETED and died["passed"] is False and died["value"] == -9
    assert "code -9" in died["detail"] and "t=12.5 s" in died["detail"]
    assert sc["verdict"] == "fail"
    sc = good_steady(error={"type": "TargetUnavailable", "message": "connection refused"})
    assert judge_scenario(sc)["verdict"] == "fail"
    sc = good_steady(error={"type": "InvalidRun", "message": "sampler died"})
    judge_scenario(sc)
    assert sc["verdict"] == "invalid" and "sampler died" in sc["validity"][0]
