"""One ``harness acceptance`` / ``harness run`` session: the plan's scenarios in order,
each a Locust run (``harness.locust_run``), then merge, judge and report.

Between scenarios: the first undisturbed calibration pins the capacity for the scenarios
after it that send the same requests (one per ``[llm]`` workload), a
scenario invalid only because the machine was disturbed runs again (``retries``), a
configuration error found while preparing one stops the session (nothing measured yet)
or leaves that scenario out (named), a scenario that wrote no results fails
(``no_results``), and an attached server its supervisor restarted (``crash_restart``) is
followed to its new pid by the attempts and scenarios after it. SIGINT/SIGTERM stop the
running scenario cleanly and end the session with what was measured.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness import locust_run
from harness.acceptance.no_results import failed_scenario
from harness.acceptance.plan import Plan
from harness.acceptance.retries import followed_pid, retry_line, retry_reasons, set_aside
from harness.errors import ConfigError, ExitCode, HarnessError
from harness.finish import FINISH_IMPORTS, finish
from harness.load.preflight import Exclusion
from harness.locust_run import ScenarioRun, StopFlag, last_error_line
from harness.primitives import trapped_signals
from harness.results import machine_metadata, merge_documents, new_document
from harness.results.records import Excluded


@dataclass(frozen=True)
class Outcome:
    document: dict[str, Any]
    exit_code: ExitCode
    runs: tuple[ScenarioRun, ...]


def run_plan(plan: Plan, show: Callable[[str], None] = print) -> Outcome:
    """Run every scenario of ``plan`` in order, then merge, judge and render."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[ScenarioRun] = []
    excluded: list[Exclusion] = list(plan.excluded)
    for e in plan.excluded:
        show(f"  {e.name}: NOT RUN — {e.reason}")
    stop = StopFlag()
    with trapped_signals(stop):
        pinned = any(a.startswith("--capacity-rps") for a in plan.extra_args)
        capacities: dict[str, float] = {}  # workload → the capacity calibrated for it
        for i, name in enumerate(plan.scenarios, start=1):
            if stop.requested:
                break
            workload = capacity_workload(name, plan.mode)
            current = plan
            if not pinned and workload in capacities:
                current = replace(
                    plan,
                    extra_args=(*plan.extra_args, "--capacity-rps", repr(capacities[workload])),
                )
            warm = None  # finish's imports, loaded while Locust judges and stops its server
            if not all(m in sys.modules for m in FINISH_IMPORTS):
                results = current.out_dir / Path(name).stem / "results.json"
                wanted = tuple(
                    m for m in FINISH_IMPORTS if plan.html_report or not m.endswith(".html")
                )
                warm = locust_run.ImportWhenWritten(results, wanted)
            run = _run_with_retries(plan, current, name, i, stop, show)
            plan = _following(plan, run)
            if warm is not None:
                warm.cancel()
            if run.returncode == ExitCode.USAGE and not run.interrupted:
                # A usage error (found while preparing: a model without inputs, a missing
                # placeholder): the scenario was not measured, whatever the child wrote —
                # a configuration error is the user's to fix, not a disturbed run.
                message = (
                    _recorded_error(run.document)
                    or run.error
                    or last_error_line(run.out_dir / "locust.log")
                    or f"locust exited {int(ExitCode.USAGE)} for scenario {name}"
                )
                if not any(r.document is not None for r in runs):
                    # before anything was measured: fail in seconds, one line
                    raise ConfigError(message)
                # found late (other scenarios measured something): keep what was measured;
                # this scenario counts as planned and not run (the verdict is at best
                # "not judged"), named with the error
                excluded.append(Exclusion(Path(name).stem, f"configuration error: {message}"))
                show(f"  {Path(name).stem}: NOT RUN — configuration error: {message}")
                continue
            runs.append(run)
            show(scenario_summary(run))
            capacity = (
                None if pinned or workload in capacities else calibrated_capacity(run.document)
            )
            if capacity is not None:
                # One capacity per workload: "0.6x" is the same rate in every scenario that
                # sends the same requests, and the later ones skip their own probe.
                capacities[workload] = capacity
                same = " with the same [llm] workload" if workload else ""
                show(
                    f"  capacity {capacity:.1f} req/s (calibrated in {Path(name).stem}; "
                    f"pinned for the scenarios after it{same})"
                )
    doc = _merged(plan, runs, excluded)
    doc, code = finish(plan.out_dir, plan.checklist, doc=doc, html=plan.html_report)
    return Outcome(document=doc, exit_code=code, runs=tuple(runs))


def _run_with_retries(
    plan: Plan, current: Plan, name: str, index: int, stop: StopFlag, show: Callable[[str], None]
) -> ScenarioRun:
    """Scenario ``name`` run, and run again (up to ``plan.retry_invalid`` more times) while
    it is invalid only because the machine was disturbed; the attempts set aside are
    recorded in the results of the one kept."""
    total = len(plan.scenarios)
    run = locust_run.run_one(current, current.out_dir, name, index, total, stop, show)
    while len(run.attempts) < plan.retry_invalid and not stop.requested:
        # an attached server its supervisor restarted: the attempt acts on the new process
        plan, current = _following(plan, run), _following(current, run)
        reasons = retry_reasons(run, plan)
        if not reasons:
            break
        earlier = [*run.attempts, set_aside(run, reasons)]
        show(retry_line(Path(name).stem, reasons, earlier, plan.retry_invalid))
        run = locust_run.run_one(current, current.out_dir, name, index, total, stop, show)
        run.attempts = list(earlier)  # type: ignore[arg-type]
        if run.document is not None:
            for sc in run.document.get("scenarios") or []:
                sc["attempts"] = earlier
    return run


def _following(plan: Plan, run: ScenarioRun) -> Plan:
    """``plan`` aimed at the process an attached server's supervisor restarted it as during
    ``run`` (``retries.followed_pid``); unchanged when nothing restarted it."""
    pid = followed_pid(run, plan)
    if pid is None:
        return plan
    return replace(plan, target=replace(plan.target, sut_pid=pid))


def _merged(plan: Plan, runs: list[ScenarioRun], excluded: list[Exclusion]) -> dict[str, Any]:
    """One results document: the runs' merged, a failed result for each run that wrote
    none, what was left out and accepted, and what an interruption did not run."""
    docs = [r.document for r in runs if r.document is not None]
    if docs:
        doc = merge_documents(docs)
    else:
        doc = new_document(machine=machine_metadata(), sut=plan.target.describe(), loadgen={})
        doc["scenarios"] = []
    by_name = {sc.get("name") for sc in doc["scenarios"]}
    for run in runs:
        if run.document is None and Path(run.name).stem not in by_name:
            doc["scenarios"].append(failed_scenario(run, plan.mode))
    if excluded:
        doc["excluded"] = [
            Excluded(name=e.name, reason=e.reason, optional=e.optional) for e in excluded
        ]
    if plan.allow_skip:
        doc["allow_skip"] = list(plan.allow_skip)
    attempted = len(runs) + len(excluded) - len(plan.excluded)
    interrupted = any(r.interrupted for r in runs) or attempted < len(plan.scenarios)
    if interrupted:
        doc["partial"] = True
        doc["not_run"] = list(plan.scenarios[attempted:])
    return doc


def capacity_workload(name: str, mode: str) -> str:
    """What a capacity is the capacity of: "" for the model's inputs (every scenario of a
    protocol without a token workload sends the same requests), else the scenario's
    ``[llm]`` table — a server completes fewer streams a second the longer they are.
    A scenario that cannot be read here has a key of its own (its run reports why)."""
    from harness.load.scenario import load_scenario

    try:
        llm = load_scenario(name, "quick" if mode == "quick" else "full").llm
    except HarnessError:
        return f"unreadable: {name}"
    return json.dumps(dict(llm), sort_keys=True, default=str) if llm else ""


def _recorded_error(document: Mapping[str, Any] | None) -> str | None:
    """The error message a scenario's results recorded (``error.message``), if any."""
    for sc in (document or {}).get("scenarios") or []:
        message = (sc.get("error") or {}).get("message")
        if message:
            return str(message)
    return None


def calibrated_capacity(document: Mapping[str, Any] | None) -> float | None:
    """The capacity a scenario's calibration probe measured, if it ran one and was not
    judged disturbed (another tenant, a saturated generator: then the next scenario
    calibrates on its own)."""
    from harness.checks.engine import probe_reasons

    for sc in (document or {}).get("scenarios") or []:
        if sc.get("calibration") and sc.get("capacity_rps") and not probe_reasons(sc):
            return float(sc["capacity_rps"])
    return None


def scenario_summary(run: ScenarioRun) -> str:
    """A scenario's lines in the live output: its verdict, counts, failed checks and the
    attempts set aside."""
    name = Path(run.name).stem
    if run.document is None:
        return f"  {name}: FAIL — {run.error}"
    lines = []
    for sc in run.document.get("scenarios", []):
        checks = sc.get("checks") or []
        passed = sum(1 for c in checks if c.get("passed") is True)
        failed = [c for c in checks if c.get("passed") is False]
        skipped = sum(1 for c in checks if c.get("passed") is None)
        verdict = (sc.get("verdict") or "unjudged").upper()
        lines.append(
            f"  {name}: {verdict} — {passed} passed, {len(failed)} failed, {skipped} skipped"
            + ("" if not sc.get("partial") else " (partial)")
        )
        for c in failed:
            lines.append(f"    FAIL {c.get('id')}: {c.get('detail')}")
        lines += [
            f"    attempt {a.get('attempt')} set aside as invalid (kept in {a.get('dir')}/)"
            for a in sc.get("attempts") or []
        ]
    return "\n".join(lines) or f"  {name}: no scenarios in results"
