"""Readers of a results document's records, and the derived numbers stored in it.

The checks and the reports read a scenario result through these (stages, classes,
counters, latency histograms, window rows), never by walking the JSON themselves; the
load side stores the derived numbers through them: window percentiles by
``harness.analysis.hdr`` (the one histogram codec and percentile rule) and the linearity
USL fit by ``harness.analysis.linearity.fit_usl``. The record types are in
``harness.results.records``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.analysis import hdr
from harness.results.records import (
    Counters,
    Document,
    LinearityPoint,
    Stage,
    UslParams,
    WindowRow,
)

# --- derived numbers stored in the document ------------------------------------------


def window_percentiles(h: HdrHistogram) -> dict[str, float | None]:
    """The ``p50_ms``/``p90_ms``/``p99_ms``/``max_ms`` of a window row (hdr's rule)."""
    return hdr.summary_ms(h)


def usl_params(
    points: Sequence[LinearityPoint] | Mapping[int, Sequence[float]],
) -> UslParams | None:
    """The one USL fit of a linearity sweep, as stored in ``linearity.usl``; None when
    the points cannot be fitted (no N = 1, no N > 1, or the fit does not converge)."""
    # Imported here: scipy's optimiser is needed only by whoever builds or upgrades a
    # document with a sweep, never by the load workers that import this package.
    from harness.analysis.linearity import fit_usl

    reps = points if isinstance(points, Mapping) else linearity_replicates(points)
    try:
        fit = fit_usl(reps)
    except (RuntimeError, ValueError):  # curve_fit did not converge / degenerate input
        return None
    if fit is None:
        return None
    return UslParams(
        lam=fit.lam,
        sigma=fit.sigma,
        kappa=fit.kappa,
        n_peak=fit.n_peak if math.isfinite(fit.n_peak) else None,
        x_peak=fit.x_peak if math.isfinite(fit.x_peak) else None,
        rmse=fit.rmse,
    )


def with_usl(doc: Document) -> Document:
    """Fill ``linearity.usl`` of every sweep that lacks it (documents written before the
    field existed). Returns ``doc`` with a new ``scenarios`` list when it filled anything;
    the scenarios it was given are not modified."""
    scenarios = doc.get("scenarios")
    if not isinstance(scenarios, list):
        return doc
    out, changed = [], False
    for sc in scenarios:
        lin = sc.get("linearity") if isinstance(sc, Mapping) else None
        if isinstance(lin, Mapping) and "usl" not in lin:
            sc = {**sc, "linearity": {**lin, "usl": usl_params(lin.get("points") or [])}}
            changed = True
        out.append(sc)
    if changed:
        doc["scenarios"] = out
    return doc


# --- readers --------------------------------------------------------------------------

ZERO_COUNTERS: Counters = {"scheduled": 0, "ok": 0, "dropped": 0, "in_flight": 0, "failed": {}}


def stages(result: Mapping[str, Any]) -> list[Stage]:
    return list(result.get("stages") or [])


def stage(result: Mapping[str, Any], name: str) -> Stage | None:
    return next((s for s in stages(result) if s.get("name") == name), None)


def class_names(result: Mapping[str, Any]) -> list[str]:
    """Every traffic class the scenario declared or recorded."""
    return sorted((result.get("by_class") or {}).keys() | (result.get("classes") or {}).keys())


def latency(
    result: Mapping[str, Any],
    *,
    stage_names: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
) -> HdrHistogram:
    """Ok-response latencies merged over ``classes`` (all if None), from ``by_stage`` when
    ``stage_names`` is given, else from ``by_class`` (whole run)."""
    if stage_names:
        by_stage = result.get("by_stage") or {}
        cells: Iterable[tuple[str, Mapping[str, Any]]] = (
            item for s in stage_names for item in (by_stage.get(s) or {}).items()
        )
    else:
        cells = (result.get("by_class") or {}).items()
    return hdr.merge(
        entry.get("latency_hdr") for cls, entry in cells if classes is None or cls in classes
    )


def add_counters(items: Iterable[Mapping[str, Any]]) -> Counters:
    total: Counters = {"scheduled": 0, "ok": 0, "dropped": 0, "in_flight": 0, "failed": {}}
    for c in items:
        total["scheduled"] += int(c.get("scheduled") or 0)
        total["ok"] += int(c.get("ok") or 0)
        total["dropped"] += int(c.get("dropped") or 0)
        total["in_flight"] += int(c.get("in_flight") or 0)
        if c.get("aborted"):
            total["aborted"] = total.get("aborted", 0) + int(c["aborted"])
        for kind, v in (c.get("failed") or {}).items():
            total["failed"][kind] = total["failed"].get(kind, 0) + int(v)
    return total


def counters(
    result: Mapping[str, Any],
    *,
    stage_names: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
) -> Counters | None:
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


def window_rows(result: Mapping[str, Any]) -> tuple[list[WindowRow], float]:
    """The window rows that have a numeric start ``t``, and the window width (s)."""
    w = result.get("windows") or {}
    rows = [
        r
        for r in w.get("rows") or []
        if isinstance(r, Mapping) and isinstance(r.get("t"), int | float)
    ]
    return rows, float(w.get("width_s") or 1.0)


def linearity_replicates(points: Iterable[Any]) -> dict[int, list[float]]:
    """``linearity.points`` as N → replicate throughputs (a bare number is one replicate;
    malformed entries are skipped)."""
    out: dict[int, list[float]] = {}
    for p in points:
        if not isinstance(p, Mapping) or not isinstance(p.get("n"), int | float):
            continue
        reps = p.get("throughput_rps")
        reps = [reps] if isinstance(reps, int | float) else reps or []
        vals = [float(x) for x in reps if isinstance(x, int | float) and not isinstance(x, bool)]
        if vals:
            out.setdefault(int(p["n"]), []).extend(vals)
    return out
