"""Read the pieces of a scenario result the checks need.

The generic readers (stages, counters, the merged latency histogram, window rows) and the
histogram codec are ``harness.results``'s, shared with the reports; what is here is the
checks' own view on top of them (the protected class, per-window merges, number format).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.results import hdr, readers

# The checks call these as ``d.<name>``; they are the results package's readers.
ZERO_COUNTERS = readers.ZERO_COUNTERS
stages = readers.stages
stage = readers.stage
class_names = readers.class_names
histogram = readers.latency
add_counters = readers.add_counters
counters = readers.counters
failed_total = readers.failed_total


def high_class(result: Mapping[str, Any]) -> str | None:
    """The protected class: "high" if present, else the smallest positive priority
    (Triton: 1 is the highest)."""
    classes = result.get("classes") or {}
    if "high" in classes or "high" in (result.get("by_class") or {}):
        return "high"
    ranked = sorted(
        (int(c.get("priority") or 0), name)
        for name, c in classes.items()
        if int(c.get("priority") or 0) > 0
    )
    return ranked[0][1] if ranked else None


def optional_hist(encoded: str | None) -> HdrHistogram | None:
    """The decoded histogram, or None when nothing was recorded (absent or empty)."""
    h = hdr.decode(encoded)
    return h if h.get_total_count() else None


@dataclass(frozen=True)
class Windows:
    """Windowed rows merged per window start across the selected classes."""

    width_s: float
    t: list[float]
    n: list[int]
    ok: list[int]
    errors: list[dict[str, int]]
    p50_ms: list[float | None]
    p99_ms: list[float | None]  # the worst class's p99 in each window (conservative)


def windows(result: Mapping[str, Any], classes: Sequence[str] | None = None) -> Windows | None:
    rows, width_s = readers.window_rows(result)
    if not rows:
        return None
    per_t: dict[float, list[Mapping[str, Any]]] = {}
    for r in rows:
        if classes is not None and r.get("class") not in classes:
            continue
        per_t.setdefault(float(r["t"]), []).append(r)
    ts = sorted(per_t)
    out = Windows(width_s, ts, [], [], [], [], [])
    for t in ts:
        group = per_t[t]
        out.n.append(sum(int(r.get("n") or 0) for r in group))
        out.ok.append(sum(int(r.get("ok") or 0) for r in group))
        errs: dict[str, int] = {}
        for r in group:
            for k, v in (r.get("errors") or {}).items():
                errs[k] = errs.get(k, 0) + int(v)
        out.errors.append(errs)
        out.p99_ms.append(_worst(group, "p99_ms"))
        out.p50_ms.append(_worst(group, "p50_ms"))
    return out


def _worst(group: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [
        float(r[key])
        for r in group
        if r.get(key) is not None and int(r.get("ok") or 0) > 0 and math.isfinite(float(r[key]))
    ]
    return max(vals) if vals else None


def fmt(x: float | None, digits: int = 3) -> str:
    """Numbers in sentences: 3 significant digits, no scientific notation for usual sizes."""
    if x is None:
        return "n/a"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:,.0f}"
