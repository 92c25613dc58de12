"""The statistics of a peak search's edge: where a server stops meeting its SLO, and how
sure that is.

- ``fit_outcomes``: the logistic edge P(met | rate x) = 1 / (1 + e^((x − edge)/scale))
  fitted to met/missed outcomes (Firth-penalized likelihood) with its profile-likelihood
  interval (``EdgeFit``);
- ``searches_interval``: the mean of K searches' edges with Student's t interval over
  their spread (``SearchesInterval``);
- ``answers_agree``: whether two runs' answers agree within their stated intervals;
- ``edge_confidence``: the nominal confidence of an interval bounded by repeated outcomes;
- ``kneedle``: where a rising curve turns up;
- ``judged_outcomes`` and ``rate_key``: which outcomes at a rate count, and how rates
  are grouped.

Pure: numbers in, numbers out (numpy and scipy). What the coverage of these intervals is
on measured and simulated searches: docs/peak-measurements.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# the fitted edge's interval is a 95 % profile-likelihood interval
EDGE_CI = 0.95
# the scale's profile grid: 160 log-spaced scales over 4.6 decades (a step of 7 %)
PROFILE_GRID = 160


def rate_key(rate: float) -> float:
    """A rate as outcomes are grouped by (0.01 req/s)."""
    return round(float(rate), 2)


def judged_outcomes(raw: Sequence[str]) -> list[str]:
    """The outcomes at one rate that count, in measurement order: ``met`` and ``missed``;
    an ``insufficient`` one (too few samples either way) counts as a miss once it was
    measured again (two in a row: a pass must be earned); ``invalid`` is no information."""
    out: list[str] = []
    pending_insufficient = 0
    for o in raw:
        if o in ("met", "missed"):
            out.append(o)
        elif o == "insufficient":
            pending_insufficient += 1
            if pending_insufficient >= 2:
                out.append("missed")
                pending_insufficient = 0
    return out


def answers_agree(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Two runs' answers (peak, interval low, interval high) agree when their difference
    is within the root sum of squares of the facing half-widths (the lower run's upper
    half, the higher run's lower half): what "the same peak within their stated
    intervals" means for two independent estimates."""
    lo_run, hi_run = (a, b) if a[0] <= b[0] else (b, a)
    up, down = lo_run[2] - lo_run[0], hi_run[0] - hi_run[1]
    return hi_run[0] - lo_run[0] <= math.hypot(up, down)


@dataclass(frozen=True)
class SearchesInterval:
    """The peak of K independent searches: their mean and a Student-t interval from
    their spread (``searches_interval``)."""

    peak_rps: float
    ci_rps: tuple[float, float]
    sd_rps: float  # the searches' sample standard deviation
    k: int
    confidence: float = EDGE_CI


def searches_interval(edges: Sequence[float], confidence: float = EDGE_CI) -> SearchesInterval:
    """Mean ± t(confidence, K-1) · sd / √K over K searches' edges.

    One search's interval is from its own points, and its points all come from one
    stretch of minutes on one server: a change of speed between server lifetimes or over
    the next stretch is in none of them. K searches, each on a freshly started server,
    spread over the run's minutes, measure that move: their spread is the whole variance
    of one search's answer — its points' noise, the server lifetime's and the machine's
    drift over the run — and Student's t accounts for estimating it from K of them. A rate
    is not negative: the lower end stops at 0."""
    from scipy.stats import t

    k = len(edges)
    if k < 2:
        raise ValueError(f"an interval from the searches' spread needs >= 2, got {k}")
    mean = sum(edges) / k
    sd = math.sqrt(sum((e - mean) ** 2 for e in edges) / (k - 1))
    half = float(t.ppf(0.5 + confidence / 2, k - 1)) * sd / math.sqrt(k)
    return SearchesInterval(mean, (max(0.0, mean - half), mean + half), sd, k, confidence)


def edge_confidence(repeats: int) -> float:
    """The nominal confidence that [L, U] holds the edge, for bounds fixed in advance; the
    search's bounds are chosen after the outcomes, and hold less often on a gradual edge
    (simulated coverage: docs/peak-measurements.md)."""
    return max(0.0, 1.0 - 2.0 * 0.5**repeats) if repeats > 1 else 0.0


def kneedle(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The x where an increasing, convex curve turns up (Kneedle: the point farthest below
    the chord from the first to the last point, both axes scaled to [0, 1]); ``xs``
    ascending. None with fewer than 3 points or a flat axis."""
    if len(xs) < 3:
        return None
    x0, x1 = xs[0], xs[-1]
    y0, y1 = min(ys), max(ys)
    if x1 <= x0 or y1 <= y0:
        return None
    xn = [(x - x0) / (x1 - x0) for x in xs]
    yn = [(y - y0) / (y1 - y0) for y in ys]
    # convex increasing curve: the knee is where the curve lies farthest below the chord
    c0, c1 = yn[0], yn[-1]
    diffs = [(c0 + (c1 - c0) * xn[i]) - yn[i] for i in range(len(xs))]
    i = max(range(len(xs)), key=lambda j: diffs[j])
    return xs[i] if diffs[i] > 0 else None


@dataclass(frozen=True)
class EdgeFit:
    """The edge fitted to every judged outcome: P(met | rate x) = 1 / (1 + e^((x − edge)/scale)).

    ``edge_rps`` is the rate at which a point meets the SLO half the time, ``ci_rps`` its
    profile-likelihood interval at ``confidence`` (the edges whose penalized likelihood
    ratio to the best fit stays within the χ²₁ quantile), ``sustained_rps`` the rate met
    95 % of the time (edge − scale·ln 19). Uses every point, not only the two edge rates,
    so on a noisy server (outcomes mixed over a wide band) it says where the middle of the
    band is and how sure that is, where [L, U] can only say how wide the band is.

    The likelihood carries Firth's penalty (½·log det of the Fisher information, the
    Jeffreys prior): a search's outcomes are nearly separated by construction — met below
    the bracket, missed above, mixed only at one or two rates — and there the plain
    maximum-likelihood scale collapses towards 0 and its interval with it. Firth's
    estimate exists for separated data and its profile interval keeps its coverage there
    (Heinze & Schemper 2002); the coverage measured on searches is in docs/peak-measurements.md."""

    edge_rps: float
    ci_rps: tuple[float | None, float | None]
    scale_rps: float
    sustained_rps: float
    confidence: float
    n: int
    method: str = "firth"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci_rps"] = list(self.ci_rps)
        return d


def fit_outcomes(
    xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95, *, firth: bool = True
) -> EdgeFit:
    import numpy as np
    from scipy.optimize import brentq, minimize_scalar
    from scipy.stats import chi2

    x_raw = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    # work in standardized rates: the fit is the same, the numbers better conditioned
    mid = float(x_raw.mean())
    unit = float(x_raw.std()) or max(abs(mid), 1.0) * 0.01
    x = (x_raw - mid) / unit

    span = float(x.max() - x.min()) or 1.0
    # the scale's profile is taken on a log-spaced grid (then a parabola through the best
    # three): every penalized likelihood of one edge in one vectorized pass, instead of a
    # bounded 1-D search per edge
    log_s = np.linspace(math.log(1e-4 * span), math.log(4.0 * span), PROFILE_GRID)
    inv_s = np.exp(-log_s)[:, None]
    xx = x * x

    def pll(e: float) -> Any:
        """Penalized log-likelihood of edge e at every grid scale (standardized units)."""
        z = np.clip((x[None, :] - e) * inv_s, -50, 50)
        p = np.clip(1.0 / (1.0 + np.exp(z)), 1e-12, 1 - 1e-12)
        ll = (y * np.log(p) + (1 - y) * np.log1p(-p)).sum(axis=1)
        if firth:
            # Fisher information of the linear predictor's (intercept, slope): its
            # determinant, in closed form for the 2 x 2 matrix
            w = p * (1 - p)
            a, b, c = w.sum(axis=1), (w * x).sum(axis=1), (w * xx).sum(axis=1)
            det = a * c - b * b
            ok = det > 0
            ll = ll + np.where(ok, 0.5 * np.log(np.where(ok, det, 1.0)), -1e6)
        return ll

    def profile(e: float) -> tuple[float, float]:
        """max over the scale at this edge: (penalized log-likelihood, scale)."""
        ll = pll(e)
        i = int(np.argmax(ll))
        if 0 < i < len(ll) - 1:
            l0, l1, l2 = float(ll[i - 1]), float(ll[i]), float(ll[i + 1])
            curv = l0 - 2 * l1 + l2
            if curv < 0:
                d = 0.5 * (l0 - l2) / curv  # the parabola's vertex, in grid steps
                step = float(log_s[1] - log_s[0])
                return l1 - 0.25 * (l0 - l2) * d, math.exp(float(log_s[i]) + d * step)
        return float(ll[i]), math.exp(float(log_s[i]))

    lo_x, hi_x = float(x.min()) - 0.5 * span, float(x.max()) + 0.5 * span
    grid = np.linspace(lo_x, hi_x, 25)
    prof = [profile(float(e))[0] for e in grid]
    i = int(np.argmax(prof))
    # the profile is unimodal: refine the maximum within the neighbouring grid cells
    res = minimize_scalar(
        lambda e: -profile(e)[0],
        bounds=(float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])),
        method="bounded",
        options={"xatol": 1e-4 * span},
    )
    best_e = float(res.x)
    best_ll, best_s = profile(best_e)
    limit = best_ll - chi2.ppf(confidence, 1) / 2.0

    def end(bound: float) -> float | None:
        """Where the profile crosses the limit between the best edge and ``bound``; None
        (open on that side) when it is still above the limit at the bound."""
        if profile(bound)[0] >= limit:
            return None
        return float(brentq(lambda e: profile(e)[0] - limit, bound, best_e, xtol=1e-4 * span))

    ci_lo, ci_hi = end(lo_x), end(hi_x)

    def rps(v: float) -> float:
        return round(mid + v * unit, 2)

    return EdgeFit(
        edge_rps=rps(best_e),
        ci_rps=(None if ci_lo is None else rps(ci_lo), None if ci_hi is None else rps(ci_hi)),
        scale_rps=round(best_s * unit, 3),
        sustained_rps=rps(best_e - best_s * math.log(19.0)),
        confidence=confidence,
        n=len(xs),
        method="firth" if firth else "mle",
    )
