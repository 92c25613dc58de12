"""Crash checks: what a SIGKILL of the server and its restart (the ``kill`` action) do to
the service, judged from the chaos record and the load.

Each check reads the scenario's first ``kill`` record (``chaos_records.py``); one that did
not apply is a skip. Thresholds and their reasoning: docs/checks.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.hdr import nearest_rank
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.chaos_records import (
    baseline_end,
    baseline_start,
    finite_number,
    first_event,
    pct,
    skip_unless_applied,
)
from harness.checks.model import Check, Result
from harness.checks.overload import _recovery
from harness.checks.registry import implements


def _kill(result: Mapping[str, Any], r: Result) -> tuple[Mapping[str, Any] | None, Check | None]:
    rec = first_event(result, "kill")
    if (skip := skip_unless_applied(rec, r, "kill")) is not None:
        return None, skip
    assert rec is not None
    detail = rec.get("detail") or {}
    if finite_number(detail.get("time_to_ready_s")) is None:
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
    lo = baseline_start(result, float(r.params["discard_s"]))
    if lo >= start:
        return r.skipped(f"no baseline before the kill at {fmt(start)} s: kill it later")
    ready = (rec.get("detail") or {}).get("time_to_ready_s")
    check = _recovery(result, r, "SIGKILL", start, start, [(lo, baseline_end(result, start))])
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
        f"server said ready (at {fmt(float(rec['end_s']))} s) failed ({pct(rate)} "
        f"{'<=' if ok_ else '>'} {pct(float(r.threshold))}; by kind {errors or 'none'})"
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
            v = finite_number(row.get(key))
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
    lo = baseline_start(result, float(r.params["discard_s"]))
    if w is None or not idx:
        return r.skipped(
            f"no windows in the {fmt(span_s)} s after the restart was ready: lengthen the "
            "stage after the kill"
        )
    hi = baseline_end(result, start)
    base = [p for t, p in zip(w.t, w.p99_ms, strict=True) if lo <= t < hi and p is not None]
    if not base:
        return r.skipped(f"no baseline windows before the kill at {fmt(start)} s")
    baseline = float(np.median(base))
    after_ts = {w.t[i] for i in idx}
    rows = [row for row in d.readers.window_rows(result)[0] if float(row["t"]) in after_ts]
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
