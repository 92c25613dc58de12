"""Degradation under contention and whether overload is answered fast.

Blocks alternate with and without CPU hogs; the first seconds of each block are
discarded (the scheduler and the server's queue need a moment to settle), and blocks
are compared by the ratio of medians of a per-window metric (throughput, latency).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.analysis.percentiles import value_at_rank_us

# Answers that shed load on purpose versus signs that the server did not answer in time.
QUICK_KINDS: tuple[str, ...] = ("http_503", "http_429")
SLOW_KINDS: tuple[str, ...] = ("timeout", "connection")


@dataclass(frozen=True)
class Block:
    kind: str
    start_s: float
    end_s: float


def block_values(
    t_s: Sequence[float],
    values: Sequence[float | None],
    blocks: Sequence[Block],
    discard_s: float,
    width_s: float = 0.0,
) -> np.ndarray:
    """Values of windows lying inside any block after its first ``discard_s`` seconds."""
    out: list[float] = []
    for t, v in zip(t_s, values, strict=True):
        if v is None or not math.isfinite(v):
            continue
        for b in blocks:
            if b.start_s + discard_s <= t and t + width_s <= b.end_s + 1e-9:
                out.append(float(v))
                break
    return np.asarray(out, dtype=float)


@dataclass(frozen=True)
class Degradation:
    ratio: float | None  # median(test) / median(baseline)
    baseline_median: float | None
    test_median: float | None
    n_baseline: int  # windows used
    n_test: int


def degradation_ratio(
    t_s: Sequence[float],
    values: Sequence[float | None],
    baseline: Sequence[Block],
    test: Sequence[Block],
    *,
    discard_s: float = 5.0,
    width_s: float = 0.0,
) -> Degradation:
    """Ratio of medians of ``values`` in ``test`` blocks over ``baseline`` blocks."""
    base = block_values(t_s, values, baseline, discard_s, width_s)
    hog = block_values(t_s, values, test, discard_s, width_s)
    mb = float(np.median(base)) if len(base) else None
    mt = float(np.median(hog)) if len(hog) else None
    ratio = None if mb is None or mt is None or mb == 0 else mt / mb
    return Degradation(ratio, mb, mt, len(base), len(hog))


@dataclass(frozen=True)
class FailFast:
    quick: int  # 503/429: shed on purpose
    slow: int  # timeouts, resets, and (optionally) requests dropped at the in-flight cap
    other: int  # other failures (500s, integrity), neither quick nor slow
    quick_share: float | None  # quick / (quick + slow); None when neither happened
    reject_p50: RejectBounds | None  # bounds on the median 503/429 time


def fail_fast(
    errors: Mapping[str, int],
    *,
    dropped: int = 0,
    count_dropped_as_slow: bool = True,
    reject_p50: RejectBounds | None = None,
    quick_kinds: Sequence[str] = QUICK_KINDS,
    slow_kinds: Sequence[str] = SLOW_KINDS,
) -> FailFast:
    """Classify failures: quick rejections versus slow failures.

    Requests dropped because the client's in-flight cap was full count as slow by
    default: a server that sheds fast never lets in-flight requests pile up to the cap.
    """
    quick = sum(int(errors.get(k, 0)) for k in quick_kinds)
    slow = sum(int(errors.get(k, 0)) for k in slow_kinds)
    if count_dropped_as_slow:
        slow += int(dropped)
    other = sum(int(v) for k, v in errors.items() if k not in quick_kinds and k not in slow_kinds)
    share = quick / (quick + slow) if quick + slow else None
    return FailFast(quick, slow, other, share, reject_p50)


@dataclass(frozen=True)
class RejectBounds:
    """Where the median time of the quick rejections lies: ``low_ms <= median <= high_ms``."""

    low_ms: float
    high_ms: float

    def at_most(self, limit_ms: float) -> bool | None:
        """True: the median is shown <= ``limit_ms``; False: shown above it; None: the
        bounds straddle the limit and the histogram cannot tell."""
        if self.high_ms <= limit_ms:
            return True
        if self.low_ms > limit_ms:
            return False
        return None


def quick_rejection_bounds_ms(error_hist: HdrHistogram | None, n_quick: int) -> RejectBounds | None:
    """Sound bounds on the median time of ``n_quick`` quick rejections (503/429) when the
    results keep only one histogram of *all* the run's failure times (N values).

    The rejections judged (those of the spike or hog window) are ``n_quick`` of the N;
    the rest are other kinds (timeouts, resets, 500s) or failures elsewhere in the run.
    With m the ⌈n_quick/2⌉-th fastest rejection (their median) and x₍ᵣ₎ the r-th fastest
    of all N failures:

    * ``x₍⌈n_quick/2⌉₎ <= m`` — the ⌈n_quick/2⌉ fastest rejections are failures, so at
      least that many failures are no slower than m;
    * ``m <= x₍N−⌊n_quick/2⌋₎`` — at most ⌊n_quick/2⌋ failures of any kind are slower than
      that value, so at least n_quick − ⌊n_quick/2⌋ = ⌈n_quick/2⌉ rejections are not.

    A pass needs the upper bound within the limit; a fail, the lower bound above it.
    None when there is nothing to bound or the histogram holds fewer than ``n_quick``
    failures (it cannot contain them all). The lower bound is the lowest value of its
    HDR bucket, the upper the highest, so bucket rounding cannot flip a verdict.
    """
    if error_hist is None or n_quick <= 0:
        return None
    n = error_hist.get_total_count()
    if n < n_quick:
        return None
    lo_us = value_at_rank_us(error_hist, math.ceil(n_quick / 2))
    hi_us = value_at_rank_us(error_hist, n - n_quick // 2)
    low = error_hist.get_lowest_equivalent_value(lo_us)
    return RejectBounds(low / 1000.0, hi_us / 1000.0)
