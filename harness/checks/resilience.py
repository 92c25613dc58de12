"""Resilience checks: what a freeze (SIGSTOP), a crash (SIGKILL + restart) and a rolling
shutdown (SIGTERM) do to the service, judged from the chaos records and the load.

Each check reads the scenario's first chaos record of its action (``pause``, ``kill``,
``terminate``). No such record, or one that did not apply, is a skip here — the validity
rule (harness.analysis.chaos_evidence) already makes such a run invalid, never a pass.
Thresholds and their reasoning: docs/checks.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.analysis.resilience import (
    EDGE,
    HELD_KINDS,
    MISANSWERED_KINDS,
    UNANSWERED_KINDS,
    Span,
    resource_steps,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.overload import _recovery
from harness.checks.registry import implements


def _event(result: Mapping[str, Any], action: str) -> Mapping[str, Any] | None:
    return next((c for c in result.get("chaos") or [] if c.get("action") == action), None)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _applied(rec: Mapping[str, Any] | None, r: Result, action: str) -> Check | None:
    """A skip when there is no applied ``action`` event to judge, else None."""
    if rec is None:
        return r.skipped(
            f"no {action} event in this run's chaos timeline: add a [[chaos]] action = "
            f'"{action}" (scenarios/{_SCENARIO[action]}.toml)'
        )
    if (
        rec.get("ok") is not True
        or _num(rec.get("start_s")) is None
        or _num(rec.get("end_s")) is None
    ):
        return r.skipped(
            f"the {action} event did not apply ({rec.get('error') or 'no start or end'}): "
            "nothing to judge (the run is invalid)"
        )
    return None


# Requests sent this long before an event may still be in flight when it strikes (the
# healthy p99 at 0.5x is ~100 ms): their windows are not baseline.
IN_FLIGHT_S = 0.5

_SCENARIO = {"pause": "freeze", "kill": "crash_restart", "terminate": "rolling_shutdown"}


def _baseline_start(result: Mapping[str, Any], discard_s: float) -> float:
    """Where the baseline may start: after ``discard_s`` and the first stage's warm-up."""
    stages = d.stages(result)
    warm = float(stages[0].get("warmup_s") or 0.0) if stages else 0.0
    return max(discard_s, warm)


def _before(result: Mapping[str, Any], start: float) -> float:
    """The end of the baseline for an event starting at ``start``: the last window that
    ends ``IN_FLIGHT_S`` before it (a window the event began in — even 1 ms before its
    end — is not baseline, nor one whose requests were still in flight when it struck: a
    kill cuts them off; ``EDGE`` forgives the timeline's jitter)."""
    _, width = d.records.window_rows(result)
    return start - IN_FLIGHT_S - width * (1.0 - EDGE)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


# -- freeze --------------------------------------------------------------------------


@implements("freeze.recovery_s")
def freeze_recovery(result: Mapping[str, Any], r: Result) -> Check:
    rec = _event(result, "pause")
    if (skip := _applied(rec, r, "pause")) is not None:
        return skip
    assert rec is not None
    start, end = float(rec["start_s"]), float(rec["end_s"])
    lo = _baseline_start(result, float(r.params["discard_s"]))
    if lo >= start:
        return r.skipped(
            f"no baseline before the freeze at {fmt(start)} s (baseline from {fmt(lo)} s): "
            "start the pause later"
        )
    span = [(lo, _before(result, start))]
    return _recovery(result, r, f"freeze ({fmt(end - start)} s SIGSTOP)", start, end, span)


@implements("freeze.unanswered")
def freeze_unanswered(result: Mapping[str, Any], r: Result) -> Check:
    rec = _event(result, "pause")
    if (skip := _applied(rec, r, "pause")) is not None:
        return skip
    assert rec is not None
    start, end = float(rec["start_s"]), float(rec["end_s"])
    w = d.windows(result)
    if w is None:
        return r.skipped("no windowed counts were recorded")
    errors: dict[str, int] = {}
    sent = ok = 0
    for t, n, good, e in zip(w.t, w.n, w.ok, w.errors, strict=True):
        if t + w.width_s > start + 1e-9 and t < end - 1e-9:  # windows overlapping the freeze
            sent += n
            ok += good
            for k, v in e.items():
                errors[k] = errors.get(k, 0) + int(v)
    dropped = errors.pop("dropped", 0)
    reached = sent - dropped
    if reached <= 0:
        return r.skipped(
            f"no request was sent to the server during the freeze ({sent} sent, {dropped} "
            "dropped by the client's in-flight cap): nothing to judge — raise the rate"
        )
    lost = {k: errors.get(k, 0) for k in HELD_KINDS if errors.get(k)}
    wrong = {k: errors.get(k, 0) for k in MISANSWERED_KINDS if errors.get(k)}
    closed = errors.get("connection", 0)
    in_flight = int((d.counters(result) or {}).get("in_flight") or 0)
    value = sum(lost.values()) + sum(wrong.values()) + in_flight
    answered_err = sum(
        v for k, v in errors.items() if k not in lost and k not in wrong and k != "connection"
    )
    ok_ = r.compare(value)
    detail = (
        f"{value} of the {reached} requests sent during the freeze "
        f"({fmt(start)}–{fmt(end)} s) were held unanswered until the client's timeout or "
        f"answered wrongly (held: {lost or 0}, another's or a garbled answer: {wrong or 0}, "
        f"still in flight at the end: {in_flight}); {ok} answered ok, {answered_err} "
        f"answered with an error status, {closed} failed at once on a closed connection "
        f"(a keep-alive connection the server timed out as the freeze ended: failed, not "
        f"held), {dropped} not sent (client in-flight cap), {'<=' if ok_ else '>'} "
        f"{fmt(r.threshold)}"
    )
    if not ok_:
        detail += (
            " — the server lost requests it had accepted during the stall: look for a "
            "watchdog or timeout path that drops queued work without answering it"
        )
    return r.judged(value, ok_, detail, n=reached)


@implements("freeze.resource_step")
def freeze_resource_step(result: Mapping[str, Any], r: Result) -> Check:
    rec = _event(result, "pause")
    if (skip := _applied(rec, r, "pause")) is not None:
        return skip
    assert rec is not None
    start, end = float(rec["start_s"]), float(rec["end_s"])
    server = (result.get("server") or {}).get("series") or {}
    if not server.get("t"):
        return r.skipped("no server samples (no --sut-pid/--sut-cmd): nothing to compare")
    span_s = float(r.params["span_s"])
    lo = _baseline_start(result, float(r.params["discard_s"]))
    run_end = _num(result.get("duration_s")) or max(server["t"])
    before = Span("before", max(lo, start - span_s), start)
    settled = end + float(r.params["settle_s"])
    after = Span("after", settled, min(run_end, settled + span_s))
    steps = resource_steps(server, before, after)
    missing = [s.name for s in steps if s.step is None]
    if missing or after.length_s <= 0 or before.length_s <= 0:
        return r.skipped(
            f"no {', '.join(missing) or 'samples'} before ({fmt(before.start_s)}–"
            f"{fmt(before.end_s)} s) or after ({fmt(after.start_s)}–{fmt(after.end_s)} s) "
            "the freeze: lengthen the stages around it"
        )
    by = {s.name: s for s in steps}
    count_step = max(0.0, by["threads"].step or 0.0) + max(0.0, by["fds"].step or 0.0)
    rss_step = by["rss_mib"].step or 0.0
    rss_max = float(r.params["rss_max_mib"])
    passed = r.compare(count_step) and rss_step <= rss_max
    detail = (
        f"median before ({fmt(before.start_s)}–{fmt(before.end_s)} s) → settled after "
        f"({fmt(after.start_s)}–{fmt(after.end_s)} s): threads {fmt(by['threads'].before)} → "
        f"{fmt(by['threads'].after)}, non-socket fds {fmt(by['fds'].before)} → "
        f"{fmt(by['fds'].after)} (left behind: {fmt(count_step)}, limit "
        f"{fmt(r.threshold)}); RSS {fmt(by['rss_mib'].before)} → "
        f"{fmt(by['rss_mib'].after)} MiB ({rss_step:+.1f} MiB, limit +{fmt(rss_max)} MiB)"
    )
    if not passed:
        detail += (
            " — the stall left something behind: a recovery path that starts new threads "
            "or opens files without releasing the old ones"
        )
    return r.judged(round(count_step, 2), passed, detail, n=len(server["t"]))


# -- crash and restart ---------------------------------------------------------------


def _kill(result: Mapping[str, Any], r: Result) -> tuple[Mapping[str, Any] | None, Check | None]:
    rec = _event(result, "kill")
    if (skip := _applied(rec, r, "kill")) is not None:
        return None, skip
    assert rec is not None
    detail = rec.get("detail") or {}
    if _num(detail.get("time_to_ready_s")) is None:
        return None, r.skipped(
            "the killed server was not restarted (kill restart = false, or it never became "
            "ready): nothing after a restart to judge"
        )
    return rec, None


@implements("crash.recovery_s")
def crash_recovery(result: Mapping[str, Any], r: Result) -> Check:
    rec, skip = _kill(result, r)
    if skip is not None:
        return skip
    assert rec is not None
    start = float(rec["start_s"])
    lo = _baseline_start(result, float(r.params["discard_s"]))
    if lo >= start:
        return r.skipped(f"no baseline before the kill at {fmt(start)} s: kill it later")
    ready = (rec.get("detail") or {}).get("time_to_ready_s")
    check = _recovery(result, r, "SIGKILL", start, start, [(lo, _before(result, start))])
    # measured from the kill: the outage, the restart and the warm-up all count
    return dataclasses.replace(
        check,
        detail=f"restart: process start → ready {fmt(ready)} s, ready "
        f"{fmt(float(rec['end_s']) - start)} s after the kill; {check.detail}",
    )


def _after_ready(
    result: Mapping[str, Any], rec: Mapping[str, Any], span_s: float
) -> tuple[d.Windows | None, list[int]]:
    """The windows (and their indices) that start at or after the restart was ready,
    within ``span_s`` of it: a window straddling the ready moment holds requests sent
    while the server was still down or warming up, so it is left out."""
    w = d.windows(result)
    if w is None:
        return None, []
    ready_at = float(rec["end_s"])
    idx = [i for i, t in enumerate(w.t) if ready_at - 1e-9 <= t < ready_at + span_s - 1e-9]
    return w, idx


@implements("crash.errors_after_ready")
def crash_errors_after_ready(result: Mapping[str, Any], r: Result) -> Check:
    rec, skip = _kill(result, r)
    if skip is not None:
        return skip
    assert rec is not None
    span_s = float(r.params["span_s"])
    w, idx = _after_ready(result, rec, span_s)
    if w is None or not idx:
        return r.skipped(
            f"no windows in the {fmt(span_s)} s after the restart was ready at "
            f"{fmt(float(rec['end_s']))} s: lengthen the stage after the kill"
        )
    errors: dict[str, int] = {}
    for i in idx:
        for k, v in w.errors[i].items():
            errors[k] = errors.get(k, 0) + int(v)
    dropped = errors.pop("dropped", 0)
    sent = sum(w.n[i] for i in idx) - dropped
    if sent < int(r.params["min_requests"]):
        return r.skipped(
            f"only {sent} requests sent in the {fmt(span_s)} s after ready (< "
            f"{r.params['min_requests']}): too few to judge an error rate — raise the rate"
        )
    failed = sum(errors.values())
    rate = failed / sent
    ok_ = r.compare(rate)
    detail = (
        f"{failed} of the {sent} requests sent in the {fmt(span_s)} s after the restarted "
        f"server said ready (at {fmt(float(rec['end_s']))} s) failed ({_pct(rate)} "
        f"{'<=' if ok_ else '>'} {_pct(float(r.threshold))}; by kind {errors or 'none'})"
    )
    if not ok_:
        detail += (
            " — the error burst outlived the outage: readiness said yes before the server "
            "could serve (a model still loading, a cache still empty)"
        )
    return r.judged(round(rate, 5), ok_, detail, n=sent)


@implements("crash.cold_penalty")
def crash_cold_penalty(result: Mapping[str, Any], r: Result) -> Check:
    rec, skip = _kill(result, r)
    if skip is not None:
        return skip
    assert rec is not None
    start = float(rec["start_s"])
    span_s = float(r.params["span_s"])
    w, idx = _after_ready(result, rec, span_s)
    lo = _baseline_start(result, float(r.params["discard_s"]))
    if w is None or not idx:
        return r.skipped(
            f"no windows in the {fmt(span_s)} s after the restart was ready: lengthen the "
            "stage after the kill"
        )
    hi = _before(result, start)
    base = [p for t, p in zip(w.t, w.p99_ms, strict=True) if lo <= t < hi and p is not None]
    if not base:
        return r.skipped(f"no baseline windows before the kill at {fmt(start)} s")
    baseline = float(np.median(base))
    after = [w.p99_ms[i] for i in idx]
    # a window where nothing was answered ok is as bad as the worst answered one
    answered = [p for p in after if p is not None]
    if not answered:
        return r.judged(
            None,
            False,
            f"no request sent in the {fmt(span_s)} s after ready was answered ok — the "
            "restarted server could not serve at all",
            n=len(idx),
        )
    worst = max(answered)
    ratio = worst / baseline if baseline > 0 else math.inf
    excess = worst - baseline
    min_excess = float(r.params["min_excess_ms"])
    ok_ = r.compare(ratio) or excess <= min_excess
    detail = (
        f"worst windowed p99 in the {fmt(span_s)} s after the restart was ready "
        f"{fmt(worst)} ms vs the warm p99 before the kill {fmt(baseline)} ms = "
        f"{fmt(ratio)}x ({'<=' if r.compare(ratio) else '>'} {fmt(r.threshold)}x; excess "
        f"{fmt(excess)} ms, forgiven up to {fmt(min_excess)} ms)"
    )
    if not ok_:
        detail += (
            " — the first requests after a restart pay for initialisation the restart "
            "skipped (a lazy model load, a JIT, an empty cache): warm up before ready"
        )
    return r.judged(round(ratio, 3), ok_, detail, n=len(idx))


# -- rolling shutdown ----------------------------------------------------------------


@implements("shutdown.lost")
def shutdown_lost(result: Mapping[str, Any], r: Result) -> Check:
    rec = _event(result, "terminate")
    if (skip := _applied(rec, r, "terminate")) is not None:
        return skip
    assert rec is not None
    at = _num(rec.get("at_s"))
    name = str(r.params["before_stage"])
    stages = d.stages(result)
    if not name:
        # the stage that ends where the SIGTERM was planned: every request of it was
        # sent before the signal, whatever the window width
        name = next(
            (
                str(s["name"])
                for s in stages
                if at is not None and abs(float(s["end_s"]) - at) < 1e-6
            ),
            "",
        )
    if not name or d.stage(result, name) is None:
        return r.skipped(
            f"no stage ends at the SIGTERM (planned at {fmt(at)} s): end a stage exactly "
            "at the terminate event's at_s (or name it: before_stage), so the requests sent "
            "before the signal are known exactly"
        )
    c = d.counters(result, stage_names=[name])
    if c is None or not c.get("scheduled"):
        return r.skipped(f"no request recorded in stage {name!r}")
    failed = c.get("failed") or {}
    lost = {k: int(failed.get(k, 0)) for k in (*UNANSWERED_KINDS, *MISANSWERED_KINDS)}
    lost = {k: v for k, v in lost.items() if v}
    in_flight = int(c.get("in_flight") or 0)
    value = sum(lost.values()) + in_flight
    sent = int(c["scheduled"]) - int(c.get("dropped") or 0)
    detail_rec = rec.get("detail") or {}
    ok_ = r.compare(value)
    detail = (
        f"{value} of the {sent} requests sent before SIGTERM (stage {name!r}) were never "
        f"answered (by kind {lost or 'none'}, still in flight {in_flight}); {c.get('ok')} "
        f"ok, {sum(int(v) for v in failed.values()) - sum(lost.values())} answered with an "
        f"error status; the server stopped saying ready "
        f"{fmt(_num(detail_rec.get('unready_s')))} s and exited "
        f"{fmt(_num(detail_rec.get('exit_s')))} s after the signal"
    )
    if not ok_:
        detail += (
            " — the server dropped requests it had accepted: on SIGTERM, stop accepting, "
            "answer what is in flight, then exit"
        )
    return r.judged(value, ok_, detail, n=sent)


@implements("shutdown.exit_s")
def shutdown_exit(result: Mapping[str, Any], r: Result) -> Check:
    rec = _event(result, "terminate")
    if (skip := _applied(rec, r, "terminate")) is not None:
        return skip
    assert rec is not None
    det = rec.get("detail") or {}
    params = rec.get("params") or {}
    exit_s = _num(det.get("exit_s"))
    code = det.get("exit_code")
    drain = _num(params.get("drain_timeout_s"))
    if exit_s is None and det.get("cut_short"):
        return r.skipped(
            f"the run ended before the server exited and before the {fmt(drain)} s drain "
            "timeout: its exit was not observed — lengthen the stage after the SIGTERM beyond "
            "drain_timeout_s"
        )
    if exit_s is None:
        return r.judged(
            None,
            False,
            f"the server did not exit within the drain timeout ({fmt(drain)} s) after "
            f"SIGTERM and was SIGKILLed (it stopped saying ready after "
            f"{fmt(_num(det.get('unready_s')))} s) — something keeps the process alive "
            "after the drain: a non-daemon thread, a child process, a blocking atexit hook",
            n=1,
        )
    in_time = r.compare(exit_s)
    code_ok = code == 0 or code is None
    passed = in_time and code_ok
    detail = (
        f"exited {fmt(exit_s)} s after SIGTERM ({'<=' if in_time else '>'} "
        f"{fmt(r.threshold)} s) with exit code "
        f"{code if code is not None else 'unknown (attached server)'}; stopped saying "
        f"ready after {fmt(_num(det.get('unready_s')))} s"
    )
    if not code_ok:
        detail += (
            f" — exit code {code}: an orchestrator counts a non-zero exit on SIGTERM as a "
            "crash (restarts, alerts); exit 0 after a clean drain"
        )
    elif not in_time:
        detail += " — the drain took longer than the orchestrator's grace period allows"
    return r.judged(round(exit_s, 3), passed, detail, n=1)
