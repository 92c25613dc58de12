"""Thread-scaling efficiency and the Universal Scalability Law.

X(N) = λN / (1 + σ(N−1) + κN(N−1)); efficiency E(N) = X(N) / (N·X(1)). λ = X(1) is
measured, not fitted; σ (contention) and κ (coherency) are fitted within [0, 1]. The
peak is at N* = √((1−σ)/κ) (infinite when κ = 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def usl(n: np.ndarray | float, lam: float, sigma: float, kappa: float) -> np.ndarray | float:
    """Throughput at concurrency ``n`` under the USL."""
    n = np.asarray(n, dtype=float)
    return lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def medians(points: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """Median throughput per concurrency level (replicates reduce to their median)."""
    return {int(n): float(np.median(xs)) for n, xs in points.items() if len(xs)}


def efficiency(points: Mapping[int, Sequence[float]]) -> dict[int, float]:
    """E(N) = X(N) / (N·X(1)) per N, using medians of replicates. Needs N = 1."""
    x = medians(points)
    if 1 not in x or x[1] <= 0:
        raise ValueError("efficiency needs a positive measured throughput at N = 1")
    return {n: xn / (n * x[1]) for n, xn in sorted(x.items())}


@dataclass(frozen=True)
class USLFit:
    lam: float  # X(1), measured
    sigma: float
    kappa: float
    n_peak: float  # N* (inf when kappa == 0)
    x_peak: float  # X(N*) (λ/σ asymptote when kappa == 0 and sigma > 0)
    rmse: float


def fit_usl(points: Mapping[int, Sequence[float]]) -> USLFit | None:
    """Fit σ, κ to every replicate with λ fixed at the measured X(1).

    With a single N > 1 only σ is fitted (κ = 0): one level cannot tell the two apart.
    None when there is no N > 1 or no X(1).
    """
    from scipy.optimize import curve_fit  # here: a second to import

    x = medians(points)
    if 1 not in x or x[1] <= 0:
        return None
    lam = x[1]
    ns: list[float] = []
    xs: list[float] = []
    for n, reps in points.items():
        for v in reps:
            ns.append(float(n))
            xs.append(float(v))
    levels = sorted({int(n) for n in points if int(n) > 1 and len(points[n])})
    if not levels:
        return None
    n_arr, x_arr = np.asarray(ns), np.asarray(xs)
    if len(levels) >= 2:
        (sigma, kappa), _ = curve_fit(
            lambda n, s, k: usl(n, lam, s, k),
            n_arr,
            x_arr,
            p0=(0.05, 0.001),
            bounds=([0.0, 0.0], [1.0, 1.0]),
        )
    else:
        (sigma,), _ = curve_fit(
            lambda n, s: usl(n, lam, s, 0.0), n_arr, x_arr, p0=(0.05,), bounds=([0.0], [1.0])
        )
        kappa = 0.0
    sigma, kappa = float(sigma), float(kappa)
    if kappa > 0:
        n_peak = math.sqrt(max(0.0, 1.0 - sigma) / kappa)
        x_peak = float(usl(n_peak, lam, sigma, kappa))
    else:
        n_peak = math.inf
        x_peak = lam / sigma if sigma > 0 else math.inf
    resid = x_arr - usl(n_arr, lam, sigma, kappa)
    return USLFit(lam, sigma, kappa, n_peak, x_peak, float(np.sqrt(np.mean(resid**2))))
