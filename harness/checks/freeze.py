"""Freeze checks: what a SIGSTOP of the server (the ``pause`` action) does to the service,
judged from the chaos record and the load.

Each check reads the scenario's first ``pause`` record (``chaos_records.py``). No such
record, or one that did not apply, is a skip here — the validity rule
(harness.analysis.chaos_evidence) already makes such a run invalid, never a pass.
Thresholds and their reasoning: docs/checks.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.analysis.resilience import (
    HELD_KINDS,
    MISANSWERED_KINDS,
    Span,
    resource_steps,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.chaos_records import (
    baseline_end,
    baseline_start,
    finite_number,
    first_event,
    skip_unless_applied,
)
from harness.checks.model import Check, Result
from harness.checks.overload import _recovery
from harness.checks.registry import implements


@implements("freeze.recovery_s")
def freeze_recovery(result: Mapping[str, Any], r: Result) -> Check:
    rec = first_event(result, "pause")
    if (skip := skip_unless_applied(rec, r, "pause")) is not None:
        return skip
    assert rec is not None
    start, end = float(rec["start_s"]), float(rec["end_s"])
    lo = baseline_start(result, float(r.params["discard_s"]))
    if lo >= start:
        return r.skipped(
            f"no baseline before the freeze at {fmt(start)} s (baseline from {fmt(lo)} s): "
            "start the pause later"
        )
    span = [(lo, baseline_end(result, start))]
    return _recovery(result, r, f"freeze ({fmt(end - start)} s SIGSTOP)", start, end, span)


@implements("freeze.unanswered")
def freeze_unanswered(result: Mapping[str, Any], r: Result) -> Check:
    rec = first_event(result, "pause")
    if (skip := skip_unless_applied(rec, r, "pause")) is not None:
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
    rec = first_event(result, "pause")
    if (skip := skip_unless_applied(rec, r, "pause")) is not None:
        return skip
    assert rec is not None
    start, end = float(rec["start_s"]), float(rec["end_s"])
    server = (result.get("server") or {}).get("series") or {}
    if not server.get("t"):
        return r.skipped("no server samples (no --sut-pid/--sut-cmd): nothing to compare")
    span_s = float(r.params["span_s"])
    lo = baseline_start(result, float(r.params["discard_s"]))
    run_end = finite_number(result.get("duration_s")) or max(server["t"])
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
