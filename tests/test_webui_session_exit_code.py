"""A Locust web UI session (several runs started and stopped from the UI, then quit) exits
with the worst verdict over every run it judged — a failed run is never hidden by a later
one that passed — and its last console line names the run that decided the code. A
headless run keeps its own code.

Driven through the plugin's quit listeners with synthetic judged documents, written the
way ``harness judge`` leaves them in each run's directory."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.errors import ExitCode
from harness.finish import PARENT_RENDERS_ENV, exit_code_for, finish
from harness.load import plugin
from harness.load.live import session_verdict
from harness.results import SCHEMA, combine_verdicts, write_document
from harness.testing.reference_document import build_document
from harness.testing.results import MACHINE, SUT, T0, check, scenario


def _judged_run(
    out: Path,
    i: int,
    name: str,
    checks: list[dict[str, Any]],
    validity: list[str] | None = None,
    partial: bool = False,
    defined_by: list[str] | None = None,
) -> dict[str, Any]:
    """Run ``i`` of a session: its judged results.json in ``out/run-i`` and the record
    ``HarnessState`` keeps for it (the exit code is the one ``harness judge`` gives)."""
    if any(c["passed"] is False for c in checks):
        verdict = "fail"
    elif validity:
        verdict = "invalid"
    elif any(c["passed"] is None for c in checks if c["id"] in (defined_by or [])):
        verdict = "not_judged"
    else:
        verdict = "pass"
    sc = scenario(
        name,
        20.0,
        started_unix=T0 + 60.0 * i,
        checks=checks,
        validity=validity or [],
        verdict=verdict,
        partial=partial,
    )
    if defined_by is not None:
        sc["defined_by"] = defined_by
    doc = {
        "schema": SCHEMA,
        "harness_version": "0.1.0",
        "created": "2025-11-30T08:00:00Z",
        "verdict": combine_verdicts([verdict]),
        "partial": partial,
        "machine": dict(MACHINE),
        "sut": dict(SUT),
        "loadgen": None,
        "scenarios": [sc],
    }
    run_dir = out / f"run-{i}"
    run_dir.mkdir(parents=True)
    write_document(run_dir / "results.json", doc)
    code = exit_code_for(doc)
    return {
        "name": run_dir.name,
        "dir": str(run_dir),
        "scenario": name,
        "verdict": doc["verdict"],
        "exit_code": int(code),
        "line": f"{str(doc['verdict']).upper()} — … (exit {int(code)})",
    }


def _at(i: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(T0 + 60.0 * i))


def _failed(out: Path, i: int) -> dict[str, Any]:
    checks = [check("steady.p99_ms", False, 812.0, 500.0), check("steady.error_rate", True)]
    return _judged_run(out, i, "steady_state", checks)


def _passed(out: Path, i: int, name: str = "steady_state") -> dict[str, Any]:
    return _judged_run(out, i, name, [check("steady.p99_ms", True, 90.0, 500.0)])


def _invalid(out: Path, i: int) -> dict[str, Any]:
    checks = [check("spike.recovery_s", True, 2.0, 10.0)]
    why = "foreign CPU 61 % of a core for 4 s on the server's core"
    return _judged_run(out, i, "spike", checks, validity=[why])


def _stopped(out: Path, i: int) -> dict[str, Any]:
    """Stopped from the UI before its end: partial, nothing failed (exit 3)."""
    return _judged_run(out, i, "steady_state", [check("steady.p99_ms", True)], partial=True)


def _not_judged(out: Path, i: int) -> dict[str, Any]:
    checks = [
        check("soak.rss_trend", None, skipped="no server pid"),
        check("soak.latency_drift", True),
    ]
    return _judged_run(out, i, "soak", checks, defined_by=["soak.rss_trend"])


class _Session:
    """The part of ``HarnessState`` the quit listeners read, for a web UI session whose
    runs were all judged when they ended."""

    web = True
    is_worker = False
    stoppable = False
    finalising = False
    judging = None

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.runs = runs
        self.shut_down = False

    def wait_judged(self, timeout: float) -> dict[str, Any] | None:
        return self.runs[-1] if self.runs else None

    def shutdown(self) -> None:
        self.shut_down = True


def _quit(
    state: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[int, str]:
    """Locust's shutdown as it fires the listeners: quitting (the exit code), then quit;
    the process's exit code and the harness's last console line."""
    env = SimpleNamespace(harness=state, runner=None, process_exit_code=None)
    monkeypatch.setattr(plugin, "_state", lambda: state)
    with caplog.at_level(logging.INFO, logger="harness.load"):
        plugin._on_quitting(environment=env)
        plugin._on_quit(exit_code=env.process_exit_code)
    lines = [r.getMessage() for r in caplog.records if r.name == "harness.load"]
    return env.process_exit_code, (lines[-1] if lines else "")


def test_a_failed_run_is_not_hidden_by_later_runs_that_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = _Session([_failed(tmp_path, 1), _passed(tmp_path, 2), _passed(tmp_path, 3)])
    code, last_line = _quit(state, monkeypatch, caplog)
    assert code == ExitCode.FAIL
    assert last_line == (
        f"harness: exit 1: run 1 of 3 (steady_state, {_at(1)}) failed steady.p99_ms; "
        "the last run passed"
    )
    assert state.shut_down  # the line comes after the session's shutdown, last


def test_the_worst_run_decides_failure_then_invalid_then_not_judged(tmp_path: Path) -> None:
    inv, nj, ok = _invalid(tmp_path, 1), _not_judged(tmp_path, 2), _passed(tmp_path, 3)
    code, said = session_verdict([nj, inv, ok])
    assert code == ExitCode.INVALID
    assert said == (
        f"exit 3: run 2 of 3 (spike, {_at(1)}) was invalid: foreign CPU 61 % of a core for "
        "4 s on the server's core; the last run passed"
    )
    code, said = session_verdict([nj, ok])
    assert code == ExitCode.NOT_JUDGED
    assert said == (
        f"exit 4: run 1 of 2 (soak, {_at(2)}) was not judged (not judged: soak.rss_trend); "
        "the last run passed"
    )
    fail = _failed(tmp_path, 4)
    code, said = session_verdict([inv, fail, nj])
    assert code == ExitCode.FAIL
    assert said.startswith(f"exit 1: run 2 of 3 (steady_state, {_at(4)}) failed steady.p99_ms")
    assert said.endswith("; the last run was not judged (not judged: soak.rss_trend)")


def test_a_run_stopped_from_the_ui_is_invalid_and_every_equal_run_is_named(
    tmp_path: Path,
) -> None:
    runs = [_passed(tmp_path, 1), _stopped(tmp_path, 2), _stopped(tmp_path, 3)]
    code, said = session_verdict(runs)
    assert code == ExitCode.INVALID
    assert said == (
        f"exit 3: run 2 of 3 (steady_state, {_at(2)}) was invalid: stopped before its end "
        "(partial results); also invalid: run 3 (the last)"
    )


def test_a_run_the_judge_could_not_finish_is_never_a_pass(tmp_path: Path) -> None:
    ok = _passed(tmp_path, 1)
    unreadable = {**_passed(tmp_path, 2), "exit_code": 2, "line": "results file unreadable"}
    unjudged = {**_passed(tmp_path, 3), "exit_code": None, "line": "judging…"}
    for broken in (unreadable, unjudged):
        code, said = session_verdict([ok, broken])
        assert code == ExitCode.INVALID, said
        assert f"run 2 of 2 (steady_state, {_at(int(broken['name'][-1]))}) was not judged" in said


def test_every_run_passed_or_one_run_gives_that_runs_own_code(tmp_path: Path) -> None:
    runs = [_passed(tmp_path, 1), _passed(tmp_path, 2, "spike")]
    assert session_verdict(runs) == (ExitCode.PASS, "exit 0: all 2 runs of the session passed")
    for i, one in enumerate((_passed, _failed, _invalid, _not_judged, _stopped), start=3):
        run = one(tmp_path, i)
        code, said = session_verdict([run])
        assert code == run["exit_code"] and said.startswith(f"exit {code}: run 1 of 1 ("), said
        assert "the last run" not in said


def test_a_headless_run_exits_with_its_own_judged_code_and_no_session_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Headless (local or distributed master): the run is judged at quit by
    ``harness.finish``, whose code is the process's; no session is summed up."""
    monkeypatch.setenv(PARENT_RENDERS_ENV, "1")  # no reports rendered: judging only
    out = tmp_path / "out"
    out.mkdir()
    write_document(out / "results.json", build_document(scenarios=["steady_state", "spike"]))
    expected = finish(out, render=False)[1]
    write_document(out / "results.json", build_document(scenarios=["steady_state", "spike"]))
    state = SimpleNamespace(
        web=False,
        is_worker=False,
        stoppable=False,
        finalising=False,
        runs=[],
        judging=None,
        exit_code=None,
        on_disk=True,
        out_dir=out,
        opts=SimpleNamespace(checklist=None),
        judged=lambda: None,
        shutdown=lambda: None,
    )
    code, last_line = _quit(state, monkeypatch, caplog)
    assert code == int(expected) != ExitCode.PASS  # the factory's spike run is invalid
    assert "run 1 of" not in last_line and f"(exit {int(expected)})" in last_line
