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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.hdr import nearest_rank
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


# A thread "worked" before the freeze when it used at least BUSY_PCT % of a core on
# average there, and "did nothing" after it when no tick showed CPU (per-thread CPU comes
# in steps of one jiffy, 1 % of a 1 s tick).
BUSY_PCT = 5.0
IDLE_PCT = 0.5


def _abandoned(server: Mapping[str, Any], before: Span, after: Span) -> list[str]:
    """Threads (``name`` (tid)) that worked before the freeze and, still alive at the end
    of ``after``, did nothing in all of it: the work moved to another thread and this one
    was left behind (a respawned pool whose old one was never shut down). Read from the
    sampler's busiest threads (``threads_top``), which include any thread busy before."""
    out = []
    interval = float(server.get("interval_s") or 1.0)
    for th in server.get("threads_top") or []:
        s = th.get("series") or {}
        pts = [
            (float(t), float(c))
            for t, c in zip(s.get("t") or [], s.get("cpu_pct") or [], strict=False)
            if t is not None and c is not None
        ]
        pre = [c for t, c in pts if before.start_s <= t < before.end_s]
        post = [c for t, c in pts if after.start_s <= t < after.end_s]
        alive_to_end = any(t >= after.end_s - 2.0 * interval for t, _ in pts)
        busy_before = bool(pre) and float(np.mean(pre)) >= BUSY_PCT
        if busy_before and post and alive_to_end and max(post) <= IDLE_PCT:
            out.append(f"{th.get('name')} ({th.get('tid')})")
    return out


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
    # the run's last samples: a step that is still there is persistent, not a pool that
    # grew for the backlog and shrank again
    last = Span("end", max(settled, run_end - span_s), run_end + 1e-6)
    steps = resource_steps(server, before, after)
    at_end = {s.name: s for s in resource_steps(server, before, last)}
    missing = [s.name for s in steps if s.step is None]
    if missing or after.length_s <= 0 or before.length_s <= 0:
        return r.skipped(
            f"no {', '.join(missing) or 'samples'} before ({fmt(before.start_s)}–"
            f"{fmt(before.end_s)} s) or after ({fmt(after.start_s)}–{fmt(after.end_s)} s) "
            "the freeze: lengthen the stages around it"
        )
    by = {s.name: s for s in steps}

    def left(name: str) -> float:
        """What stayed: the step settled after the freeze and at the run's end (the
        smaller), never below 0."""
        ends = [x for x in (by[name].step, at_end[name].step) if x is not None]
        return max(0.0, min(ends))

    count_step = left("threads") + left("fds")
    count_before = (by["threads"].before or 0.0) + (by["fds"].before or 0.0)
    margin = max(float(r.threshold), float(r.params["rel_margin"]) * count_before)
    abandoned = (
        _abandoned(result.get("server") or {}, before, Span("idle", settled, run_end))
        if count_step >= 1
        else []
    )
    limit = 0.0 if abandoned else margin
    rss_step = by["rss_mib"].step or 0.0
    rss_max = float(r.params["rss_max_mib"])
    passed = count_step <= limit and rss_step <= rss_max
    detail = (
        f"median before ({fmt(before.start_s)}–{fmt(before.end_s)} s) → settled after "
        f"({fmt(after.start_s)}–{fmt(after.end_s)} s) → end ({fmt(last.start_s)}–"
        f"{fmt(run_end)} s): threads {fmt(by['threads'].before)} → "
        f"{fmt(by['threads'].after)} → {fmt(at_end['threads'].after)}, non-socket fds "
        f"{fmt(by['fds'].before)} → {fmt(by['fds'].after)} → {fmt(at_end['fds'].after)} "
        f"(left behind: {fmt(count_step)}, "
    )
    if abandoned:
        detail += (
            f"limit 0: {', '.join(abandoned)} worked before the freeze and did nothing "
            "after it while the count rose — its work moved to a new thread and it was "
            "left behind"
        )
    else:
        detail += (
            f"limit {fmt(margin)} = max({fmt(float(r.threshold))}, "
            f"{float(r.params['rel_margin']):.0%} of {fmt(count_before)})"
        )
    detail += (
        f"); RSS {fmt(by['rss_mib'].before)} → {fmt(by['rss_mib'].after)} MiB "
        f"({rss_step:+.1f} MiB, limit +{fmt(rss_max)} MiB)"
    )
    if not passed:
        detail += (
            " — the stall left something behind: a recovery path that starts new threads "
            "or opens files without releasing the old ones"
        )
    return r.judged(round(count_step, 2), passed, detail, n=len(server["t"]), threshold=limit)


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


# The quantiles a window row carries: (key, q) with q None for the maximum.
_ROW_QUANTILES = (("max_ms", None), ("p99_ms", 0.99), ("p90_ms", 0.90), ("p50_ms", 0.50))


def kth_slowest_bound_ms(rows: Sequence[Mapping[str, Any]], k: int) -> float | None:
    """A lower bound on the ``k``-th slowest ok latency among the requests of ``rows``
    (window summaries: ``ok`` answers and the nearest-rank p50/p90/p99/max of their
    latencies): the largest value ``x`` with at least ``k`` answers known to be ``>= x``.

    A row's p-th percentile ``v`` of ``m`` answers is the one at rank ⌈p·m⌉, so the
    ``m − ⌈p·m⌉ + 1`` answers ranked at or above it are ``>= v`` (its max: one). The
    bound is what the summaries prove; the true k-th slowest is at least this slow.
    None when the rows hold fewer than ``k`` answers."""
    per_row: list[list[tuple[float, int]]] = []
    for row in rows:
        m = int(row.get("ok") or 0)
        if m <= 0:
            continue
        pairs = []
        for key, q in _ROW_QUANTILES:
            v = _num(row.get(key))
            if v is not None:
                pairs.append((v, 1 if q is None else m - nearest_rank(m, q) + 1))
        per_row.append(pairs)
    for x in sorted({v for pairs in per_row for v, _ in pairs}, reverse=True):
        known = sum(max((c for v, c in pairs if v >= x), default=0) for pairs in per_row)
        if known >= k:
            return x
    return None


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
    after_ts = {w.t[i] for i in idx}
    rows = [row for row in d.records.window_rows(result)[0] if float(row["t"]) in after_ts]
    answered = sum(int(row.get("ok") or 0) for row in rows)
    if answered == 0:
        return r.judged(
            None,
            False,
            f"no request sent in the {fmt(span_s)} s after ready was answered ok — the "
            "restarted server could not serve at all",
            n=len(idx),
        )
    k = int(r.params["min_tail"])
    slow = kth_slowest_bound_ms(rows, k)
    if slow is None:
        return r.skipped(
            f"only {answered} requests sent in the {fmt(span_s)} s after ready were "
            f"answered ok: the {k}th slowest (what this check judges, so that no one or "
            "two requests decide it) does not exist — raise the rate or lengthen span_s",
            n=answered,
        )
    ratio = slow / baseline if baseline > 0 else math.inf
    excess = slow - baseline
    min_excess = float(r.params["min_excess_ms"])
    ok_ = r.compare(ratio) or excess <= min_excess
    detail = (
        f"the {k}th slowest of the {answered} requests answered in the {fmt(span_s)} s "
        f"after the restart was ready took >= {fmt(slow)} ms (a bound from the "
        f"{len(rows)} windows' p50/p90/p99/max) vs the warm p99 before the kill "
        f"{fmt(baseline)} ms = {fmt(ratio)}x ({'<=' if r.compare(ratio) else '>'} "
        f"{fmt(r.threshold)}x; excess {fmt(excess)} ms, forgiven up to {fmt(min_excess)} ms)"
    )
    if not ok_:
        detail += (
            " — the first requests after a restart pay for initialisation the restart "
            "skipped (a lazy model load, a JIT, an empty cache): warm up before ready"
        )
    return r.judged(round(ratio, 3), ok_, detail, n=answered)


# -- rolling shutdown ----------------------------------------------------------------


def _in_flight_at_signal(
    result: Mapping[str, Any], name: str, signal_s: float
) -> tuple[float, float, float] | None:
    """How many requests of stage ``name`` (all sent before the signal) are expected to
    have been in flight when the signal came at ``signal_s``: (expected count, the stage's
    answered rate in req/s, the mean time its requests still had to run at the signal in
    s). None when the stage answered nothing.

    A request sent ``u`` s before the stage's end with latency ``L`` was still in flight at
    the signal when ``L > u + gap`` (``gap``: signal − stage end). With arrivals at rate λ
    (Poisson or constant) and latencies drawn from the stage's own ok latencies, the count
    in flight is Poisson with mean λ · E[(L − gap)+] (Little's law for the tail of the
    stage). What is counted is an expectation: the load side does not record which
    request was open at the signal."""
    st = d.stage(result, name)
    c = d.counters(result, stage_names=[name])
    if st is None or c is None:
        return None
    secs = float(st["end_s"]) - float(st["start_s"])
    hist = d.histogram(result, stage_names=[name])
    n = hist.get_total_count()
    if n == 0 or secs <= 0:
        return None
    gap_us = max(0.0, signal_s - float(st["end_s"])) * 1e6
    left_us = sum(
        item.count_added_in_this_iter_step * max(0.0, item.value_iterated_to - gap_us)
        for item in hist.get_recorded_iterator()
    )
    rate = int(c.get("ok") or 0) / secs
    mean_left_s = left_us / n / 1e6
    return rate * mean_left_s, rate, mean_left_s


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
    signal_s = float(rec["start_s"])
    expected = _in_flight_at_signal(result, name, signal_s)
    min_open = float(r.params["min_in_flight"])
    tested = (
        f"~{fmt(expected[0])} requests expected in flight at the signal "
        f"({fmt(expected[1])} req/s answered × {fmt(expected[2] * 1000)} ms each still "
        "had to run)"
        if expected is not None
        else "no request of the stage was answered, so none is known to have been in "
        "flight at the signal"
    )
    ok_ = r.compare(value)
    if ok_ and (expected is None or expected[0] < min_open):
        # nothing lost, but nothing (or too little) was open when the signal came: the
        # drain was never asked to finish anything
        return r.skipped(
            f"drain not tested: no request was in flight at SIGTERM — {tested}, fewer "
            f"than {fmt(min_open)} (even at {fmt(min_open)} expected, none would be open "
            f"{math.exp(-min_open):.1%} of the time); {sent} requests sent before the "
            "signal, none lost — raise the rate",
            value=value,
            n=sent,
        )
    detail = (
        f"{value} of the {sent} requests sent before SIGTERM (stage {name!r}) were never "
        f"answered (by kind {lost or 'none'}, still in flight {in_flight}); {c.get('ok')} "
        f"ok, {sum(int(v) for v in failed.values()) - sum(lost.values())} answered with an "
        f"error status; {tested}; the server stopped saying ready "
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
    unready = fmt(_num(det.get("unready_s")))
    if exit_s is None and det.get("cut_short"):
        return r.skipped(
            f"the run ended before the server exited and before the {fmt(drain)} s drain "
            "timeout: its exit was not observed — lengthen the stage after the SIGTERM beyond "
            "drain_timeout_s"
        )
    if exit_s is None and (det.get("killed") is True or "exit_s" in det):
        # the terminate action watched the process until the drain timeout and it was
        # still running: the data says it never exited by itself
        return r.judged(
            None,
            False,
            f"the server did not exit within the drain timeout ({fmt(drain)} s) after "
            f"SIGTERM and was SIGKILLed (it stopped saying ready after {unready} s) — "
            "something keeps the process alive after the drain: a non-daemon thread, a "
            "child process, a blocking atexit hook",
            n=1,
        )
    if exit_s is None:
        return r.skipped(
            "the terminate record holds no exit time (written by a harness that did not "
            "time the exit): run the scenario again"
        )
    in_time = r.compare(exit_s)
    timing = (
        f"exited {fmt(exit_s)} s after SIGTERM ({'<=' if in_time else '>'} "
        f"{fmt(r.threshold)} s); stopped saying ready after {unready} s"
    )
    if not in_time:
        # too slow is a failure whatever the exit code was
        return r.judged(
            round(exit_s, 3),
            False,
            f"{timing}, exit code {code if isinstance(code, int) else 'unknown'} — the "
            "drain took longer than the orchestrator's grace period allows",
            n=1,
        )
    if not isinstance(code, int) or isinstance(code, bool):
        return r.skipped(
            f"{timing}, but its exit code is unknown: the server was attached by pid "
            "(neither the harness nor its agent started it), so nothing read how the "
            "process ended — an orchestrator counts a non-zero exit on SIGTERM as a "
            "crash; start the server with --sut-cmd to judge it",
            value=round(exit_s, 3),
            n=1,
        )
    passed = code == 0
    detail = f"{timing}; exit code {code}"
    if not passed:
        detail += (
            f" — exit code {code}: an orchestrator counts a non-zero exit on SIGTERM as a "
            "crash (restarts, alerts); exit 0 after a clean drain"
        )
    return r.judged(round(exit_s, 3), passed, detail, n=1)
