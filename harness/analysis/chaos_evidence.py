"""Evidence that the planned chaos really happened: a validity rule, not a check.

A contention or chaos scenario judges the server *under* an event. When the event did not
happen — a hog that failed to start or was skipped (no SUT to act on), a hog that got no
CPU, a pause the kernel never showed, a kill that found no process — the checks compare
a baseline with a baseline: a throughput ratio near 1.0 and a recovery that "passes".
So every planned event must show it applied, or the run judges nothing (invalid, with a
reason), never a pass:

* every contention block of kind ``hog`` the run reached has a ``cpu_hog`` record, and
  every chaos record has ``ok`` true and an ``end_s``;
* it began and ended within ``tolerance_s`` of its plan (the contention block, else
  ``at_s`` + ``params.duration_s``), unless the run itself ended first;
* ``cpu_hog``: one pid per core asked, each hog on the core asked (``cores_used``, and the
  affinity observed at revert when recorded), and the hogs' own CPU seconds
  (``detail.hog_cpu_s``, psutil at revert) at least ``min_hog_cpu_fraction`` of the
  seconds they ran × cores;
* ``pause``: every signalled pid seen in state ``T`` once the stop landed
  (``detail.stopped``) and still in it just before SIGCONT (``detail.still_stopped``);
* ``kill``: the process was running when signalled (``detail.found``) and exited
  (``detail.gone``); with ``restart``, a new pid that became ready.
* ``terminate``: the process was running (``detail.found``), did not ignore SIGTERM
  (``detail.ignored``), and showed it got it — its readiness stopped answering 200
  (``detail.unready_s``) or it exited (``detail.exit_s``); with ``restart``, a new pid
  that became ready. One that drained but never exited is evidence (of a defect the
  shutdown checks judge), not an invalid run.
* ``network``: the fault proxy's own count of what the toxic did (``detail.counters``):
  chunks delayed and seconds added (latency, bandwidth, slicer), connections reset
  (reset_peer) or data held (timeout) — at least one each; a toxic that met no traffic
  left the server unexposed.

A record without the evidence (an older results file) is not evidence. The limits and
the measured hog figures behind them are in docs/checks.md ("Invalid runs").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# An event may start or end this far from its plan: the timeline wakes within
# milliseconds, but inside a busy Locust process a greenlet can be late by a few hundred
# ms, and one 1 s window of misalignment is covered by the blocks' discarded seconds.
TOLERANCE_S = 1.0
# A hog pinned to a core the busy server also uses gets its fair share of that core:
# measured 0.49–0.50 of its seconds against one to three busy processes on this 2-core
# box (the kernel's autogroup gives the hog's own session half the core); without
# autogroup, k busy server threads leave it 1/(k+1). A quarter still shows CPU taken
# away; well below it the hog was starved (a cgroup quota, a real-time server) or gone.
MIN_HOG_CPU_FRACTION = 0.25


def _g(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _planned_at(rec: Mapping[str, Any]) -> float | None:
    at = _num(rec.get("at_s"))
    return at if at is not None else _num(rec.get("start_s"))


def _name(i: int, rec: Mapping[str, Any], block: Mapping[str, Any] | None) -> str:
    what = f"chaos[{i}] {rec.get('action')}"
    if block is not None:
        label = block.get("stage") or block.get("name") or "hog"
        return (
            f"{what} (hog block '{label}', {_g(_num(block['start_s']))}–"
            f"{_g(_num(block['end_s']))} s)"
        )
    at = _planned_at(rec)
    return f"{what} (planned at {_g(at)} s)" if at is not None else what


def _match_blocks(
    records: Sequence[Mapping[str, Any]],
    blocks: Sequence[Mapping[str, Any]],
    run_end: float,
    tolerance_s: float,
) -> tuple[dict[int, Mapping[str, Any]], list[str]]:
    """Pair each reached hog block with the cpu_hog record planned (or started) in it."""
    matched: dict[int, Mapping[str, Any]] = {}
    reasons: list[str] = []
    for b in blocks:
        lo, hi = float(b["start_s"]), float(b["end_s"])
        if lo >= run_end:
            continue  # the run ended before this block: nothing is judged there
        cands = [
            (abs(at - lo), i)
            for i, c in enumerate(records)
            if c.get("action") == "cpu_hog"
            and i not in matched
            and (at := _planned_at(c)) is not None
            and lo - tolerance_s <= at < hi
        ]
        if not cands:
            label = b.get("stage") or b.get("name") or "hog"
            reasons.append(
                f"hog block '{label}' ({_g(lo)}–{_g(hi)} s) has no cpu_hog record: no hog "
                "ran in it, so the contention checks would compare a baseline with a "
                "baseline — check that the chaos timeline started (a SUT to act on: "
                "--sut-pid or --sut-cmd) and rerun"
            )
            continue
        matched[min(cands)[1]] = b
    return matched, reasons


def _plan(rec: Mapping[str, Any], block: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """When the event should have held: its contention block, else ``at_s`` (or, in
    records without it, the real start: then only the length is judged) + duration."""
    if block is not None:
        return float(block["start_s"]), float(block["end_s"])
    at = _planned_at(rec)
    dur = _num((rec.get("params") or {}).get("duration_s"))
    return (at, at + dur) if at is not None and dur is not None else None


def _timing(
    name: str,
    rec: Mapping[str, Any],
    plan: tuple[float, float] | None,
    run_end: float,
    tolerance_s: float,
    may_overrun: bool,
) -> str | None:
    """Did the event run when planned (within the tolerance)?"""
    start, end = _num(rec.get("start_s")), _num(rec.get("end_s"))
    if start is None or end is None:
        return (
            f"{name} has no start or end time (start_s {rec.get('start_s')}, end_s "
            f"{rec.get('end_s')}): it was never undone, so when the chaos held is unknown "
            "— rerun"
        )
    if plan is None:
        return None
    lo, hi = plan
    late = start - lo
    short = min(hi, run_end) - end
    over = end - hi
    if (
        late > tolerance_s
        or -late > tolerance_s
        or short > tolerance_s
        or (over > tolerance_s and not may_overrun)
    ):
        why = (rec.get("detail") or {}).get("interrupted")
        return (
            f"{name} ran {_g(start)}–{_g(end)} s, not within {_g(tolerance_s)} s of its "
            f"plan {_g(lo)}–{_g(hi)} s"
            + (f" (interrupted: {why})" if why else "")
            + ": the checks would judge windows without the chaos as if under it, or "
            "the reverse — find what delayed the timeline and rerun"
        )
    return None


def _hog_evidence(name: str, rec: Mapping[str, Any], min_cpu_fraction: float) -> list[str]:
    params = rec.get("params") or {}
    detail = rec.get("detail") or {}
    cores = params.get("cores")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        return [f"{name} has no core count in its params ({cores!r}): nothing to verify"]
    pids = detail.get("pids") or []
    if len(pids) != cores:
        return [
            f"{name} started {len(pids)} hog process(es) for {cores} core(s) asked: "
            "the server kept CPU the experiment meant to take — rerun"
        ]
    out: list[str] = []
    pin = params.get("pin")
    asked = [pin[i % len(pin)] for i in range(cores)] if pin else [None] * cores
    used = detail.get("cores_used")
    if used is None or list(used) != asked:
        out.append(
            f"{name} ran its hogs on cores {used} instead of {asked}: the CPU taken was "
            "not the server's — check cpu_hog.pin and the SUT's cores"
        )
    affinity = detail.get("affinity")
    if affinity is not None and pin:
        wrong = [
            (pid, a)
            for pid, a, c in zip(pids, affinity, asked, strict=False)
            if a is not None and list(a) != [c]
        ]
        if wrong:
            out.append(
                f"{name}: hog(s) ran with affinity {wrong} (pid, cores) instead of one "
                f"core each of {asked}: the hog did not pin itself — rerun"
            )
    cpu = detail.get("hog_cpu_s")
    start, end = _num(rec.get("start_s")), _num(rec.get("end_s"))
    if cpu is None or len(cpu) != cores or any(_num(c) is None for c in cpu):
        out.append(
            f"{name} has no CPU time for every hog at its end (hog_cpu_s {cpu}): a hog "
            "that had already exited never proved it ran — rerun"
        )
    elif start is not None and end is not None:
        given = max(0.0, end - start) * cores
        used_s = sum(float(c) for c in cpu)
        if given > 0 and used_s < min_cpu_fraction * given:
            out.append(
                f"{name}: the hogs used {_g(used_s)} CPU-s of the {_g(end - start)} s × "
                f"{cores} core(s) they ran ({used_s / given:.0%} < {min_cpu_fraction:.0%}): "
                "they took little CPU from the server — a cgroup quota or a higher "
                "priority starving them, or a server sharing its session with other busy "
                "processes (the kernel's autogroup then leaves a hog a small share): start "
                "the server in a session of its own (setsid), as --sut-cmd does"
            )
    return out


def _pause_evidence(name: str, rec: Mapping[str, Any]) -> list[str]:
    detail = rec.get("detail") or {}
    pids = list(detail.get("pids") or [])
    if not pids:
        return [f"{name} signalled no process (detail.pids empty): the server was not there"]
    out = []
    for key, when in (("stopped", "once the stop landed"), ("still_stopped", "before SIGCONT")):
        seen = detail.get(key)
        missing = pids if seen is None else [p for p in pids if p not in seen]
        if missing:
            out.append(
                f"{name}: pid(s) {missing} not seen stopped (state T in /proc/<pid>/stat) "
                f"{when}: the server kept running through the pause — something continued "
                "it, or the stop never landed"
            )
    return out


def _kill_evidence(name: str, rec: Mapping[str, Any]) -> list[str]:
    params = rec.get("params") or {}
    detail = rec.get("detail") or {}
    if detail.get("found") is not True:
        return [
            f"{name} found no running process {detail.get('old_pid')} to signal "
            f"(found = {detail.get('found')}): there was nothing to kill — rerun"
        ]
    out = []
    if detail.get("gone") is not True:
        out.append(
            f"{name}: process {detail.get('old_pid')} did not exit after "
            f"{params.get('signal', 'the signal')} (gone = {detail.get('gone')}): the "
            "server never went down"
        )
    out += _restart_evidence(name, params, detail)
    return out


def _restart_evidence(name: str, params: Mapping[str, Any], detail: Mapping[str, Any]) -> list[str]:
    """A restart asked for (kill, terminate) must have a new process that became ready."""
    if params.get("restart", False) and (
        detail.get("new_pid") is None or detail.get("time_to_ready_s") is None
    ):
        return [
            f"{name} has no restarted process that became ready (new_pid "
            f"{detail.get('new_pid')}, time_to_ready_s {detail.get('time_to_ready_s')})"
        ]
    return []


def _terminate_evidence(name: str, rec: Mapping[str, Any]) -> list[str]:
    params = rec.get("params") or {}
    detail = rec.get("detail") or {}
    if detail.get("found") is not True:
        return [
            f"{name} found no running process {detail.get('old_pid')} to send SIGTERM "
            f"(found = {detail.get('found')}): there was nothing to shut down — rerun"
        ]
    if detail.get("ignored") is True:
        return [
            f"{name}: process {detail.get('old_pid')} has SIGTERM set to SIG_IGN "
            "(/proc/<pid>/status SigIgn): the signal asked nothing of it, so no drain was "
            "exercised — find what sets SIG_IGN (a wrapper script, nohup) and rerun"
        ]
    out = []
    if detail.get("unready_s") is None and detail.get("exit_s") is None:
        out.append(
            f"{name}: process {detail.get('old_pid')} neither stopped answering ready nor "
            f"exited within {params.get('drain_timeout_s')} s of SIGTERM: no sign it got "
            "the signal (a supervisor in front of it, a signal handler that swallows it) "
            "— the shutdown checks would judge a server that never shut down"
        )
    out += _restart_evidence(name, params, detail)
    return out


def chaos_not_applied(
    scenario_result: Mapping[str, Any],
    *,
    tolerance_s: float = TOLERANCE_S,
    min_hog_cpu_fraction: float = MIN_HOG_CPU_FRACTION,
) -> list[str]:
    """Reasons the planned chaos did not (provably) happen; empty when it all did."""
    records: list[Mapping[str, Any]] = list(scenario_result.get("chaos") or [])
    blocks = [
        b
        for b in (scenario_result.get("contention") or {}).get("blocks") or []
        if b.get("kind") == "hog"
    ]
    run_end = _num(scenario_result.get("duration_s")) or math.inf
    matched, reasons = _match_blocks(records, blocks, run_end, tolerance_s)
    for i, rec in enumerate(records):
        block = matched.get(i)
        name = _name(i, rec, block)
        if rec.get("ok") is not True:
            reasons.append(
                f"{name} did not apply ({rec.get('error') or 'ok is not true'}): the "
                "checks would judge the server without the chaos they are about — fix "
                "the cause and rerun"
            )
            continue
        action = rec.get("action")
        plan = _plan(rec, block)
        # a restart waits for the server to be ready: the kill's end is late by design
        late = _timing(
            name, rec, plan, run_end, tolerance_s, may_overrun=action in ("kill", "terminate")
        )
        if late:
            reasons.append(late)
            continue
        if action == "cpu_hog":
            reasons += _hog_evidence(name, rec, min_hog_cpu_fraction)
        elif action == "pause":
            reasons += _pause_evidence(name, rec)
        elif action == "kill":
            reasons += _kill_evidence(name, rec)
        elif action == "terminate":
            reasons += _terminate_evidence(name, rec)
        elif action == "network":
            reasons += _network_evidence(name, rec)
    return reasons


# network: toxic → (counter that proves it acted, what it is)
_NETWORK_PROOF = {
    "latency": ("delay_s", "seconds of delay added"),
    "bandwidth": ("delay_s", "seconds of delay added"),
    "slicer": ("delay_s", "seconds of delay added"),
    "reset_peer": ("resets", "connections reset"),
    "timeout": ("held_chunks", "chunks held"),
}


def _network_evidence(name: str, rec: Mapping[str, Any]) -> list[str]:
    toxic = (rec.get("params") or {}).get("toxic")
    counters = (rec.get("detail") or {}).get("counters")
    if not isinstance(counters, Mapping):
        return [
            f"{name} has no count from the fault proxy of what its {toxic} toxic did "
            "(detail.counters): the proxy was gone or never asked — rerun"
        ]
    key, what = _NETWORK_PROOF.get(str(toxic), ("chunks_affected", "chunks affected"))
    got = _num(counters.get(key))
    if not got or got <= 0 or not _num(counters.get("chunks_affected")):
        return [
            f"{name}: the {toxic} toxic touched no traffic ({key} = {counters.get(key)}, "
            f"chunks affected {counters.get('chunks_affected')} of "
            f"{counters.get('chunks_seen')} seen): no {what}, so the server never met the "
            "fault — is the load going through the proxy, and is there traffic on its "
            "stream while it is on? Rerun"
        ]
    return []
