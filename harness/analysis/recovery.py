"""Recovery time after an event (a spike's end, a fault's end) from windowed p99s and
windowed error rates.

Recovery is the first moment at or after the event's end from which the windowed p99 —
and, when given, the windowed error rate (failed / (ok + failed)) — stays inside its
baseline band for a whole hold period: a server answering most requests with fast 503s
has a fine p99 and has not recovered. A window with no data (nothing completed, or a gap
in the rows) counts as outside the band: silence is not health.

Recovery from an event that never disturbed either series is not recovery: with
``event_start_s`` the result says whether any window from the event's start on left a
band (``disturbed``); a caller reports "not exercised" rather than a 0 s pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RecoveryResult:
    recovery_s: float | None  # None = never back within the band for a hold period
    band_ms: float
    baseline_ms: float
    event_end_s: float
    windows_after: int  # windows at or after the event's end
    worst_after_ms: float | None  # highest windowed p99 after the event
    error_band: float | None = None  # None: error rates not judged
    worst_error_after: float | None = None  # highest windowed error rate after the event
    peak_ms: float | None = None  # highest windowed p99 from the event's start on
    peak_error: float | None = None  # highest windowed error rate from the event's start on
    disturbed: bool | None = None  # a window from the event's start on left a band


def band_ms(baseline_ms: float, factor: float, margin_ms: float = 0.0) -> float:
    """The baseline band: ``baseline × factor``, but never tighter than ``baseline + margin``.

    The margin keeps sub-millisecond baselines (where ×2 is noise) from failing.
    """
    return max(baseline_ms * factor, baseline_ms + margin_ms)


def error_rate_band(baseline_rate: float, factor: float = 2.0, margin: float = 0.01) -> float:
    """The error-rate band: ``baseline × factor``, but never tighter than ``baseline +
    margin`` (a healthy baseline has no errors, and ×2 of nothing is nothing)."""
    return max(baseline_rate * factor, baseline_rate + margin)


def error_rates(ok: Sequence[int], failed: Sequence[int]) -> list[float | None]:
    """Per window failed / (ok + failed); None for a window where nothing completed."""
    return [f / (o + f) if o + f > 0 else None for o, f in zip(ok, failed, strict=True)]


def baseline_error_rate(
    t_s: Sequence[float],
    ok: Sequence[int],
    failed: Sequence[int],
    spans: Sequence[tuple[float, float]],
) -> float | None:
    """Failed / (ok + failed) over all windows with ``start <= t < end`` of any span
    (pooled, not a median of windows: a healthy baseline's rare errors are not lost)."""
    o = f = 0
    for t, a, b in zip(t_s, ok, failed, strict=True):
        if any(lo <= t < hi for lo, hi in spans):
            o, f = o + a, f + b
    return f / (o + f) if o + f > 0 else None


def baseline_p99_ms(
    t_s: Sequence[float], p99_ms: Sequence[float | None], start_s: float, end_s: float
) -> float | None:
    """Median of windowed p99s with ``start_s <= t < end_s`` (robust to a bad window)."""
    vals = [
        float(v)
        for t, v in zip(t_s, p99_ms, strict=True)
        if start_s <= t < end_s and v is not None and math.isfinite(v)
    ]
    return float(np.median(vals)) if vals else None


def recovery_time(
    t_s: Sequence[float],
    p99_ms: Sequence[float | None],
    event_end_s: float,
    baseline_ms: float,
    *,
    factor: float = 2.0,
    margin_ms: float = 0.0,
    hold_s: float = 5.0,
    width_s: float = 1.0,
    error_rate: Sequence[float | None] | None = None,
    error_band: float | None = None,
    event_start_s: float | None = None,
) -> RecoveryResult:
    """Seconds from ``event_end_s`` until the windowed p99 stays in band for ``hold_s``.

    ``t_s`` are window starts of width ``width_s``. A window straddling the event's end
    belongs to the event. A candidate start is confirmed only when contiguous in-band
    windows cover ``hold_s``; a run that ends first is "never" (None), not a pass.
    With ``error_rate`` (per window, None = nothing completed) and ``error_band``, a
    window is in band only when its error rate is too. With ``event_start_s``,
    ``disturbed`` says whether any window from then on was out of band.
    """
    band = band_ms(baseline_ms, factor, margin_ms)
    judge_errors = error_rate is not None and error_band is not None
    ebound = error_band if error_band is not None else math.inf
    errs = list(error_rate) if error_rate is not None else [None] * len(t_s)
    series = [
        (
            float(t),
            None if v is None or not math.isfinite(v) else float(v),
            None if e is None or not math.isfinite(e) else float(e),
        )
        for t, v, e in zip(t_s, p99_ms, errs, strict=True)
    ]
    series.sort(key=lambda x: x[0])

    def inside(v: float | None, e: float | None) -> bool:
        if v is None or v > band:
            return False
        return not judge_errors or (e is not None and e <= ebound)

    rows = [x for x in series if x[0] >= event_end_s - 1e-9]
    worst = max((v for _, v, _ in rows if v is not None), default=None)
    worst_err = (
        max((e for _, _, e in rows if e is not None), default=None) if judge_errors else None
    )
    peak = peak_err = disturbed = None
    if event_start_s is not None:
        since = [x for x in series if x[0] >= event_start_s - 1e-9]
        peak = max((v for _, v, _ in since if v is not None), default=None)
        if judge_errors:
            peak_err = max((e for _, _, e in since if e is not None), default=None)
        gap = any(b[0] - a[0] > width_s * 1.5 for a, b in zip(since, since[1:], strict=False))
        disturbed = gap or any(not inside(v, e) for _, v, e in since)
    extra = {
        "error_band": error_band if judge_errors else None,
        "worst_error_after": worst_err,
        "peak_ms": peak,
        "peak_error": peak_err,
        "disturbed": disturbed,
    }
    start: float | None = None  # start of the current in-band streak
    prev_end: float | None = None
    for t, v, e in rows:
        contiguous = prev_end is not None and abs(t - prev_end) < width_s * 0.5
        if not inside(v, e):
            start = None
        elif start is None or not contiguous:
            start = t
        prev_end = t + width_s
        if start is not None and prev_end - start >= hold_s - 1e-9:
            # before the first window there is no evidence: recovery starts at a window
            return RecoveryResult(
                max(0.0, start - event_end_s),
                band,
                baseline_ms,
                event_end_s,
                len(rows),
                worst,
                **extra,
            )
    return RecoveryResult(None, band, baseline_ms, event_end_s, len(rows), worst, **extra)
