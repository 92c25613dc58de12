"""Read the pieces of a scenario result the checks need (docs/architecture.md shape)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.analysis.percentiles import decode, merge

ZERO_COUNTERS: Mapping[str, Any] = {
    "scheduled": 0,
    "ok": 0,
    "dropped": 0,
    "in_flight": 0,
    "failed": {},
}


def stages(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(result.get("stages") or [])


def stage(result: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((s for s in stages(result) if s.get("name") == name), None)


def class_names(result: Mapping[str, Any]) -> list[str]:
    return sorted((result.get("by_class") or {}).keys() | (result.get("classes") or {}).keys())


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


def histogram(
    result: Mapping[str, Any],
    *,
    stage_names: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
) -> HdrHistogram:
    """Ok-response latencies merged over ``classes`` (all if None), from ``by_stage`` when
    ``stage_names`` is given, else from ``by_class`` (whole run)."""
    if stage_names:
        by_stage = result.get("by_stage") or {}
        encoded = [
            entry.get("latency_hdr")
            for s in stage_names
            for cls, entry in (by_stage.get(s) or {}).items()
            if classes is None or cls in classes
        ]
    else:
        encoded = [
            entry.get("latency_hdr")
            for cls, entry in (result.get("by_class") or {}).items()
            if classes is None or cls in classes
        ]
    return merge(encoded)


def optional_hist(encoded: str | None) -> HdrHistogram | None:
    return decode(encoded) if encoded else None


def add_counters(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {"scheduled": 0, "ok": 0, "dropped": 0, "in_flight": 0, "failed": {}}
    for c in items:
        for k in ("scheduled", "ok", "dropped", "in_flight"):
            total[k] += int(c.get(k) or 0)
        for kind, v in (c.get("failed") or {}).items():
            total["failed"][kind] = total["failed"].get(kind, 0) + int(v)
    return total


def counters(
    result: Mapping[str, Any],
    *,
    stage_names: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """Counters for the whole run, some stages and/or some classes; None if not recorded."""
    if stage_names:
        by_stage = result.get("by_stage") or {}
        found = [
            entry.get("counters") or ZERO_COUNTERS
            for s in stage_names
            for cls, entry in (by_stage.get(s) or {}).items()
            if classes is None or cls in classes
        ]
        return add_counters(found) if found else None
    if classes is not None:
        by_class = result.get("by_class") or {}
        found = [by_class[c].get("counters") or ZERO_COUNTERS for c in classes if c in by_class]
        return add_counters(found) if found else None
    c = result.get("counters")
    return add_counters([c]) if c else None


def failed_total(c: Mapping[str, Any]) -> int:
    return sum(int(v) for v in (c.get("failed") or {}).values())


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
    w = result.get("windows") or {}
    rows = w.get("rows") or []
    if not rows:
        return None
    per_t: dict[float, list[Mapping[str, Any]]] = {}
    for r in rows:
        if classes is not None and r.get("class") not in classes:
            continue
        per_t.setdefault(float(r["t"]), []).append(r)
    ts = sorted(per_t)
    out = Windows(float(w.get("width_s") or 1.0), ts, [], [], [], [], [])
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
