"""Leak versus plateau.

Python's allocator returns arenas only when empty and glibc keeps per-thread arenas, so
one-off step-ups of RSS are normal; a leak is *sustained* growth. The detector:

1. drop a warm-up (``warmup_frac`` of the run, at least ``warmup_min_s``);
2. reduce to medians over buckets of ``bucket_s`` seconds (robust to spikes/sawtooth);
3. Theil–Sen slope b (units per minute) with a ``ci`` confidence interval, and a
   one-sided Mann–Kendall test for an increasing trend (p-value, ties handled), its
   variance corrected for autocorrelation (Hamed & Rao 1998); when the samples wander like
   a random walk (KPSS, below) the drift must also stand out against the walk's own steps;
4. LEAK when p < alpha, b > S, the CI's lower bound > S, and the second half's slope
   > S and ≥ ``second_half_ratio`` × the first half's (growth that is not slowing down);
   INCONCLUSIVE when p < alpha and b > S but another condition fails (extend the soak);
   PASS otherwise. INSUFFICIENT when fewer than ``min_buckets`` buckets remain.

The thread/fd variant adds "max of the last third > max of the middle third" (of the
bucket medians): a pool that grew once and stopped is not a leak.

Naive OLS or raw Mann–Kendall at p < 0.05 flagged a third of flat series in simulation —
which is why every condition above is needed.

Random-walk noise. RSS often moves in steps (arenas and pages mapped and returned) that
add up like a random walk rather than wobbling around a level. A walk has no level to
return to, so over any window it shows a slope of about ``step × √n``; the Mann–Kendall
test, even with the Hamed–Rao correction (whose autocorrelation is estimated after the
walk's apparent slope was removed), calls that a trend. On 200 healthy 1-hour series
with 0.3 MiB steps in a fifth of the seconds, 10 MiB/h threshold, the plain test failed
≈ 20 % of them (LEAK or INCONCLUSIVE). So the samples are first asked whether they are
stationary around a line (KPSS, with an AR(1)-prewhitened long-run variance so that
short-memory wobble is not mistaken for a walk); if not, the drift must also be
significant against the spread of the bucket-to-bucket steps (a one-sided t-test on the
mean step, its variance widened for the positive lag-1 correlation that averaging a walk
into buckets creates). tests/test_soak_evidence.py measures the rates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Verdict = Literal["LEAK", "INCONCLUSIVE", "PASS", "INSUFFICIENT"]

# KPSS η_τ (level and trend removed) 5 % critical value, Kwiatkowski et al. (1992) table 1:
# above it the series is not stationary around a line — it wanders like a random walk.
KPSS_TREND_5PCT = 0.146
# The KPSS statistic is computed on at most this many medians of the judged samples.
KPSS_MAX_POINTS = 600


@dataclass(frozen=True)
class TrendParams:
    """Detector parameters; ``slope_threshold`` S is in units per minute."""

    slope_threshold: float
    warmup_frac: float = 0.25
    warmup_min_s: float = 0.0
    # None = automatic: the measured span / ``target_buckets``, between one sample
    # interval and 60 s (1-minute medians on long soaks, a few seconds on quick ones)
    bucket_s: float | None = None
    target_buckets: int = 20
    min_buckets: int = 8
    alpha: float = 0.01
    ci: float = 0.90
    second_half_ratio: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.bucket_s is not None and self.bucket_s <= 0:
            raise ValueError(f"bucket_s must be > 0 or None (auto), got {self.bucket_s}")
        if not 0.0 < self.alpha < 1.0 or not 0.0 < self.ci < 1.0:
            raise ValueError(f"alpha and ci must be in (0, 1), got {self.alpha}, {self.ci}")
        if self.min_buckets < 4:
            raise ValueError(f"min_buckets must be >= 4, got {self.min_buckets}")


@dataclass(frozen=True)
class TrendResult:
    verdict: Verdict
    slope_per_min: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n: int  # buckets the trend was fitted on
    n_samples: int  # raw samples after the warm-up
    bucket_s: float
    warmup_s: float
    span_min: float  # minutes covered after the warm-up
    first_half_slope: float | None
    second_half_slope: float | None
    reasons: tuple[str, ...]
    # the parts of p_value: Hamed–Rao Mann–Kendall, and (random-walk-like samples only)
    # the drift test against the walk's steps; p_value is the larger
    p_mann_kendall: float | None = None
    variance_inflation: float | None = None  # Hamed–Rao n/n*, >= 1
    kpss: float | None = None
    p_walk: float | None = None  # None: the samples are stationary around a line


def mann_kendall(y: Sequence[float]) -> tuple[float, float]:
    """One-sided Mann–Kendall test for an increasing trend: (S statistic, p-value).

    The variance is corrected for ties (integer thread counts tie a lot) and the normal
    approximation uses the usual continuity correction. All-tied series give p = 1.
    """
    from scipy.stats import norm  # here: scipy.stats takes a second to import

    arr = np.asarray(y, dtype=float)
    n = len(arr)
    if n < 3:
        return 0.0, 1.0
    s, var = _mk_s_var(arr)
    if var <= 0:
        return s, 1.0
    return s, float(norm.sf(_z(s, var)))


def _mk_s_var(arr: np.ndarray) -> tuple[float, float]:
    n = len(arr)
    diffs = arr[None, :] - arr[:, None]
    s = float(np.sign(diffs[np.triu_indices(n, k=1)]).sum())
    _, tie_counts = np.unique(arr, return_counts=True)
    ties = tie_counts[tie_counts > 1].astype(float)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    return s, var


def _z(s: float, var: float) -> float:
    if s > 0:
        return (s - 1) / math.sqrt(var)
    if s < 0:
        return (s + 1) / math.sqrt(var)
    return 0.0


def mann_kendall_hr(y: Sequence[float]) -> tuple[float, float, float]:
    """One-sided Mann–Kendall with the Hamed & Rao (1998) autocorrelation correction:
    (S, p-value, variance inflation n/n*).

    The series is detrended with its Sen slope; the lag-k autocorrelations of the ranks
    of the residuals that are significant at 5 % (|r_k| > 1.96/√n) give
    n/n* = 1 + 2/(n(n−1)(n−2)) · Σ (n−k)(n−k−1)(n−k−2) r_k, and Var(S) is multiplied
    by it. The factor is floored at 1: a negatively correlated series is not allowed to
    make the test more eager than the plain one.
    """
    from scipy.stats import norm, rankdata, theilslopes

    arr = np.asarray(y, dtype=float)
    n = len(arr)
    if n < 3:
        return 0.0, 1.0, 1.0
    s, var = _mk_s_var(arr)
    if var <= 0:
        return s, 1.0, 1.0
    i = np.arange(n, dtype=float)
    resid = arr - float(theilslopes(arr, i).slope) * i
    r = rankdata(resid)
    r -= r.mean()
    den = float(np.sum(r * r))
    inflation = 1.0
    if den > 0 and n > 3:
        bound = norm.ppf(0.975) / math.sqrt(n)
        total = 0.0
        for k in range(1, n - 2):
            rk = float(np.sum(r[:-k] * r[k:])) / den
            if abs(rk) > bound:
                total += (n - k) * (n - k - 1) * (n - k - 2) * rk
        inflation = max(1.0, 1.0 + 2.0 * total / (n * (n - 1) * (n - 2)))
    return s, float(norm.sf(_z(s, var * inflation))), inflation


def kpss_trend(y: Sequence[float]) -> float:
    """KPSS η_τ: is the series stationary around a straight line (small) or does it
    wander like a random walk (large; > ``KPSS_TREND_5PCT`` rejects stationarity at 5 %)?

    The long-run variance is prewhitened with an AR(1) fit whose coefficient is capped at
    1 − 2/√n: short-memory wobble (RSS's AR(1) with φ≈0.7 at 1 s) is accounted for, while
    a walk (φ → 1) is not explained away.
    """
    arr = np.asarray(y, dtype=float)
    n = len(arr)
    if n < 8:
        return 0.0
    x = np.arange(n, dtype=float)
    slope, intercept = np.polyfit(x, arr, 1)
    e = arr - (slope * x + intercept)
    lrv = float(np.mean(e * e))
    den = float(np.sum(e[:-1] * e[:-1]))
    rho = float(np.sum(e[1:] * e[:-1])) / den if den > 0 else 0.0
    rho = min(rho, 1.0 - 2.0 / math.sqrt(n))
    if rho > 0:
        u = e[1:] - rho * e[:-1]
        lrv = float(np.mean(u * u)) / (1.0 - rho) ** 2
    if lrv <= 0:
        return 0.0
    partial = np.cumsum(e)
    return float(np.sum(partial * partial) / (n * n * lrv))


def walk_drift_p(yb: Sequence[float]) -> float:
    """One-sided p-value that a random walk's steps have a positive mean (a drift).

    ``yb`` are bucket medians; their steps are independent for a walk except for the
    positive lag-1 correlation bucketing creates (Working 1960: 0.25 for means), so the
    variance of the mean step is widened by 1 + 2·r₁ when r₁ > 0.
    """
    from scipy.stats import t as student_t

    d = np.diff(np.asarray(yb, dtype=float))
    m = len(d)
    if m < 3:
        return 1.0
    dc = d - d.mean()
    g0 = float(np.mean(dc * dc))
    if g0 == 0:
        return 0.0 if d.mean() > 0 else 1.0
    g1 = float(np.mean(dc[1:] * dc[:-1]))
    var = g0 * max(1.0, 1.0 + 2.0 * g1 / g0) * m / (m - 1)
    return float(student_t.sf(float(d.mean()) / math.sqrt(var / m), m - 1))


def bucket_medians(
    t_s: Sequence[float], y: Sequence[float], bucket_s: float, start_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Median time and median value of each non-empty ``bucket_s`` bucket from ``start_s``."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(y, dtype=float)
    idx = np.floor((t - start_s) / bucket_s).astype(np.int64)
    tb: list[float] = []
    yb: list[float] = []
    for k in np.unique(idx):
        sel = idx == k
        tb.append(float(np.median(t[sel])))
        yb.append(float(np.median(v[sel])))
    return np.asarray(tb), np.asarray(yb)


def _thin(y: np.ndarray, max_points: int) -> np.ndarray:
    """Medians of consecutive runs of samples, at most about ``max_points`` of them."""
    size = math.ceil(len(y) / max_points)
    if size <= 1:
        return y
    whole = len(y) // size * size
    out = np.median(y[:whole].reshape(-1, size), axis=1)
    return np.append(out, np.median(y[whole:])) if whole < len(y) else out


def _slope_per_min(t_s: np.ndarray, y: np.ndarray) -> float | None:
    from scipy.stats import theilslopes

    if len(t_s) < 3:
        return None
    return float(theilslopes(y, t_s / 60.0).slope)


def leak_test(
    t_s: Sequence[float],
    values: Sequence[float],
    params: TrendParams,
    variant: Literal["memory", "count"] = "memory",
) -> TrendResult:
    """Run the leak detector (docs/checks.md, soak.rss_trend) on one series (``t_s`` seconds, any origin)."""
    from scipy.stats import theilslopes

    t = np.asarray(t_s, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]

    if len(t) < 2:
        return _insufficient(params, 0.0, 0, 0, 0.0, ("fewer than 2 samples",))
    total_s = float(t[-1] - t[0])
    warmup_s = max(params.warmup_frac * total_s, params.warmup_min_s)
    keep = t >= t[0] + warmup_s
    tk, yk = t[keep], y[keep]
    span_s = float(tk[-1] - tk[0]) if len(tk) else 0.0
    bucket_s = params.bucket_s
    if bucket_s is None:
        interval = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
        bucket_s = min(60.0, max(interval, span_s / params.target_buckets))
    if len(tk) == 0:
        return _insufficient(params, bucket_s, 0, 0, warmup_s, ("no samples after the warm-up",))
    tb, yb = bucket_medians(tk, yk, bucket_s, float(tk[0]))
    if len(tb) < params.min_buckets:
        return _insufficient(
            params,
            bucket_s,
            len(tb),
            len(tk),
            warmup_s,
            (
                f"{len(tb)} buckets of {bucket_s:g} s after a {warmup_s:g} s warm-up; "
                f"need >= {params.min_buckets}",
            ),
        )

    fit = theilslopes(yb, tb / 60.0, alpha=params.ci)
    b, lo, hi = float(fit.slope), float(fit.low_slope), float(fit.high_slope)
    _, p_mk, inflation = mann_kendall_hr(yb)
    eta = kpss_trend(_thin(yk, KPSS_MAX_POINTS))
    p_walk = walk_drift_p(yb) if eta > KPSS_TREND_5PCT else None
    p = max(p_mk, p_walk) if p_walk is not None else p_mk
    half = len(tb) // 2
    b1 = _slope_per_min(tb[:half], yb[:half])
    b2 = _slope_per_min(tb[half:], yb[half:])

    S = params.slope_threshold
    failed: list[str] = []
    if not lo > S:
        failed.append(f"CI lower bound {lo:.4g}/min <= threshold {S:g}/min")
    if b2 is None or not b2 > S:
        failed.append(f"second-half slope {_fmt(b2)}/min <= threshold {S:g}/min")
    elif b1 is not None and b1 > 0 and b2 < params.second_half_ratio * b1:
        failed.append(
            f"growth slowing: second-half slope {b2:.4g}/min < "
            f"{params.second_half_ratio:g} x first-half {b1:.4g}/min"
        )
    if variant == "count":
        # on the bucket medians, like the slope: one burst of short-lived connections
        # in the middle third must not hide a leak
        third = len(yb) // 3
        if third >= 1:
            mid_max = float(np.max(yb[third : 2 * third]))
            last_max = float(np.max(yb[2 * third :]))
            if not last_max > mid_max:
                failed.append(f"max of last third {last_max:g} <= max of middle third {mid_max:g}")

    if p < params.alpha and b > S:
        verdict: Verdict = "INCONCLUSIVE" if failed else "LEAK"
        reasons = (
            tuple(failed)
            if failed
            else (f"slope {b:.4g}/min > {S:g}/min, CI [{lo:.4g}, {hi:.4g}], p={p:.2g}",)
        )
    else:
        verdict = "PASS"
        why = []
        if not p < params.alpha:
            why.append(f"no significant upward trend (p={p:.2g} >= {params.alpha:g})")
            if p_walk is not None and p_walk > p_mk:
                why.append(
                    f"the samples wander like a random walk (KPSS {eta:.2f} > "
                    f"{KPSS_TREND_5PCT:g}) and the drift is within the walk's steps"
                )
        if not b > S:
            why.append(f"slope {b:.4g}/min <= threshold {S:g}/min")
        reasons = tuple(why)
    return TrendResult(
        verdict=verdict,
        slope_per_min=b,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        n=len(tb),
        n_samples=len(tk),
        bucket_s=bucket_s,
        warmup_s=warmup_s,
        span_min=span_s / 60.0,
        first_half_slope=b1,
        second_half_slope=b2,
        reasons=reasons,
        p_mann_kendall=p_mk,
        variance_inflation=inflation,
        kpss=eta,
        p_walk=p_walk,
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _insufficient(
    params: TrendParams,
    bucket_s: float,
    n: int,
    n_samples: int,
    warmup_s: float,
    reasons: tuple[str, ...],
) -> TrendResult:
    return TrendResult(
        verdict="INSUFFICIENT",
        slope_per_min=None,
        ci_low=None,
        ci_high=None,
        p_value=None,
        n=n,
        n_samples=n_samples,
        bucket_s=bucket_s,
        warmup_s=warmup_s,
        span_min=0.0,
        first_half_slope=None,
        second_half_slope=None,
        reasons=reasons,
    )
