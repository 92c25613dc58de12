"""Conditions under which a run judges nothing (STYLE habit 9).

Each function returns None when the condition is fine, or one sentence with numbers
saying what went wrong and what to do. They take plain series and counters; pulling
them out of a scenario result is ``harness.checks.validity``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.analysis.percentiles import percentile_ms


def longest_run_above(
    t_s: Sequence[float], values: Sequence[float | None], threshold: float
) -> tuple[float, int]:
    """Longest stretch (seconds, samples) of consecutive samples ``>= threshold``.

    A stretch of k samples spans from its first to one interval past its last sample, so
    a single tick counts as one interval, not zero.
    """
    t = np.asarray(t_s, dtype=float)
    if len(t) == 0:
        return 0.0, 0
    interval = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    best_s, best_k = 0.0, 0
    start: int | None = None
    for i, v in enumerate(values):
        above = v is not None and math.isfinite(v) and v >= threshold
        if above and start is None:
            start = i
        if start is not None and (not above or i == len(t) - 1):
            last = i if above else i - 1
            span = float(t[last] - t[start]) + interval
            if span > best_s:
                best_s, best_k = span, last - start + 1
            start = None
    return best_s, best_k


def sustained_level(
    t_s: Sequence[float], values: Sequence[float | None], sustain_s: float
) -> float | None:
    """The highest level the series held for ``sustain_s``: the largest L for which
    ``longest_run_above(t_s, values, L)`` spans ``sustain_s`` or more (so
    ``loadgen_saturated`` fires exactly when this reaches its ``max_pct``). None when no
    stretch is that long. A missing sample breaks a stretch, as it does there.
    """
    t = np.asarray(t_s, dtype=float)
    if len(t) == 0:
        return None
    interval = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    v = [x if x is not None and math.isfinite(x) else -math.inf for x in values]
    best: float | None = None
    j = 0
    for i in range(len(t)):
        j = max(j, i)
        while j < len(t) and float(t[j] - t[i]) + interval < sustain_s:
            j += 1
        if j == len(t):
            break  # no later window is long enough either
        level = min(v[i : j + 1])
        if level > -math.inf and (best is None or level > best):
            best = level
    return best


def loadgen_saturated(
    t_s: Sequence[float],
    cpu_pct: Sequence[float | None],
    *,
    max_pct: float = 90.0,
    sustain_s: float = 5.0,
) -> str | None:
    """The load generator's CPU was ``>= max_pct`` for ``sustain_s`` or longer."""
    span, k = longest_run_above(t_s, cpu_pct, max_pct)
    if span >= sustain_s:
        peak = max(float(v) for v in cpu_pct if v is not None and math.isfinite(v))
        return (
            f"load generator CPU >= {max_pct:g} % for {span:.0f} s in a row ({k} samples, "
            f"peak {peak:.0f} %): the generator, not the server, was the bottleneck — "
            "lower the rate or add Locust workers (--processes)"
        )
    return None


def dispatch_lag_excessive(
    lag_hist: HdrHistogram | None, slo_ms: float, *, max_fraction: float = 0.1
) -> str | None:
    """Open-loop dispatch lag p99 above ``max_fraction`` of the latency SLO."""
    if lag_hist is None or lag_hist.get_total_count() == 0:
        return None
    p99 = percentile_ms(lag_hist, 99.0)
    limit = max_fraction * slo_ms
    if p99 is not None and p99 > limit:
        return (
            f"dispatch lag p99 {p99:.1f} ms > {limit:.1f} ms ({max_fraction:.0%} of the "
            f"{slo_ms:g} ms SLO, n={lag_hist.get_total_count()}): requests left late, so "
            "latencies are not the server's — lower the rate or add Locust workers"
        )
    return None


def sampler_gaps(
    t_s: Sequence[float],
    *,
    interval_s: float,
    ticks: int | None = None,
    missed_ticks: int | None = None,
    max_missed_frac: float = 0.05,
    max_gap_intervals: float = 5.0,
) -> str | None:
    """The server sampler missed too many ticks, or left a hole that could hide a spike."""
    problems: list[str] = []
    if missed_ticks is not None and ticks is not None:
        expected = ticks + missed_ticks
        if expected > 0 and missed_ticks / expected > max_missed_frac:
            problems.append(
                f"missed {missed_ticks} of {expected} ticks "
                f"({missed_ticks / expected:.1%} > {max_missed_frac:.0%})"
            )
    t = np.asarray(t_s, dtype=float)
    if len(t) > 1 and interval_s > 0:
        gap = float(np.max(np.diff(t)))
        if gap > max_gap_intervals * interval_s:
            problems.append(
                f"a {gap:.1f} s gap between samples (> {max_gap_intervals:g} x the "
                f"{interval_s:g} s interval)"
            )
    if problems:
        return (
            "server sampler: "
            + "; ".join(problems)
            + " — the box was too busy to sample; rerun with fewer parallel jobs or a "
            "longer --interval"
        )
    return None


def accounting_imbalance(counters: Mapping[str, object]) -> int:
    """scheduled − (ok + Σfailed + dropped + in_flight); 0 when every request is accounted."""
    failed = counters.get("failed") or {}
    if not isinstance(failed, Mapping):
        raise TypeError(f"counters.failed must be a mapping, got {type(failed).__name__}")
    total = (
        int(counters.get("ok", 0) or 0)
        + sum(int(v) for v in failed.values())
        + int(counters.get("dropped", 0) or 0)
        + int(counters.get("in_flight", 0) or 0)
    )
    return int(counters.get("scheduled", 0) or 0) - total


def accounting_unbalanced(counters: Mapping[str, object], where: str = "run") -> str | None:
    diff = accounting_imbalance(counters)
    if diff:
        return (
            f"request accounting does not balance for the {where}: scheduled "
            f"{counters.get('scheduled')} != ok + failed + dropped + in_flight "
            f"(off by {diff:+d}) — a harness defect; report it with results.json"
        )
    return None
