"""A scenario invalid only because the machine was disturbed is run again.

Requests that left late or another tenant's CPU (``engine.disturbance_reasons``) say
nothing about the server; the same scenario on a quieter machine may be valid. Each
attempt set aside keeps its whole directory (``NAME.attempt-K``) and is named in the
results of the attempt that replaces it (``attempts``).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Sequence

import psutil

from harness.locust_run import RunSettings, ScenarioRun
from harness.results.records import Attempt


def retry_reasons(run: ScenarioRun, settings: RunSettings) -> list[str]:
    """Why ``run`` may be run again: its validity reasons when every one of them is a
    disturbance of the machine (``engine.disturbance_reasons``: requests that left late,
    another tenant's CPU) and nothing else is wrong; else none. A scenario invalid for
    what the same machine would give again (the generator saturated, a sampler gap,
    unbalanced accounting, chaos that did not apply), one that failed a check or ended
    with a dead server, and an attached server whose pid is gone are not retried."""
    if run.document is None or run.interrupted:
        return []
    if settings.target.sut_pid is not None and not psutil.pid_exists(settings.target.sut_pid):
        return []  # the next attempt could not sample the attached server
    from harness.checks import judge_scenario, load_checklist
    from harness.checks.engine import disturbance_reasons

    overrides = load_checklist(settings.checklist) if settings.checklist is not None else None
    reasons: list[str] = []
    for sc in run.document.get("scenarios") or []:
        judged = judge_scenario(copy.deepcopy(sc), overrides)
        if judged["verdict"] != "invalid":
            return []
        machine = set(disturbance_reasons(sc, overrides))
        if not set(judged["validity"]) <= machine:
            return []
        reasons += judged["validity"]
    return reasons


def followed_pid(run: ScenarioRun, settings: RunSettings) -> int | None:
    """The pid an attached server (``--sut-pid`` on this host) runs under after its
    supervisor restarted it during ``run``: the last chaos event of the run that found the
    supervisor's new process (``crash_restart``'s kill). An attempt run again and the
    scenarios after it act on that process. None when nothing restarted the server, or the
    new process is gone too."""
    t = settings.target
    if t.sut_pid is None or t.agent_url is not None or run.document is None:
        return None
    new = None
    for sc in run.document.get("scenarios") or []:
        for event in sc.get("chaos") or []:
            detail = event.get("detail") or {}
            if detail.get("restarted_by") == "supervisor" and detail.get("new_pid"):
                new = int(detail["new_pid"])
    if new is None or new == t.sut_pid or not psutil.pid_exists(new):
        return None
    return new


def set_aside(run: ScenarioRun, reasons: Sequence[str]) -> Attempt:
    """Move an invalid attempt's directory to ``NAME.attempt-K`` (kept whole: its results,
    samples and logs) and describe it for the results of the attempt that replaces it."""
    k = len(run.attempts) + 1
    kept = run.out_dir.with_name(f"{run.out_dir.name}.attempt-{k}")
    if kept.exists():
        shutil.rmtree(kept)  # an older acceptance run's, in the same --out
    run.out_dir.rename(kept)
    return Attempt(
        attempt=k,
        verdict="invalid",
        validity=list(reasons),
        dir=kept.name,
        started_unix=run.started_unix,
        elapsed_s=round(run.elapsed_s, 3),
    )


def retry_line(name: str, reasons: Sequence[str], earlier: Sequence[Attempt], most: int) -> str:
    """What the live output says when an attempt is set aside and the scenario runs again."""
    return (
        f"  {name}: INVALID — {reasons[0]}; the machine was disturbed, "
        f"so it runs again (attempt {len(earlier) + 1} of {most + 1}; "
        f"attempt {len(earlier)} kept in {earlier[-1]['dir']})"
    )
