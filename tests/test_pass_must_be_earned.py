"""A PASS must be earned (and what is knowable before load is checked before load).

Each test reproduces a false PASS (or a hidden failure) of the old verdict rules on a
hand-built scenario result and asserts the new behaviour.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

from harness.errors import ExitCode
from harness.finish import exit_code_for, judge
from harness.report.common import verdict_sentence
from harness.report.junit import render_junit
from harness.report.summary import render_summary
from harness.results import new_document
from harness.testing.checks import counters, result


def _soak_attached_without_pid() -> dict[str, Any]:
    """``soak`` attached by --target without --sut-pid: no server samples, so every leak
    check skips; only the harness's own bookkeeping (accounting.balanced) passes."""
    return result(
        name="soak",
        check_config={
            "soak.rss_trend": {},
            "soak.threads_trend": {},
            "soak.fds_trend": {},
            "accounting.balanced": {},
        },
        counters=counters(5000),
        windows=None,
    )


def _doc(*scenarios: dict[str, Any]) -> dict[str, Any]:
    doc = new_document()  # this machine, as a run stamps it
    doc["scenarios"] = list(scenarios)
    return doc


def test_a_scenario_that_judged_nothing_is_not_a_pass() -> None:
    doc = judge(_doc(_soak_attached_without_pid()))
    sc = doc["scenarios"][0]
    states = {c["id"]: c["passed"] for c in sc["checks"]}
    assert states["accounting.balanced"] is True  # the harness counted right…
    assert {states[k] for k in states if k.startswith("soak.")} == {None}  # …nothing else
    # old rule: "pass" unless some check failed → exit 0
    assert sc["verdict"] == "not_judged"
    assert doc["verdict"] == "not_judged"
    assert exit_code_for(doc) == ExitCode.NOT_JUDGED == 4


def test_skips_are_named_in_the_verdict_line_summary_and_junit() -> None:
    doc = judge(_doc(_soak_attached_without_pid()))
    line = verdict_sentence(doc)
    assert line.startswith("NOT JUDGED")
    assert "soak.rss_trend" in line and "soak.fds_trend" in line
    md = render_summary(doc)
    assert "Nothing was judged (not a pass)" in md
    root = ET.fromstring(render_junit(doc))
    judged = root.find(".//testcase[@name='soak.judged']")
    assert judged is not None
    skipped = judged.find("skipped")
    assert skipped is not None and "no server-side samples" in skipped.get("message", "")


def test_a_real_failure_is_never_hidden_behind_another_invalid_scenario() -> None:
    """Old rule: invalid > fail overall, so one invalid scenario (say linearity finding a
    config problem at the end) turned 24 judged checks with real failures into exit 3."""
    failing = result(
        name="steady_state",
        check_config={"steady.error_rate": {}},
        counters=counters(900, {"http_500": 100}),
    )
    invalid = result(
        name="spike",
        check_config={"steady.error_rate": {}},
        counters={**counters(1000), "scheduled": 1200},  # accounting off by 200: invalid
    )
    doc = judge(_doc(failing, invalid))
    assert [sc["verdict"] for sc in doc["scenarios"]] == ["fail", "invalid"]
    assert doc["verdict"] == "fail"
    assert exit_code_for(doc) == ExitCode.FAIL
    line = verdict_sentence(doc)
    assert "fail: steady_state" in line and "invalid: spike" in line


def test_pass_needs_every_scenario_judged() -> None:
    ok = result(
        name="steady_state", check_config={"steady.error_rate": {}}, counters=counters(1000)
    )
    doc = judge(_doc(ok))
    assert doc["verdict"] == "pass" and exit_code_for(doc) == ExitCode.PASS
    doc = judge(_doc(ok, _soak_attached_without_pid()))
    assert doc["verdict"] == "not_judged" and exit_code_for(doc) == ExitCode.NOT_JUDGED


def test_excluded_scenarios_are_named_and_reported_as_skipped() -> None:
    ok = result(
        name="steady_state", check_config={"steady.error_rate": {}}, counters=counters(1000)
    )
    doc = _doc(ok)
    doc["excluded"] = [
        {"name": "linearity", "reason": "the server has 1 core here", "optional": True}
    ]
    doc = judge(doc)
    assert doc["verdict"] == "pass"  # optional on this machine: does not block a pass
    assert "not run: linearity (optional on this machine: the server has 1 core here)" in (
        verdict_sentence(doc)
    )
    assert "`linearity`: optional on this machine: the server has 1 core here" in render_summary(
        doc
    )
    root = ET.fromstring(render_junit(doc))
    case = root.find(".//testcase[@name='linearity.run']")
    assert case is not None and case.find("skipped") is not None


# --- everything knowable before load is checked before load -------------------------------

REF = f"{sys.executable} -m harness_reference_server --port {{port}}"


def _harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_without_threads_placeholder_is_exit_2_naming_the_fix(tmp_path) -> None:
    """Old: the missing {threads} was found when linearity started (after the server had
    started, or — in acceptance — after 9 minutes of other scenarios)."""
    r = _harness("run", "linearity", "--sut-cmd", REF, "--sut-cores", "0-1", "--out", str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "{threads}" in lines[0], r.stderr
    assert not (tmp_path / "linearity").exists()  # nothing was started


def test_cold_start_against_an_attached_server_is_refused(tmp_path) -> None:
    """Old: a warning, then first_p99_ratio judged the 'first' requests of a warm server."""
    r = _harness("run", "cold_start", "--target", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no cold start to measure" in r.stderr and "--sut-cmd" in r.stderr


def test_bad_placeholder_is_a_usage_error(tmp_path) -> None:
    r = _harness("run", "steady_state", "--sut-cmd", REF + " --workers {thread}")
    assert r.returncode == 2 and "bad placeholder" in r.stderr, r.stderr


def test_acceptance_leaves_out_what_the_target_cannot_support(tmp_path) -> None:
    from harness.acceptance import CHECKLIST, Plan, preflight
    from harness.locust_run import Target

    one_core = Plan(
        scenarios=CHECKLIST,
        mode="quick",
        out_dir=tmp_path,
        target=Target(sut_cmd=REF + " --workers {threads}"),
        extra_args=("--sut-cores", "1"),
    )
    excluded = {e.name: e.reason for e in preflight(one_core)}
    assert set(excluded) == {"linearity"} and "1 core" in excluded["linearity"]
    no_threads = Plan(
        scenarios=CHECKLIST,
        mode="quick",
        out_dir=tmp_path,
        target=Target(sut_cmd=REF),
        extra_args=("--sut-cores", "0-1"),
    )
    assert {e.name for e in preflight(no_threads)} == {"linearity"}
    attached = Plan(
        scenarios=CHECKLIST,
        mode="quick",
        out_dir=tmp_path,
        target=Target(url="http://127.0.0.1:9"),
    )
    # freeze, crash_restart, rolling_shutdown signal (and restart) the server's process;
    # soak's leak trends read its process samples
    assert {e.name for e in preflight(attached)} == {
        "cold_start",
        "linearity",
        "freeze",
        "crash_restart",
        "rolling_shutdown",
        "soak",
    }


def test_a_scenario_whose_locust_run_died_is_a_schema_valid_failure_with_its_samples(tmp_path):
    """Locust SIGKILLed (or crashed) before it wrote results: the parent's document is still
    one the schema accepts — run.completed failed with the cause — and keeps the series the
    sampler wrote before the death."""
    from harness.acceptance.no_results import failed_scenario
    from harness.locust_run import ScenarioRun
    from harness.results import machine_metadata, new_document
    from tests.conftest import schema_errors

    samples = tmp_path / "soak" / "samples"
    samples.mkdir(parents=True)
    cols = "t,ts,cpu_pct,usr_pct,sys_pct,rss_bytes,uss_bytes,threads,fds,socket_fds,client_conns"
    rows = [f"{t}.0,{1e9 + t},12.5,10,2.5,{100 << 20},,20,30,8,4" for t in range(1, 6)]
    (samples / "process.csv").write_text("\n".join([cols, *rows]) + "\n")
    run = ScenarioRun(name="soak", out_dir=tmp_path / "soak", returncode=-9, error="killed")
    run.started_unix, run.elapsed_s = 1e9, 5.5
    sc = failed_scenario(run, "quick")
    doc = new_document(machine=machine_metadata(), sut={}, loadgen={})
    doc["scenarios"] = [sc]
    assert schema_errors(doc) == []
    (died,) = sc["checks"]
    assert died["id"] == "run.completed" and died["passed"] is False and "killed" in died["detail"]
    assert sc["server"]["series"]["rss_bytes"] == [100 << 20] * 5
    # nothing sampled at all: still a valid document
    empty = failed_scenario(ScenarioRun(name="spike", out_dir=tmp_path / "none"), "quick")
    doc["scenarios"] = [empty]
    assert schema_errors(doc) == [] and empty["server"] is None
