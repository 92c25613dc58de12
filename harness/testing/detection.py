"""Running and judging the detection matrix: ``run_case`` runs one case's ``harness run``,
``judge`` says why a run did not show what its case expects, and ``share_from_acceptance``
lets the quick acceptance run of the same session stand in for the healthy steady case.

The cases themselves are harness.testing.detection_cases (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.load.options import GOLDEN_CACHE_ENV
from harness.testing.detection_case import CHECKLIST_FILE, DetectionCase
from harness.testing.detection_cases import BY_NAME, CAPACITY_CASE, CASES, NOT_PLANTABLE

__all__ = [
    "ACCEPTANCE_SCENARIOS",
    "BY_NAME",
    "CAPACITY_CASE",
    "CASES",
    "NOT_PLANTABLE",
    "SHARED_RUNS",
    "RETRIED",
    "CaseRun",
    "DetectionCase",
    "capacity_of",
    "judge",
    "note_retries",
    "run_case",
    "share_from_acceptance",
    "wrong_side",
]


def wrong_side(value: float | None, op: str, threshold: float) -> bool:
    """True when ``value`` fails ``value OP threshold``; ``None`` is +inf (never recovered)."""
    v = math.inf if value is None else float(value)
    return {
        "<=": v > threshold,
        "<": v >= threshold,
        ">=": v < threshold,
        ">": v <= threshold,
        "==": v != threshold,
    }[op]


def judge(case: DetectionCase, exit_code: int, doc: Mapping) -> list[str]:
    """Why the run did not show what ``case`` expects; empty when it did."""
    problems: list[str] = []
    scenarios = doc.get("scenarios") or []
    if not scenarios:
        return [f"exit {exit_code}, no scenario in results.json"]
    sc = scenarios[0]
    if sc.get("validity"):
        problems.append(f"run invalid: {sc['validity']}")
    checks = {c["id"]: c for c in sc.get("checks") or []}
    if case.expect_pass:
        if exit_code != 0:
            problems.append(f"exit {exit_code}, expected 0 (healthy control)")
        for c in checks.values():
            if c.get("passed") is False:
                problems.append(f"{c['id']} failed on the healthy server: {c.get('detail')}")
        if checks.get(case.check, {}).get("passed") is not True:
            problems.append(f"{case.check} not passed: {checks.get(case.check)}")
        return problems
    if exit_code != 1:
        problems.append(f"exit {exit_code}, expected 1")
    for check_id in case.intended:
        c = checks.get(check_id)
        if c is None:
            problems.append(f"{check_id} missing from the results")
        elif c.get("passed") is not False:
            problems.append(
                f"{check_id} not failed: passed={c.get('passed')} "
                f"skipped={c.get('skipped')!r} detail={c.get('detail')!r}"
            )
        elif not wrong_side(c.get("value"), c["op"], c["threshold"]):
            problems.append(
                f"{check_id} failed but value {c.get('value')} {c['op']} "
                f"{c['threshold']} holds: {c.get('detail')}"
            )
    for other in checks.values():
        unrelated = other["id"] not in case.intended and other["id"] not in case.allowed
        if unrelated and other.get("passed") is False:
            problems.append(f"unrelated check failed: {other['id']}: {other.get('detail')}")
    return problems


def capacity_of(doc: Mapping) -> float | None:
    """The calibrated capacity (req/s) of a results document's first scenario."""
    scenarios = doc.get("scenarios") or []
    cap = scenarios[0].get("capacity_rps") if scenarios else None
    return float(cap) if cap else None


@dataclasses.dataclass(frozen=True)
class CaseRun:
    case: DetectionCase
    exit_code: int
    doc: Mapping
    wall_s: float
    argv: tuple[str, ...]
    out_dir: str


# Runs another test already made this session, by case name: the quick checklists'
# scenarios (tests/test_acceptance_e2e.py) are the healthy cases of the same scenario,
# mode, length and server — the V2 checklist's steady_state the healthy steady-state case,
# the LLM checklist's scenarios the healthy LLM cases — so the matrix judges them instead
# of making them again (a run fewer per scenario in CI). Run alone, test_detection.py
# makes its own.
SHARED_RUNS: dict[str, CaseRun] = {}
# the quick acceptance run's scenario results by name, for slow tests that need a healthy
# run of one of them on the reference server (one run fewer in a CI session)
ACCEPTANCE_SCENARIOS: dict[str, Mapping] = {}
# Attempts set aside as invalid (a disturbed machine) and run again, this session: (where,
# scenario, seconds spent, first reason), for the session's time ledger — a retried run
# costs its whole length again, and a CI log should say which and why.
RETRIED: list[tuple[str, str, float, str]] = []


def note_retries(where: str, doc: Mapping) -> None:
    """Record the attempts ``doc``'s scenarios set aside (``scenarios[].attempts``)."""
    for sc in doc.get("scenarios") or []:
        for a in sc.get("attempts") or []:
            reasons = a.get("validity") or ["?"]
            RETRIED.append(
                (where, str(sc.get("name")), float(a.get("elapsed_s") or 0.0), str(reasons[0]))
            )


def share_from_acceptance(doc: Mapping, out_dir: str, argv: Sequence[str]) -> None:
    """Offer the scenarios of a quick acceptance run (its results in ``out_dir``, one
    directory per scenario) as the healthy cases they are twins of."""
    note_retries("quick acceptance", doc)
    for s in doc.get("scenarios") or []:
        if s.get("mode") == "quick" and s.get("verdict") == "pass":
            ACCEPTANCE_SCENARIOS[str(s.get("name"))] = s
    for sc in doc.get("scenarios") or []:
        if sc.get("mode") != "quick":
            continue
        code = {"pass": 0, "fail": 1}.get(str(sc.get("verdict")), 3)
        for case in _twins_of(str(sc.get("name"))):
            SHARED_RUNS[case.name] = CaseRun(
                case,
                code,
                {**doc, "verdict": sc.get("verdict"), "scenarios": [sc]},
                0.0,
                tuple(argv),
                str(Path(out_dir) / str(sc.get("name"))),
            )


def _twins_of(scenario: str) -> list[DetectionCase]:
    """The healthy cases a quick acceptance run's ``scenario`` stands in for: the healthy
    steady-state case, and each healthy LLM case that runs its scenario at its quick
    length (no ``--duration``) — the same scenario, mode, length and bundled server."""
    if scenario == "steady_state":
        return [BY_NAME[CAPACITY_CASE]]
    return [
        c
        for c in CASES
        if c.expect_pass and c.api == "openai" and c.scenario == scenario and c.duration_s is None
    ]


def run_case(
    case: DetectionCase,
    out_dir: str,
    capacity_rps: float | None,
    cwd: str | None = None,
    twin_capacity: float | None = None,
    golden_cache: str | None = None,
) -> CaseRun:
    """Run ``harness run`` for ``case`` as a subprocess, bounded by ``case.timeout_s``;
    ``golden_cache``: the golden file the session's cases share (``--golden-cache``: a
    case whose server answers the first inputs as an earlier case's did reuses that
    golden instead of fetching its own).

    On timeout the harness gets SIGTERM (it stops Locust and the server it started), then
    its process group SIGKILL after a grace period. Either way the harness is gone on return.
    """
    import contextlib
    import json
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    argv = case.harness_argv(out_dir, capacity_rps, twin_capacity)
    if case.checklist:
        (Path(out_dir) / CHECKLIST_FILE).write_text(case.checklist_toml())
    log = open(Path(out_dir) / "harness.log", "wb")  # noqa: SIM115 — closed in finally
    t0 = time.monotonic()
    env = {**os.environ, GOLDEN_CACHE_ENV: golden_cache} if golden_cache else None
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True, env=env
    )
    code = -1
    try:
        code = proc.wait(timeout=case.timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:  # timed out or interrupted: let the harness stop its SUT
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    wall = time.monotonic() - t0
    try:
        doc = json.loads((Path(out_dir) / "results.json").read_text())
    except (OSError, ValueError):
        doc = {}
    # What the table script needs to render this run later (--from): not in results.json.
    meta = {
        "case": case.name,
        "exit_code": code,
        "wall_s": wall,
        "argv": argv,
        "capacity_rps": capacity_rps,
    }
    (Path(out_dir) / "detection_case.json").write_text(json.dumps(meta, indent=1))
    note_retries(f"detection case {case.name}", doc)
    return CaseRun(case, code, doc, wall, tuple(argv), out_dir)
