"""A pass answers the scenario's question: every check that defines it judged, every
planned scenario run (or its absence accepted), a usage error found late never a pass.

Each test builds the wrong verdict the harness used to give — a secondary check carrying
a scenario whose defining checks skipped, a scenario that never ran leaving the exit code
at 0 — and asserts what it says now.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import ConfigError, ExitCode
from harness.finish import exit_code_for, judge
from harness.locust_run import Target
from harness.report.common import verdict_sentence
from harness.results import new_document
from harness.testing.checks import counters, result

REF = "python -m harness_reference_server --port {port} --workers {threads}"


def _doc(*scenarios: dict[str, Any], **fields: Any) -> dict[str, Any]:
    doc = new_document()
    doc["scenarios"] = list(scenarios)
    doc.update(fields)
    return doc


def _leak_scenario_without_samples() -> dict[str, Any]:
    """A soak-like scenario attached without a pid: its leak trend skips (no server
    samples) while a secondary request-side check passes."""
    return result(
        name="soak",
        check_config={"soak.rss_trend": {}, "steady.error_rate": {}, "accounting.balanced": {}},
        defined_by=["soak.rss_trend"],
        counters=counters(5000),
    )


def test_a_secondary_check_does_not_carry_a_scenario_whose_defining_check_skipped() -> None:
    doc = judge(_doc(_leak_scenario_without_samples()))
    sc = doc["scenarios"][0]
    states = {c["id"]: c["passed"] for c in sc["checks"]}
    assert states["steady.error_rate"] is True and states["soak.rss_trend"] is None
    # the old rule: one own check passed and none failed → pass, exit 0
    assert sc["verdict"] == "not_judged"
    assert exit_code_for(doc) == ExitCode.NOT_JUDGED
    line = verdict_sentence(doc)
    assert line.startswith("NOT JUDGED")
    assert "not judged: soak (defining check soak.rss_trend not judged)" in line


def test_an_accepted_skip_lets_the_rest_decide_and_is_named_as_accepted() -> None:
    doc = judge(_doc(_leak_scenario_without_samples(), allow_skip=["soak.rss_trend"]))
    sc = doc["scenarios"][0]
    assert sc["verdict"] == "pass" and exit_code_for(doc) == ExitCode.PASS
    rss = next(c for c in sc["checks"] if c["id"] == "soak.rss_trend")
    assert rss["passed"] is None and rss["accepted"] is True  # still a skip, never a pass
    assert "accepted unjudged (--allow-skip): soak.rss_trend" in verdict_sentence(doc)


def test_the_checklist_accepts_skips_too(tmp_path) -> None:
    checklist = tmp_path / "c.toml"
    checklist.write_text('allow_skip = ["soak.rss_trend"]\n')
    doc = judge(_doc(_leak_scenario_without_samples()), checklist)
    assert doc["verdict"] == "pass"
    disabled = tmp_path / "d.toml"
    disabled.write_text('["soak.rss_trend"]\nenabled = false\n')
    assert judge(_doc(_leak_scenario_without_samples()), disabled)["verdict"] == "pass"


def test_an_unknown_check_id_in_allow_skip_is_a_usage_error(tmp_path) -> None:
    checklist = tmp_path / "c.toml"
    checklist.write_text('allow_skip = ["soak.rss_trnd"]\n')
    with pytest.raises(ConfigError, match="did you mean 'soak.rss_trend'"):
        judge(_doc(_leak_scenario_without_samples()), checklist)


def test_a_failure_still_outranks_an_unjudged_defining_check() -> None:
    sc = result(
        name="soak",
        check_config={"soak.rss_trend": {}, "steady.error_rate": {}},
        defined_by=["soak.rss_trend"],
        counters=counters(900, {"http_503": 100}),
    )
    doc = judge(_doc(sc))
    assert doc["scenarios"][0]["verdict"] == "fail" and exit_code_for(doc) == ExitCode.FAIL


def test_older_documents_without_defined_by_keep_the_any_judged_rule() -> None:
    sc = _leak_scenario_without_samples()
    del sc["defined_by"]
    assert judge(_doc(sc))["verdict"] == "pass"


def _steady() -> dict[str, Any]:
    return result(
        name="steady_state",
        check_config={"steady.error_rate": {}},
        defined_by=["steady.error_rate"],
        counters=counters(1000),
    )


def test_a_planned_scenario_that_did_not_run_makes_the_run_at_best_not_judged() -> None:
    doc = _doc(_steady())
    doc["excluded"] = [{"name": "soak", "reason": "nothing samples the server"}]
    doc = judge(doc)
    # the old rule: exclusions were named but only judged scenarios moved the exit code
    assert doc["verdict"] == "not_judged" and exit_code_for(doc) == ExitCode.NOT_JUDGED
    assert "not run: soak (nothing samples the server)" in verdict_sentence(doc)


def test_a_scenario_this_machine_cannot_host_is_optional_and_named_with_why() -> None:
    doc = _doc(_steady())
    doc["excluded"] = [
        {"name": "linearity", "reason": "the server gets 1 core here", "optional": True}
    ]
    doc = judge(doc)
    assert doc["verdict"] == "pass" and exit_code_for(doc) == ExitCode.PASS
    line = verdict_sentence(doc)
    assert "not run: linearity (optional on this machine: the server gets 1 core here)" in line


def test_a_scenario_the_user_accepted_not_running_does_not_block_a_pass() -> None:
    doc = _doc(_steady(), allow_skip=["soak"])
    doc["excluded"] = [{"name": "soak", "reason": "nothing samples the server"}]
    doc = judge(doc)
    assert doc["verdict"] == "pass"
    assert "soak (accepted with --allow-skip: nothing samples the server)" in verdict_sentence(doc)


# --- before load: what is knowable is refused (run) or left out and counted (acceptance) ---


def _preflight(tmp_path, target, *, extra=(), allow=(), scenarios=None):
    from harness.acceptance import CHECKLIST, Plan, preflight

    plan = Plan(
        scenarios=tuple(scenarios or CHECKLIST),
        mode="quick",
        out_dir=tmp_path,
        target=target,
        extra_args=tuple(extra),
        allow_skip=tuple(allow),
    )
    return {e.name: e for e in preflight(plan)}


def test_a_soak_nothing_samples_is_refused_before_load_naming_the_fixes(tmp_path) -> None:
    attached = _preflight(tmp_path, Target(url="http://127.0.0.1:9"), scenarios=["soak"])
    why = attached["soak"].reason
    assert not attached["soak"].optional
    assert "soak.rss_trend" in why and "--sut-pid" in why and "--allow-skip" in why
    # with a pid it runs; so it does when the user accepts the leak checks unjudged
    pid = _preflight(tmp_path, Target(url="http://127.0.0.1:9", sut_pid=1), scenarios=["soak"])
    assert pid == {}
    accepted = _preflight(
        tmp_path,
        Target(url="http://127.0.0.1:9"),
        scenarios=["soak"],
        allow=["soak.rss_trend", "soak.threads_trend", "soak.fds_trend"],
    )
    assert accepted == {}
    # --no-sample turns the sampler off even for a server the harness starts
    unsampled = _preflight(tmp_path, Target(sut_cmd=REF), extra=["--no-sample"], scenarios=["soak"])
    assert "soak" in unsampled


def test_linearity_on_one_server_core_is_optional_here_the_rest_is_not(tmp_path) -> None:
    one_core = _preflight(tmp_path, Target(sut_cmd=REF), extra=["--sut-cores", "1"])
    assert set(one_core) == {"linearity"} and one_core["linearity"].optional
    attached = _preflight(tmp_path, Target(url="http://127.0.0.1:9"))
    assert {n for n, e in attached.items() if not e.optional} >= {
        "cold_start",
        "freeze",
        "crash_restart",
        "rolling_shutdown",
        "soak",
    }


def test_defined_by_must_name_checks_the_scenario_lists() -> None:
    from harness.load.scenario import parse_scenario

    base = {
        "stages": [{"name": "s", "duration_s": 5, "rate": 10}],
        "checks": {"steady.p99_ms": {}},
    }
    sc = parse_scenario({**base, "defined_by": ["steady.p99_ms"]}, "x.toml")
    assert sc.defining_checks() == ("steady.p99_ms",)
    # absent: every listed check defines it
    assert parse_scenario(base, "x.toml").defining_checks() == ("steady.p99_ms",)
    with pytest.raises(ConfigError, match="not in the scenario's \\[checks\\] table"):
        parse_scenario({**base, "defined_by": ["steady.error_rate"]}, "x.toml")


# --- a usage error found while preparing is a usage error, not an invalid run -----------


def _fake_runs(monkeypatch, outcomes: dict[str, tuple[int, dict[str, Any] | None]]):
    import harness.acceptance as acc
    from harness import locust_run

    def fake_run_one(settings, out_root, name, index, total, stop, show, poll_s=1.0):
        code, doc = outcomes[name]
        return locust_run.ScenarioRun(
            name=name, out_dir=out_root / name, returncode=code, document=doc
        )

    monkeypatch.setattr(locust_run, "run_one", fake_run_one)
    return acc


def _config_error_doc(name: str) -> dict[str, Any]:
    """What a child writes when its preparation raised a ConfigError after the server
    started: a results document whose scenario carries the error (and exit 2)."""
    sc = result(name=name, check_config={"shutdown.lost": {}}, counters=counters(0))
    sc["error"] = {
        "type": "ConfigError",
        "message": "model 'mlp' reports no inputs; state them with --input NAME:DTYPE:SHAPE",
    }
    return _doc(sc)


def test_a_configuration_error_while_preparing_is_exit_2_not_invalid(tmp_path, monkeypatch):
    acc = _fake_runs(monkeypatch, {"rolling_shutdown": (2, _config_error_doc("rolling_shutdown"))})
    plan = acc.Plan(
        scenarios=("rolling_shutdown",),
        mode="quick",
        out_dir=tmp_path,
        target=Target(sut_cmd=REF),
    )
    # the old path judged the written document: verdict invalid, "the harness failed"
    with pytest.raises(ConfigError, match="reports no inputs"):
        acc.run_plan(plan, show=lambda _: None)


@pytest.mark.parametrize("wrote_results", [True, False])
def test_a_configuration_error_found_late_keeps_what_ran_and_is_not_a_pass(
    tmp_path, monkeypatch, wrote_results
):
    """A scenario whose Locust run exits 2 after others measured something (with or
    without a results document of its own): the measured ones are judged and written, it
    is named as not run with its error, and the run is not a pass (the old rule: exit 0)."""
    failed = _config_error_doc("rolling_shutdown") if wrote_results else None
    acc = _fake_runs(
        monkeypatch,
        {"steady_state": (0, _doc(_steady())), "rolling_shutdown": (2, failed)},
    )
    if not wrote_results:
        from harness import locust_run

        original = locust_run.run_one

        def with_log(settings, out_root, name, *args, **kw):
            run = original(settings, out_root, name, *args, **kw)
            if name == "rolling_shutdown":
                run.error = "model 'mlp' reports no inputs; state them with --input"
            return run

        monkeypatch.setattr(locust_run, "run_one", with_log)
    plan = acc.Plan(
        scenarios=("steady_state", "rolling_shutdown"),
        mode="quick",
        out_dir=tmp_path,
        target=Target(sut_cmd=REF),
    )
    outcome = acc.run_plan(plan, show=lambda _: None)
    doc = outcome.document
    assert [sc["name"] for sc in doc["scenarios"]] == ["steady_state"]
    assert doc["excluded"][0]["name"] == "rolling_shutdown"
    assert "configuration error" in doc["excluded"][0]["reason"]
    assert "reports no inputs" in doc["excluded"][0]["reason"]
    assert doc["verdict"] == "not_judged" and outcome.exit_code == ExitCode.NOT_JUDGED
    assert not doc.get("partial")
    assert (tmp_path / "results.json").exists() and (tmp_path / "summary.md").exists()


def test_the_input_flag_a_configuration_error_names_is_one_harness_run_accepts(tmp_path):
    """The fix a 'reports no inputs' error names (--input NAME:DTYPE:SHAPE) reaches the
    Locust run from `harness run` / `harness acceptance`, not only via --locust-arg."""
    from harness.cli import build_parser
    from harness.cli.run import plan_from
    from harness.locust_run import scenario_argv

    args = build_parser().parse_args(
        ["run", "steady_state", "--input", "input:FP32:1,256", "--out", str(tmp_path)]
    )
    plan = plan_from(args, (args.scenario,), str(tmp_path))
    argv = scenario_argv(plan, "steady_state", tmp_path)
    assert argv[argv.index("--input") + 1] == "input:FP32:1,256"


def _models_server(models: dict[str, Any]) -> Any:
    """A server whose only answer is GET /v1/models: ``models``."""
    import json

    from gevent.server import StreamServer

    from harness.testing.raw_http import requests_on

    body = json.dumps(models).encode()

    def handle(sock: Any, _addr: Any) -> None:
        for _head, _body in requests_on(sock):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    return server


def test_a_scenario_longer_than_the_served_context_is_left_out_before_any_load(
    tmp_path,
) -> None:
    """An LLM server that serves a 1,024-token context: llm_shared_prefix (requests of up to
    4,084 tokens) is left out before any scenario runs, wherever it stands in the plan, with
    the reason its own preparation gives; the scenarios that fit stay. Alone (`harness run`)
    it is refused."""
    from harness.acceptance.plan import LLM_CHECKLIST, without_unsupported

    server = _models_server({"data": [{"id": "tiny", "owned_by": "vllm", "max_model_len": 1024}]})
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        target = Target(url=url, protocol="openai")
        excluded = _preflight(tmp_path, target, scenarios=LLM_CHECKLIST)
        assert set(excluded) == {"llm_shared_prefix"}, excluded
        reason = excluded["llm_shared_prefix"].reason
        assert reason.startswith("configuration error: a request of this [llm] workload")
        assert "reach 4084 tokens" in reason and "max_model_len of 1024" in reason, reason
        # an --input that shortens every request keeps it
        short = ["--input", "input=64", "--input", "output=32", "--input", "prefix_tokens=512"]
        assert not _preflight(tmp_path, target, extra=short, scenarios=["llm_shared_prefix"])
        # the model the server lists, or --model naming one it does not: every scenario
        big = Target(url=url, protocol="openai", model="big")
        other = _preflight(tmp_path, big, scenarios=LLM_CHECKLIST)
        assert set(other) == set(LLM_CHECKLIST), other
        assert all("does not list" in e.reason for e in other.values()), other
        from harness.acceptance import Plan

        alone = Plan(
            scenarios=("llm_shared_prefix",), mode="quick", out_dir=tmp_path, target=target
        )
        with pytest.raises(ConfigError, match="max_model_len of 1024"):
            without_unsupported(alone, single=True)
    finally:
        server.stop(timeout=1)
