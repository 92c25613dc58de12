"""Recovery time after an event (a spike's end, a fault's end) from windowed p99s.

Recovery is the first moment at or after the event's end from which the windowed p99
stays inside the baseline band for a whole hold period. A window with no data (nothing
completed, or a gap in the rows) counts as outside the band: silence is not health.
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


def band_ms(baseline_ms: float, factor: float, margin_ms: float = 0.0) -> float:
    """The baseline band: ``baseline × factor``, but never tighter than ``baseline + margin``.

    The margin keeps sub-millisecond baselines (where ×2 is noise) from failing.
    """
    return max(baseline_ms * factor, baseline_ms + margin_ms)


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
) -> RecoveryResult:
    """Seconds from ``event_end_s`` until the windowed p99 stays in band for ``hold_s``.

    ``t_s`` are window starts of width ``width_s``. A window straddling the event's end
    belongs to the event. A candidate start is confirmed only when contiguous in-band
    windows cover ``hold_s``; a run that ends first is "never" (None), not a pass.
    """
    band = band_ms(baseline_ms, factor, margin_ms)
    rows = sorted(
        (float(t), None if v is None or not math.isfinite(v) else float(v))
        for t, v in zip(t_s, p99_ms, strict=True)
        if t >= event_end_s - 1e-9
    )
    worst = max((v for _, v in rows if v is not None), default=None)
    start: float | None = None  # start of the current in-band streak
    prev_end: float | None = None
    for t, v in rows:
        contiguous = prev_end is not None and abs(t - prev_end) < width_s * 0.5
        inside = v is not None and v <= band
        if not inside:
            start = None
        elif start is None or not contiguous:
            start = t
        prev_end = t + width_s
        if start is not None and prev_end - start >= hold_s - 1e-9:
            # before the first window there is no evidence: recovery starts at a window
            return RecoveryResult(
                max(0.0, start - event_end_s), band, baseline_ms, event_end_s, len(rows), worst
            )
    return RecoveryResult(None, band, baseline_ms, event_end_s, len(rows), worst)
