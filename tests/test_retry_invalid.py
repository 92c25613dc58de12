"""A scenario invalid only because the machine was disturbed runs again (--retry-invalid).

Which invalid runs are retried (requests that left late, another tenant's CPU) and which
are not (the generator saturated, a failed check, an attached server that is gone), and
what the loop keeps: the earlier attempt's whole directory and its reasons in the results
of the attempt that replaced it. The real run is in tests/test_foreign_cpu.py (a tenant
takes a core mid-run: attempt 1 invalid naming it, attempt 2 valid).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness import locust_run
from harness.acceptance import Plan, retry_reasons, run_plan
from harness.checks.engine import disturbance_reasons, validity
from harness.locust_run import ScenarioRun, Target
from harness.report.summary import render_summary
from harness.results import machine_metadata, new_document
from harness.testing.checks import good_steady, hdr

LATE = hdr([1000] * 980 + [40_000] * 20)  # dispatch lag p99 40 ms > 20 ms (10 % of 200)
T = [float(i) for i in range(40)]


def _doc(sc: dict[str, Any]) -> dict[str, Any]:
    doc = new_document(machine=machine_metadata(), sut={}, loadgen={})
    doc["scenarios"] = [{"name": "steady_state", **sc}]
    return doc


def _plan(tmp_path: Path, **kw: Any) -> Plan:
    return Plan(
        scenarios=("steady_state",),
        mode="quick",
        out_dir=tmp_path,
        target=Target(url="http://127.0.0.1:1", **kw),
    )


def _run(tmp_path: Path, sc: dict[str, Any]) -> ScenarioRun:
    return ScenarioRun(name="steady_state", out_dir=tmp_path / "steady_state", document=_doc(sc))


def test_late_requests_and_a_tenant_are_disturbances_the_rest_is_not(tmp_path) -> None:
    late = good_steady(dispatch_lag_hdr=LATE)
    assert disturbance_reasons(late) == validity(late) and "dispatch lag" in validity(late)[0]
    assert retry_reasons(_run(tmp_path, late), _plan(tmp_path)) == validity(late)

    tenant = good_steady(
        system={"series": {"t": T, "foreign_cpu_pct": [90.0] * 40, "foreign_cores": [1] * 40}}
    )
    (reason,) = validity(tenant)
    assert "not the run's" in reason and disturbance_reasons(tenant) == [reason]
    assert retry_reasons(_run(tmp_path, tenant), _plan(tmp_path)) == [reason]

    # the generator saturated: the same machine gives it again — not retried, alone or
    # beside a disturbance
    cpu = [40.0] * 20 + [97.0] * 10 + [40.0] * 10
    saturated = good_steady(system={"series": {"t": T, "loadgen_cpu_pct": cpu}})
    assert validity(saturated) and not disturbance_reasons(saturated)
    assert retry_reasons(_run(tmp_path, saturated), _plan(tmp_path)) == []
    both = good_steady(dispatch_lag_hdr=LATE, system={"series": {"t": T, "loadgen_cpu_pct": cpu}})
    assert len(validity(both)) == 2
    assert retry_reasons(_run(tmp_path, both), _plan(tmp_path)) == []

    # valid, failed, interrupted, no results: nothing to retry
    assert retry_reasons(_run(tmp_path, good_steady()), _plan(tmp_path)) == []
    slow = good_steady(latency_hdr=None)
    slow["check_config"]["steady.p99_ms"]["threshold"] = 1.0  # p99 5 ms > 1 ms: failed
    assert retry_reasons(_run(tmp_path, slow), _plan(tmp_path)) == []
    stopped = _run(tmp_path, late)
    stopped.interrupted = True
    assert retry_reasons(stopped, _plan(tmp_path)) == []
    assert retry_reasons(ScenarioRun("steady_state", tmp_path), _plan(tmp_path)) == []


def test_an_attached_server_that_is_gone_is_not_retried(tmp_path) -> None:
    late = good_steady(dispatch_lag_hdr=LATE)
    assert retry_reasons(_run(tmp_path, late), _plan(tmp_path, sut_pid=os.getpid()))
    gone = 2**22 + 12345  # above pid_max's default: no such process
    assert retry_reasons(_run(tmp_path, late), _plan(tmp_path, sut_pid=gone)) == []


def test_the_checklist_decides_what_is_invalid(tmp_path) -> None:
    late = good_steady(dispatch_lag_hdr=LATE)
    checklist = tmp_path / "checklist.toml"
    checklist.write_text("[validity]\nlag_max_fraction = 0.5\n")  # 100 ms allowed: valid
    plan = Plan(**{**_plan(tmp_path).__dict__, "checklist": checklist})
    assert retry_reasons(_run(tmp_path, late), plan) == []


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_the_loop_keeps_every_attempt_and_reports_it(tmp_path, monkeypatch, retries) -> None:
    """run_one stands in for Locust: attempt k writes its directory; the first two are
    late. Each set-aside attempt is moved whole to steady_state.attempt-K, and the kept
    result names them all."""
    calls: list[int] = []

    def fake_run_one(settings, out_root, name, index, total, stop, show, poll_s=1.0):
        calls.append(len(calls) + 1)
        out = out_root / "steady_state"
        out.mkdir(parents=True, exist_ok=True)
        (out / "marker").write_text(str(len(calls)))
        sc = good_steady(dispatch_lag_hdr=LATE) if len(calls) <= 2 else good_steady()
        return ScenarioRun(name=name, out_dir=out, document=_doc(sc))

    monkeypatch.setattr(locust_run, "run_one", fake_run_one)
    shown: list[str] = []
    plan = Plan(**{**_plan(tmp_path).__dict__, "retry_invalid": retries})
    outcome = run_plan(plan, show=shown.append)
    assert calls == list(range(1, retries + 2))
    sc = outcome.document["scenarios"][0]
    attempts = sc.get("attempts") or []
    assert [a["attempt"] for a in attempts] == list(range(1, retries + 1))
    for a in attempts:
        kept = tmp_path / a["dir"]
        assert (kept / "marker").read_text() == str(a["attempt"])
        assert "dispatch lag p99 40.0 ms" in a["validity"][0] and a["verdict"] == "invalid"
    assert (tmp_path / "steady_state" / "marker").read_text() == str(retries + 1)
    # two late attempts then a clean one: only three attempts end valid
    assert sc["verdict"] == ("pass" if retries == 2 else "invalid")
    assert int(outcome.exit_code) == (0 if retries == 2 else 3)
    if retries:
        assert any("runs again (attempt 2 of" in s for s in shown), shown
        summary = render_summary(outcome.document)
        assert "attempt 1 was invalid and was run again — dispatch lag" in summary
        written = json.loads((tmp_path / "results.json").read_text())
        assert written["scenarios"][0]["attempts"] == attempts


def test_a_server_its_supervisor_restarted_is_followed_by_the_retry_and_the_rest(
    tmp_path, monkeypatch
) -> None:
    """crash_restart against an attached server: its supervisor starts it again under a new
    pid, which the kill's record names. An attempt invalid for late requests runs again
    against that pid (the old one is gone: without following it there would be no retry),
    and so does the scenario after it."""
    import subprocess
    import sys

    old = subprocess.Popen([sys.executable, "-c", "pass"])
    old.wait()  # gone, as a killed server is
    new = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kill = {"action": "kill", "params": {}, "start_s": 10.0, "end_s": 12.0, "ok": True,
                "error": None, "detail": {"found": True, "gone": True, "restarted_by":
                "supervisor", "old_pid": old.pid, "new_pid": new.pid}}  # fmt: skip
        seen: list[tuple[str, int | None]] = []

        def fake_run_one(settings, out_root, name, index, total, stop, show, poll_s=1.0):
            seen.append((name, settings.target.sut_pid))
            out = out_root / name
            out.mkdir(parents=True, exist_ok=True)
            late = name == "steady_state" and len(seen) == 1
            sc = good_steady(dispatch_lag_hdr=LATE) if late else good_steady()
            sc["chaos"] = [kill] if name == "steady_state" else []
            doc = new_document(machine=machine_metadata(), sut={}, loadgen={})
            doc["scenarios"] = [{**sc, "name": name}]
            return ScenarioRun(name=name, out_dir=out, document=doc)

        monkeypatch.setattr(locust_run, "run_one", fake_run_one)
        plan = Plan(
            scenarios=("steady_state", "soak"),
            mode="quick",
            out_dir=tmp_path,
            target=Target(url="http://127.0.0.1:1", sut_pid=old.pid),
        )
        run_plan(plan, show=lambda _line: None)
        assert seen == [
            ("steady_state", old.pid),
            ("steady_state", new.pid),
            ("soak", new.pid),
        ]
    finally:
        new.kill()
        new.wait()
