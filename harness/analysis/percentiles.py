"""Percentiles from HDR histograms, with their sample size and confidence.

Histograms, their codec and the percentile rule (nearest rank over the recorded counts,
so a p99 always names a latency some request really had, to HDR precision) are
``harness.analysis.hdr``'s; this module adds what a percentile is worth.

Two kinds of confidence:

* ``percentile_ci`` — a distribution-free confidence interval for a quantile from order
  statistics: the number of samples at or below the true quantile is Binomial(n, q), so
  ranks (l, u) with P(l ≤ B < u) ≥ confidence bound it. Nothing is assumed about the
  latency distribution.
* ``slo_assessment`` — MLPerf LoadGen's early-stopping rule: with ``overs`` of ``n``
  requests above the SLO, the p-th percentile is under the SLO with the given confidence
  only if P(Binomial(n, 1 − q) ≤ overs) ≤ 1 − confidence. At q = 0.99 and confidence 0.99
  this needs n ≥ 459 with none over, 662 with one, 1307 with five. Below that the verdict
  is "insufficient", never a pass.

Requests that got no good answer (failed, timed out, dropped at the client's cap) have no
latency in the histogram but did not meet any SLO. ``percentile_with_failures_ms`` and
``slo_assessment(..., failed=k)`` rank them above every success (an SLO-attainment, or
goodput, view), so a server cannot pass a p99 by failing its slowest requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from hdrh.histogram import HdrHistogram

# The binomial functions scipy.stats.binom itself calls (Boost's, in scipy.special), without
# the second scipy.stats takes to import — paid by every process that judges a run. A
# scipy that moved them falls back to scipy.stats: same numbers, slower start.
try:
    from scipy.special._ufuncs import _binom_cdf, _binom_ppf
except ImportError:  # pragma: no cover - depends on the installed scipy
    from scipy.stats import binom as _binom

    _binom_cdf, _binom_ppf = _binom.cdf, _binom.ppf

# new_histogram is re-exported: checks build their empty histograms from here.
from harness.analysis.hdr import (  # noqa: F401
    cumulative,
    nearest_rank,
    new_histogram,
    percentile_ms,
    value_at_rank_us,
)


def percentile_with_failures_ms(hist: HdrHistogram, percentile: float, failed: int) -> float | None:
    """The ``percentile`` over the ok latencies plus ``failed`` requests ranked above all.

    Nearest rank over n = ok + failed: a rank inside the failures is ``inf`` (the
    percentile is a failure, over any SLO); otherwise it is the ok latency at that rank,
    i.e. the ok-only percentile shifted up by the failures. None when n is 0.
    """
    if failed < 0:
        raise ValueError(f"failed must be >= 0, got {failed}")
    ok = hist.get_total_count()
    n = ok + failed
    if n == 0:
        return None
    rank = nearest_rank(n, percentile / 100.0)
    if rank > ok:
        return math.inf
    return value_at_rank_us(hist, rank) / 1000.0


def binom_cdf(k: float, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k): ``scipy.stats.binom.cdf``."""
    k = math.floor(k)
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(_binom_cdf(k, n, p))


def binom_ppf(q: float, n: int, p: float) -> int:
    """The smallest k with P(Binomial(n, p) <= k) >= q: ``scipy.stats.binom.ppf``."""
    if q <= 0.0:
        return -1
    if q >= 1.0:
        return n
    return min(max(int(_binom_ppf(q, n, p)), 0), n)


def count_above_ms(hist: HdrHistogram, limit_ms: float) -> int:
    """How many recorded values exceed ``limit_ms`` (to HDR precision)."""
    values, cum = cumulative(hist)
    if not values:
        return 0
    idx = int(np.searchsorted(np.asarray(values), limit_ms * 1000.0, side="right"))
    at_or_below = int(cum[idx - 1]) if idx > 0 else 0
    return int(cum[-1]) - at_or_below


def quantile_rank_ci(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """Order-statistic ranks (1-based) bounding the ``q`` quantile with ``confidence``.

    Two-sided, equal tails. ``None`` for a bound that ``n`` samples cannot give: the
    upper bound is missing when too few samples lie above the quantile (a p99 from 100
    samples has no upper confidence bound).
    """
    if n <= 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    # B = number of samples <= true quantile ~ Binomial(n, q).
    # P(X_(l) <= xi) = P(B >= l); choose l with P(B <= l - 1) <= tail.
    lower = binom_ppf(tail, n, q)
    if lower >= 1 and binom_cdf(lower - 1, n, q) > tail:
        lower -= 1
    # P(X_(u) >= xi) = P(B <= u - 1); choose u with P(B >= u) <= tail.
    upper = binom_ppf(1.0 - tail, n, q) + 1
    return (lower if lower >= 1 else None), (upper if upper <= n else None)


@dataclass(frozen=True)
class PercentileEstimate:
    percentile: float  # 0–100
    value_ms: float | None
    n: int
    confidence: float
    ci_low_ms: float | None
    ci_high_ms: float | None


def percentile_ci(
    hist: HdrHistogram, percentile: float = 99.0, confidence: float = 0.95
) -> PercentileEstimate:
    """A percentile with its distribution-free confidence interval."""
    n = hist.get_total_count()
    if n == 0:
        return PercentileEstimate(percentile, None, 0, confidence, None, None)
    q = percentile / 100.0
    lo, hi = quantile_rank_ci(n, q, confidence)
    return PercentileEstimate(
        percentile=percentile,
        value_ms=value_at_rank_us(hist, nearest_rank(n, q)) / 1000.0,
        n=n,
        confidence=confidence,
        ci_low_ms=None if lo is None else value_at_rank_us(hist, lo) / 1000.0,
        ci_high_ms=None if hi is None else value_at_rank_us(hist, hi) / 1000.0,
    )


def early_stopping_min_n(overs: int, q: float = 0.99, confidence: float = 0.99) -> int:
    """Fewest requests with ``overs`` of them above the SLO that show p(q) ≤ SLO.

    The general MLPerf rule: the smallest n with P(Binomial(n, 1 − q) ≤ overs) ≤
    1 − confidence. Found by doubling then bisection (the tail shrinks as n grows).
    """
    if overs < 0:
        raise ValueError(f"overs must be >= 0, got {overs}")
    alpha = 1.0 - confidence

    def enough(n: int) -> bool:
        return binom_cdf(overs, n, 1.0 - q) <= alpha

    lo, hi = overs, max(overs + 1, 2)
    while not enough(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class SloAssessment:
    """Is the ``percentile`` of a histogram within ``slo_ms``, and how sure are we."""

    verdict: Literal["pass", "fail", "insufficient"]
    value_ms: float | None  # point estimate of the percentile (inf: a failure)
    n: int  # ok latencies + failed requests
    overs: int  # requests above the SLO, failed ones included
    min_n: int  # requests needed for a confident pass given ``overs``
    percentile: float
    confidence: float
    failed: int = 0  # of ``n`` and ``overs``: requests with no good answer


def slo_assessment(
    hist: HdrHistogram,
    slo_ms: float,
    percentile: float = 99.0,
    confidence: float = 0.99,
    failed: int = 0,
) -> SloAssessment:
    """Judge ``p(percentile) <= slo_ms`` with MLPerf's early-stopping rule.

    ``failed`` requests (no good answer: failed, timed out, dropped) count in n and as
    over the SLO, ranked above every ok latency (``percentile_with_failures_ms``).

    * fail — the point estimate is above the SLO (with at least the samples a
      zero-over pass would need, so a handful of slow first requests cannot fail it);
    * pass — the point estimate is within the SLO and n meets the early-stopping bound;
    * insufficient — otherwise (too few samples to say either way).
    """
    n = hist.get_total_count() + failed
    q = percentile / 100.0
    overs = count_above_ms(hist, slo_ms) + failed
    min_n = early_stopping_min_n(overs, q, confidence)
    value = percentile_with_failures_ms(hist, percentile, failed)
    floor_n = early_stopping_min_n(0, q, confidence)
    if value is not None and value > slo_ms and n >= floor_n:
        verdict: Literal["pass", "fail", "insufficient"] = "fail"
    elif value is not None and value <= slo_ms and n >= min_n:
        verdict = "pass"
    else:
        verdict = "insufficient"
    return SloAssessment(verdict, value, n, overs, min_n, percentile, confidence, failed)
