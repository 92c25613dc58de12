"""Scenario files: every packaged file parses in both modes; every kind of mistake is a
ConfigError that names the file, the key, the value and what is valid."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.acceptance import FULL_ONLY
from harness.acceptance.plan import LLM_FULL_ONLY, checklist
from harness.errors import ConfigError
from harness.load.scenario import (
    CHECK_IDS,
    Rate,
    Scenario,
    load_scenario,
    packaged_scenarios,
    parse_rate,
    parse_scenario,
    resolve_scenario,
)
from harness.packaged import packaged_dir

DATA = Path(__file__).parent / "data" / "scenarios"
PACKAGED = (
    "cold_start",
    "contention",
    "crash_restart",
    "freeze",
    "integrity",
    "linearity",
    "llm_abort_storm",
    "llm_mixed_priority",
    "llm_multi_turn",
    "llm_shared_prefix",
    "llm_soak",
    "llm_spike",
    "llm_steady",
    "mixed_priority",
    "network",
    "rolling_shutdown",
    "soak",
    "spike",
    "steady_state",
)
# The whole quick checklist must fit in ≤ 12 min on 2 cores: load time per scenario (s).
QUICK_BUDGET_S = {
    "cold_start": 25,
    "steady_state": 15,  # its healthy and defect cases are proven at 12 s
    "spike": 40,
    "mixed_priority": 20,  # its two rows are proven at 15 s
    "soak": 35,  # the leak cases and their healthy twins are proven at 30 s
    "contention": 40,  # its two rows are proven at 36 s
    "linearity": 30,  # its two rows are proven at 24 s on 2 cores (docs/detection-repeated.md)
    "integrity": 17,  # its rows are proven at 14 s
    "network": 55,  # --full only (harness.acceptance.FULL_ONLY)
    "freeze": 30,
    "crash_restart": 30,
    "rolling_shutdown": 25,
    "llm_steady": 35,
    "llm_abort_storm": 30,
    "llm_spike": 35,
    "llm_shared_prefix": 40,
    "llm_mixed_priority": 45,
    "llm_multi_turn": 25,
    "llm_soak": 65,  # --full only (harness.acceptance.plan.LLM_FULL_ONLY)
}
# The check ids each packaged scenario must evaluate.
EXPECTED_CHECKS = {
    "cold_start": {
        "cold_start.time_to_ready_s",
        "cold_start.first_p99_ratio",
        "cold_start.first_error_rate",
    },
    "steady_state": {"steady.p99_ms", "steady.error_rate", "steady.throughput"},
    "spike": {"spike.recovery_s", "spike.fail_fast"},
    "mixed_priority": {"priority.high_p99_ms", "priority.high_reject_rate"},
    "soak": {
        "soak.rss_trend",
        "soak.threads_trend",
        "soak.fds_trend",
        "soak.latency_drift",
        "soak.error_rate",
    },
    "contention": {
        "contention.throughput_ratio",
        "contention.fail_fast",
        "contention.recovery_s",
    },
    "linearity": {"linearity.efficiency"},
    "integrity": {"integrity.mismatches", "integrity.failures"},
    "network": {"network.latency_amplification", "network.leaks", "network.recovery_s"},
    "freeze": {"freeze.recovery_s", "freeze.unanswered", "freeze.resource_step"},
    "crash_restart": {"crash.recovery_s", "crash.errors_after_ready", "crash.cold_penalty"},
    "rolling_shutdown": {"shutdown.lost", "shutdown.exit_s"},
    "llm_steady": {"llm.ttft_p99", "llm.tpot_p99", "llm.stream_integrity", "llm.goodput"},
    "llm_abort_storm": {"llm.abort_recovery", "llm.goodput", "llm.stream_integrity"},
    "llm_spike": {"llm.overload", "llm.stream_integrity", "spike.recovery_s"},
    "llm_mixed_priority": {"llm.priority_ttft_p99", "llm.stream_integrity"},
    "llm_multi_turn": {"llm.ttft_p99", "llm.tpot_p99", "llm.stream_integrity", "llm.goodput"},
    "llm_soak": {
        "soak.rss_trend",
        "soak.threads_trend",
        "soak.fds_trend",
        "soak.latency_drift",
        "soak.error_rate",
        "llm.goodput",
        "llm.stream_integrity",
    },
    "llm_shared_prefix": {
        "llm.stall",
        "llm.ttft_p99",
        "llm.tpot_p99",
        "llm.stream_integrity",
        "llm.goodput",
    },
}


def stages(*specs: tuple[str, float, object]) -> list[dict[str, object]]:
    return [{"name": n, "duration_s": d, "rate": r} for n, d, r in specs]


def error_of(data: dict[str, object], mode: str = "full") -> str:
    with pytest.raises(ConfigError) as e:
        parse_scenario(data, "t.toml", mode=mode)  # type: ignore[arg-type]
    return str(e.value)


# --------------------------------------------------------------------------- packaged


def test_the_packaged_scenarios_are_the_known_list() -> None:
    assert packaged_scenarios() == PACKAGED
    assert (packaged_dir("scenarios") / "spike.toml").is_file()


@pytest.mark.parametrize("name", PACKAGED)
@pytest.mark.parametrize("mode", ["quick", "full"])
def test_packaged_scenario_parses(name: str, mode: str) -> None:
    s = load_scenario(name, mode).with_cores(2)  # type: ignore[arg-type]
    assert isinstance(s, Scenario)
    assert (s.name, s.mode, s.source) == (name, mode, f"{name}.toml")
    assert s.description
    assert s.stages, "no stages to run"
    # stages are contiguous from 0 and chaos fits inside them
    t = 0.0
    for st in s.stages:
        assert st.start_s == pytest.approx(t)
        assert st.duration_s > 0 and 0 <= st.warmup_s < st.duration_s
        assert (st.rate is None) != (st.users is None)
        assert st.kind == s.load.mode
        t = st.end_s
    assert all(ev.at_s >= 0 and ev.end_s <= s.duration_s + 1e-9 for ev in s.chaos)
    assert sum(c.share for c in s.classes) == pytest.approx(1.0)
    assert set(s.checks) <= set(CHECK_IDS)
    assert EXPECTED_CHECKS[name] | {"accounting.balanced"} == set(s.checks)
    # a relative rate without calibration or a known capacity could never run
    assert s.load.calibrate == s.needs_capacity


@pytest.mark.parametrize("name", PACKAGED)
def test_quick_variant_is_short_and_full_is_longer(name: str) -> None:
    quick = load_scenario(name, "quick").with_cores(2)
    full = load_scenario(name, "full").with_cores(2)
    assert quick.duration_s <= QUICK_BUDGET_S[name]
    assert quick.duration_s >= 0.5 * QUICK_BUDGET_S[name], "quick variant too short to judge"
    assert full.duration_s > quick.duration_s
    if name != "contention":  # contention runs fewer cycles in quick mode
        assert [s.name for s in quick.stages] == [s.name for s in full.stages]


@pytest.mark.parametrize("llm", [False, True], ids=["kserve", "llm"])
def test_quick_checklist_fits_twelve_minutes_with_calibration(llm: bool) -> None:
    """Each quick checklist stays ≤ 12 min on 2 cores: its load, plus 8 s per scenario for
    start-up, drain and judging (within one acceptance the capacity is probed once). The
    LLM scenarios (``llm_*``) form their own checklist (``--protocol openai``), counted
    here whole."""
    total = 0.0
    n = 0
    for name in PACKAGED:
        if name in FULL_ONLY or name in LLM_FULL_ONLY:  # not in the quick checklist
            continue
        if name.startswith("llm_") != llm:  # the other protocol's checklist
            continue
        n += 1
        s = load_scenario(name, "quick").with_cores(2)
        total += s.duration_s + (s.load.calibration_s if s.load.calibrate else 0.0)
    assert total + 8 * n <= 720, f"{total:.0f} s of load leaves no room for startup in 12 min"


def test_soak_full_is_one_hour() -> None:
    assert load_scenario("soak", "full").duration_s == 3600
    assert load_scenario("llm_soak", "full").duration_s == 3600


def test_the_llm_soak_is_judged_as_the_soak_and_runs_in_the_full_llm_checklist() -> None:
    """llm_soak is the soak in tokens: the soak's defining checks and thresholds (a pass
    needs the server's samples), on a stream workload; the full LLM checklist runs it
    before the spike, the quick one does not."""
    soak, llm = load_scenario("soak", "full"), load_scenario("llm_soak", "full")
    assert llm.defined_by == soak.defined_by
    assert llm.load.protocol == "openai" and llm.llm
    for cid in ("soak.rss_trend", "soak.threads_trend", "soak.fds_trend"):
        assert llm.checks[cid] == soak.checks[cid], cid
    quick, full = checklist("quick", "openai"), checklist("full", "openai")
    assert "llm_soak" not in quick
    assert full.index("llm_soak") < full.index("llm_spike") == len(full) - 1


def test_every_packaged_file_documents_itself() -> None:
    for name in PACKAGED:
        text = (packaged_dir("scenarios") / f"{name}.toml").read_text()
        head = text.split("\n\n")[0]
        assert head.startswith(f"# {name} —"), name
        for topic in ("What it proves", "How it works", "What to change"):
            assert topic in head, (name, topic)


def test_spike_shape() -> None:
    s = load_scenario("spike", "quick")
    base, spike, rec = s.stages
    assert (base.name, spike.name, rec.name) == ("baseline", "spike", "recovery")
    assert spike.rate == Rate(2.0, relative=True)
    assert spike.rate_rps(100.0) == pytest.approx(4 * base.rate_rps(100.0))
    segs = s.segments(100.0)
    assert [g.rate_rps for g in segs] == [50.0, 200.0, 50.0]
    assert s.stage_at(15.0) == spike and s.stage_at(s.duration_s) is None


def test_mixed_priority_drives_above_capacity_with_a_high_minority() -> None:
    s = load_scenario("mixed_priority", "quick")
    high = next(c for c in s.classes if c.name == "high")
    assert high.priority == 1 and 0.1 <= high.share <= 0.3
    assert max(st.rate.value for st in s.stages if st.rate) >= 1.2


def test_contention_generates_alternating_blocks_and_hogs() -> None:
    s = load_scenario("contention", "full")
    assert s.contention is not None
    kinds = [b.kind for b in s.contention.blocks]
    assert kinds == ["baseline", "hog", "baseline", "hog", "baseline", "hog", "after"]
    quick = load_scenario("contention", "quick").contention
    assert quick is not None and [b.kind for b in quick.blocks] == ["baseline", "hog", "after"]
    assert [b.stage for b in s.contention.blocks] == [st.name for st in s.stages]
    hog_blocks = [b for b in s.contention.blocks if b.kind == "hog"]
    assert [(e.action, e.at_s, e.end_s) for e in s.chaos] == [
        ("cpu_hog", b.start_s, b.end_s) for b in hog_blocks
    ]
    assert s.chaos[0].params["pin"] == "sut"
    assert all(st.rate == Rate(0.7, relative=True) for st in s.stages)


def test_linearity_auto_points_expand_with_the_sut_cores() -> None:
    s = load_scenario("linearity", "quick")
    assert s.stages == () and s.linearity is not None and s.linearity.points == ()
    four = s.with_cores(4)
    assert s.linearity.resolve_points(4) == (1, 2, 4)
    assert s.linearity.resolve_points(6) == (1, 2, 4, 6)
    assert s.linearity.resolve_points(1) == (1,)
    n = [st.threads for st in four.stages]
    assert n == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    assert all(st.users == st.threads * s.linearity.users_per_thread for st in four.stages)
    assert four.stages[-1].end_s == pytest.approx(9 * s.linearity.stage_s)
    users = parse_scenario(
        {"load": {"mode": "closed"}, "linearity": {"vary": "users", "points": [4, 1, 2]}}, "t"
    )
    assert [(st.users, st.threads) for st in users.stages[::3]] == [(1, None), (2, None), (4, None)]


def test_cold_start_needs_a_fresh_server_and_no_calibration() -> None:
    s = load_scenario("cold_start", "quick")
    assert s.load.fresh_sut and not s.load.calibrate and not s.needs_capacity


# --------------------------------------------------------------------------- good files


def test_custom_file_by_path_full_and_quick() -> None:
    path = DATA / "good" / "custom.toml"
    full = load_scenario(path)
    assert full.name == "my_release_gate" and full.source == str(path)
    assert [c.name for c in full.classes] == ["gold", "bronze"]
    assert full.classes[0].timeout_us == 500_000
    assert full.load.capacity_rps == 400 and not full.load.calibrate
    assert full.stages[1].rate_rps(full.load.capacity_rps) == pytest.approx(480)
    assert [e.action for e in full.chaos] == ["pause", "cpu_hog", "kill"]
    assert dict(full.chaos[1].params) == {"cores": 1, "pin": [0]}
    assert dict(full.chaos[2].params) == {"restart": True, "signal": "SIGKILL"}
    assert full.check_config() == {
        "spike.recovery_s": {"threshold": 12},
        "steady.p99_ms": {"threshold": 80},
        "accounting.balanced": {},
    }
    quick = load_scenario(str(path), "quick")
    assert quick.mode == "quick" and quick.load.seed == 8
    assert [st.duration_s for st in quick.stages] == [10, 20]
    assert quick.stages[1].warmup_s == 2.5
    assert [e.at_s for e in quick.chaos] == [12.5, 15, 22.5]


def test_scenario_is_frozen_and_checks_are_read_only() -> None:
    s = load_scenario("spike")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.checks["spike.fail_fast"] = {}  # type: ignore[index]
    cfg = s.check_config()
    cfg["spike.fail_fast"]["threshold"] = 1
    assert s.check_config()["spike.fail_fast"] == {}


def test_results_helpers_match_the_results_shape() -> None:
    from harness.load.result import classes_view, stages_view

    s = load_scenario("spike", "quick")
    rows = stages_view(s, 200.0)
    assert rows[0] | {} == {
        "name": "baseline",
        "start_s": 0.0,
        "end_s": 10.0,
        "kind": "open",
        "rate_rps": 100.0,
        "rate": "0.5x",
        "users": None,
        "threads": None,
        "warmup_s": 2.5,
    }
    assert classes_view(s) == {"default": {"priority": 0, "share": 1.0, "timeout_us": None}}


def test_rate_parse_and_resolve() -> None:
    assert parse_rate(200, "rate", "t") == Rate(200.0)
    assert parse_rate("0.6x", "rate", "t") == Rate(0.6, relative=True)
    assert parse_rate(" 1.5X ", "rate", "t") == Rate(1.5, relative=True)
    assert Rate(0.5, True).resolve(300.0) == 150.0
    assert Rate(80.0).resolve(None) == 80.0
    assert str(Rate(0.6, True)) == "0.6x" and str(Rate(200.0)) == "200"
    with pytest.raises(ConfigError, match=r'rate "0.6x" is relative.*calibrat'):
        Rate(0.6, True).resolve(None)


# --------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    ("fixture", "mode", "expected"),
    [
        (
            "bad_rate",
            "full",
            'bad_rate.toml: stages[1].rate = "fast" is not a rate; use a number of req/s '
            '(e.g. 200) or a multiple of capacity (e.g. "0.6x")',
        ),
        ("unknown_key", "full", "stages[0].rats is not a known key (did you mean 'rate'?)"),
        (
            "unknown_check",
            "full",
            "checks.\"spike.recovry_s\" is not a check id (did you mean 'spike.recovery_s'?)",
        ),
        ("shares", "full", "classes shares sum to 0.9 (high = 0.2, low = 0.7); they must sum to 1"),
        ("negative_duration", "full", "stages[0].duration_s = -5 must be > 0"),
        ("syntax", "full", "syntax.toml: not valid TOML: "),
        ("quick_override", "quick", 'stages[0].rate = "slow" is not a rate'),
    ],
)
def test_bad_file_names_file_key_and_value(fixture: str, mode: str, expected: str) -> None:
    path = DATA / "bad" / f"{fixture}.toml"
    with pytest.raises(ConfigError) as e:
        load_scenario(path, mode)  # type: ignore[arg-type]
    msg = str(e.value)
    assert expected in msg
    assert f"{fixture}.toml" in msg


def test_toml_syntax_error_gives_line_and_column() -> None:
    with pytest.raises(ConfigError, match=r"line 4, column"):
        load_scenario(DATA / "bad" / "syntax.toml")


def test_quick_override_error_says_it_came_from_the_quick_table() -> None:
    path = DATA / "bad" / "quick_override.toml"
    load_scenario(path, "full")  # the full file itself is fine
    with pytest.raises(ConfigError, match=r"after applying the \[quick\] table"):
        load_scenario(path, "quick")


def test_unknown_check_lists_the_valid_ids() -> None:
    msg = error_of({"stages": stages(("a", 1, 5)), "checks": {"nope.x": {}}})
    assert all(cid in msg for cid in CHECK_IDS)


def test_missing_scenario_names_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        load_scenario("spikes")
    msg = str(e.value)
    assert "'spikes' is not a packaged scenario (did you mean 'spike'?)" in msg
    assert all(n in msg for n in PACKAGED)
    with pytest.raises(
        ConfigError, match=r"scenario file /nonexistent/x.toml does not exist.*spike"
    ):
        resolve_scenario("/nonexistent/x.toml")


@pytest.mark.parametrize(
    ("data", "mode", "expected"),
    [
        ({"stage": []}, "full", "stage is not a known key (did you mean 'stages'?)"),
        ({"stages": []}, "full", "stages = [] is not a list of stages; add at least one"),
        ({"stages": stages(("a", 0, 5))}, "full", "stages[0].duration_s = 0 must be > 0"),
        ({"stages": [{"name": "a", "rate": 5}]}, "full", "stages[0].duration_s is missing"),
        ({"stages": [{"name": "a", "duration_s": 5}]}, "full", "stages[0].rate is missing"),
        ({"stages": stages(("a", 1, -3))}, "full", "stages[0].rate = -3 is not a rate"),
        ({"stages": stages(("a", 1, "x"))}, "full", 'stages[0].rate = "x" is not a rate'),
        ({"stages": stages(("a", 1, 5), ("a", 1, 5))}, "full", 'stages[1].name = "a" is used'),
        (
            {"stages": [{"name": "a", "duration_s": 5, "users": 3}]},
            "full",
            'stages[0].users = 3 is for closed loop but load.mode = "open"; use rate',
        ),
        (
            {"load": {"mode": "closed"}, "stages": stages(("a", 1, 5))},
            "full",
            'stages[0].rate = 5 is for open loop but load.mode = "closed"; use users',
        ),
        (
            {"load": {"mode": "fast"}, "stages": stages(("a", 1, 5))},
            "full",
            'load.mode = "fast" is not valid; use one of: open, closed',
        ),
        (
            {"load": {"arrival": "uniform"}, "stages": stages(("a", 1, 5))},
            "full",
            'load.arrival = "uniform" is not valid; use one of: constant, poisson',
        ),
        (
            {"load": {"seed": 1.5}, "stages": stages(("a", 1, 5))},
            "full",
            "load.seed = 1.5 is not an integer",
        ),
        (
            {"load": {"calibrate": "yes"}, "stages": stages(("a", 1, 5))},
            "full",
            'load.calibrate = "yes" is not valid; use true, false or "auto"',
        ),
        (
            {"load": {"calibrate": False}, "stages": stages(("a", 1, "0.5x"))},
            "full",
            'stages[0].rate = "0.5x" is relative to capacity but load.calibrate = false',
        ),
        (
            {"load": {"verify": "yes"}, "stages": stages(("a", 1, 5))},
            "full",
            'load.verify = "yes" is not a boolean; use true or false',
        ),
        (
            {"stages": [{"name": "a", "duration_s": 5, "rate": 1, "warmup_s": 5}]},
            "full",
            "stages[0].warmup_s = 5.0 must be shorter than the stage",
        ),
        (
            {"classes": {"a": {"share": 0.5}, "b": {}}, "stages": stages(("a", 1, 5))},
            "full",
            "classes.b.share is missing",
        ),
        (
            {"classes": {"a": {"priority": -1}}, "stages": stages(("a", 1, 5))},
            "full",
            "classes.a.priority = -1 must be ≥ 0",
        ),
        (
            {"classes": {"a": {"prio": 1}}, "stages": stages(("a", 1, 5))},
            "full",
            "classes.a.prio is not a known key (did you mean 'priority'?)",
        ),
        (
            {"stages": stages(("a", 10, 5)), "chaos": [{"action": "reboot", "at_s": 1}]},
            "full",
            'chaos[0].action = "reboot" is not valid; use one of: cpu_hog, pause, kill',
        ),
        (
            {"stages": stages(("a", 10, 5)), "chaos": [{"action": "pause", "at_s": 1}]},
            "full",
            "chaos[0].duration_s is missing",
        ),
        (
            {
                "stages": stages(("a", 10, 5)),
                "chaos": [{"action": "cpu_hog", "at_s": 1, "duration_s": 2, "cores": 0}],
            },
            "full",
            "chaos[0].cores = 0 is not valid for cpu_hog; use an integer ≥ 1",
        ),
        (
            {
                "stages": stages(("a", 10, 5)),
                "chaos": [{"action": "pause", "at_s": 1, "duration_s": 2, "cores": 1}],
            },
            "full",
            "chaos[0].cores is not a known key",
        ),
        (
            {
                "stages": stages(("a", 10, 5)),
                "chaos": [{"action": "pause", "at_s": 9, "duration_s": 2}],
            },
            "full",
            "chaos[0] (pause at_s = 9, duration_s = 2) ends after the last stage (10 s)",
        ),
        (
            {"stages": stages(("a", 1, 5)), "checks": {"steady.p99_ms": 50}},
            "full",
            'checks."steady.p99_ms" = 50 is not a table of overrides',
        ),
        (
            {"load": {"mode": "closed"}, "linearity": {"points": [2, 4]}},
            "full",
            "linearity.points = [2, 4] must include 1",
        ),
        (
            {"load": {"mode": "closed"}, "linearity": {"points": "all"}},
            "full",
            'linearity.points = "all" is not valid; use "auto" or a list',
        ),
        (
            {"linearity": {}},
            "full",
            'load.mode = "open" but [linearity] is a closed-loop sweep',
        ),
        (
            {"contention": {}, "stages": stages(("a", 1, 5))},
            "full",
            "stages cannot be written when [contention] is present",
        ),
        (
            {"contention": {"hog_cores": "all"}},
            "full",
            'contention.hog_cores = "all" is not valid',
        ),
        (
            {"stages": stages(("a", 1, 5)), "quick": {"scale": 0}},
            "quick",
            "quick.scale = 0 must be > 0",
        ),
        (
            {"stages": stages(("a", 1, 5)), "quick": {"stags": {}}},
            "quick",
            "quick.stags is not a known key (did you mean 'stages'?)",
        ),
        (
            {"stages": stages(("a", 1, 5)), "quick": {"stages": {"b": {"duration_s": 1}}}},
            "quick",
            "quick.stages.b names no stage; stages are: a",
        ),
    ],
)
def test_each_mistake_names_key_value_and_fix(
    data: dict[str, object], mode: str, expected: str
) -> None:
    msg = error_of(data, mode)
    assert msg.startswith("t.toml: ")
    assert expected in msg


def test_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="use one of: quick, full"):
        load_scenario("spike", "fast")  # type: ignore[arg-type]


def test_quick_scale_applies_to_durations_but_not_to_timeouts() -> None:
    data = {
        "load": {"request_timeout_s": 4},
        "stages": stages(("a", 100, 5)),
        "chaos": [{"action": "pause", "at_s": 10, "duration_s": 20}],
        "quick": {"scale": 0.1, "stages": {"a": {"rate": 7}}},
    }
    q = parse_scenario(data, "t.toml", mode="quick")
    assert q.stages[0].duration_s == pytest.approx(10) and q.stages[0].rate == Rate(7.0)
    assert (q.chaos[0].at_s, q.chaos[0].duration_s) == pytest.approx((1, 2))
    assert q.load.request_timeout_s == 4
    assert parse_scenario(data, "t.toml").stages[0].duration_s == 100


def test_packaged_check_overrides_are_parameters_the_checks_know() -> None:
    # The checks engineer owns parameter names; a typo in a packaged file must not reach a
    # user as a ConfigError at the end of a 1 h soak.
    import importlib
    import pkgutil

    import harness.checks

    for mod in pkgutil.iter_modules(harness.checks.__path__):
        importlib.import_module(f"harness.checks.{mod.name}")
    from harness.checks.registry import REGISTRY, validate_overrides

    checked = 0
    for name in PACKAGED:
        for mode in ("quick", "full"):
            for cid, over in load_scenario(name, mode).check_config().items():  # type: ignore[arg-type]
                if over:
                    assert cid in REGISTRY, f"{name}: {cid} has overrides but no check yet"
                    validate_overrides(cid, over, f"{name}.toml")
                    checked += 1
    assert checked >= 8


def test_with_duration_stretches_the_whole_timeline() -> None:
    s = load_scenario("contention", "full")  # 7 blocks of 60 s, 5 s of warm-up each
    d = s.with_duration(63.0)
    assert d.duration_s == pytest.approx(63.0)
    assert [st.duration_s for st in d.stages] == pytest.approx([9.0] * 7)
    assert [st.start_s for st in d.stages] == pytest.approx([0, 9, 18, 27, 36, 45, 54])
    assert d.stages[0].warmup_s == pytest.approx(0.75)
    assert [x for e in d.chaos for x in (e.at_s, e.end_s)] == pytest.approx([9, 18, 27, 36, 45, 54])
    assert d.contention is not None and d.contention.blocks[-1].end_s == pytest.approx(63.0)
    assert [st.rate for st in d.stages] == [st.rate for st in s.stages]
    with pytest.raises(ConfigError, match="--duration = 0 is not valid"):
        s.with_duration(0)
    lin = load_scenario("linearity", "quick").with_cores(2).with_duration(45)
    assert lin.duration_s == pytest.approx(45) and lin.stages[0].users == 16


def test_duration_before_the_cores_are_known_applies_once_they_are() -> None:
    # `harness run linearity --duration 60`: the options apply --duration before the
    # controller knows the server's cores (points = "auto" has no stages yet)
    pending = load_scenario("linearity", "quick").with_duration(60)
    assert pending.stages == () and pending.duration_target_s == 60
    for cores in (1, 2, 4):
        lin = pending.with_cores(cores)
        assert lin.duration_s == pytest.approx(60) and lin.duration_target_s is None
        direct = load_scenario("linearity", "quick").with_cores(cores).with_duration(60)
        assert lin.stages == direct.stages
    with pytest.raises(ConfigError, match="--duration = -1 is not valid"):
        load_scenario("linearity").with_duration(-1)
