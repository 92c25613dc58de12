"""What a search (or several) says, as the ``peak`` section of results.json, and its exit
code: the printed peak, where it comes from, the stated interval and what it is."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harness.analysis.edge import EdgeFit, edge_confidence, searches_interval
from harness.errors import ExitCode
from harness.peak.config import PeakConfig
from harness.peak.outcomes import Point, fit_edge, knee
from harness.peak.point import server_gone
from harness.peak.search import Estimate, PeakSearch


def summarize(
    cfg: PeakConfig, s: PeakSearch, why: str, *, started: float, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``peak`` section of results.json."""
    est: Estimate = s.estimate()
    if why == "interrupted":
        est = replace(est, limit="budget", note=why)
    elif server_gone(why) and est.limit != "server_exit":  # died between two points
        est = replace(est, peak_rps=None, confidence=0.0, limit="server_exit", note=why)
    curve = sorted(
        (p.as_dict() for p in s.points if p.outcome != "invalid"), key=lambda d: d["rate_rps"]
    )
    calibration = next((p.capacity_rps for p in s.points if p.capacity_rps), None)
    fit = fit_edge(s.points)
    headline, source, interval, interval_from = headline_peak(est, fit, cfg.precision)
    return {
        **_settings(cfg),
        "estimate": est.as_dict(),
        "peak_rps": headline,
        "peak_from": source,
        # the stated interval: the fitted edge's 95 % interval when the refine phase ran
        # and closed it, else [L, U] from the repeats; band_rps is always [L, U]
        "interval_rps": list(interval),
        "interval_from": interval_from,
        "band_rps": [est.low_rps, est.high_rps],
        "knee_rps": knee(s.points),
        "edge_fit": fit.as_dict() if fit else None,
        "calibration_rps": calibration,
        "stopped": why,
        "points": [p.as_dict() for p in s.points],
        "curve": curve,
        "elapsed_s": round(time.monotonic() - started, 1),
        **extra,
    }


def _settings(cfg: PeakConfig) -> dict[str, Any]:
    """What a ``peak`` section states about how it was asked (one search or several)."""
    return {
        "slo_p99_ms": cfg.slo_p99_ms,
        "slo_tpot_ms": cfg.slo_tpot_ms,  # in tokens: slo_p99_ms is then TTFT's
        "max_error_rate": cfg.max_error_rate,
        "confidence": cfg.confidence,
        "samples_per_point": cfg.samples,
        "tolerance": cfg.tolerance,
        "repeats": cfg.repeats,
        "edge_confidence": edge_confidence(cfg.repeats),
        "config": asdict(cfg),
    }


def headline_peak(
    est: Estimate, fit: EdgeFit | None, precision: float | None = None
) -> tuple[float | None, str, tuple[float | None, float | None], str]:
    """The peak printed, where it comes from, the stated interval and what it is.

    With the refine phase (``precision``) and a fit whose 95 % interval is closed: the
    fitted edge and that interval — a confidence interval of the printed number, from
    every judged point, whose coverage is measured (tests/test_peak_edge_fit.py).
    Otherwise [L, U] from the repeats is the interval, and the peak is the logistic edge
    when it lies inside it (it uses the bracketing and bisection points too, so it is not
    tied to the bisection's grid the way the midpoint is), else the midpoint. A server that
    died during the search has no peak, whatever its points before held."""
    lo, hi = est.low_rps, est.high_rps
    if est.limit == "server_exit":
        return None, "none: the server died", (lo, hi), "repeats"
    if (
        precision is not None
        and fit is not None
        and lo is not None
        and None not in fit.ci_rps
        and est.limit == "slo"
    ):
        return fit.edge_rps, "logistic edge", fit.ci_rps, "edge_ci"
    if fit is not None and lo is not None and hi is not None and lo <= fit.edge_rps <= hi:
        return fit.edge_rps, "logistic edge", (lo, hi), "repeats"
    return est.peak_rps, "midpoint of [L, U]" if hi is not None else "L", (lo, hi), "repeats"


def exit_code(peak: Mapping[str, Any]) -> ExitCode:
    """0: a peak with its interval; 1: no rate met the SLO, or the server died during a
    point (exited, or stopped answering); 3: the generator (not the server) set the limit
    or the search stopped before it had an answer."""
    limit = (peak.get("estimate") or {}).get("limit")
    if limit == "slo" and peak.get("peak_rps"):
        return ExitCode.PASS
    if limit in ("none_met", "server_exit"):
        return ExitCode.FAIL
    return ExitCode.INVALID


def combine_searches(
    cfg: PeakConfig, sections: list[dict[str, Any]], *, started: float
) -> dict[str, Any]:
    """The ``peak`` section of results.json for ``cfg.searches`` searches: the peak is the
    mean of their peaks and its interval is Student's t over them
    (``search.searches_interval``). Every search must have found its edge under the SLO;
    one that did not (cut short, the server exited, no rate met the SLO) is the run's
    answer, and the searches measured so far are still written."""
    k_asked = cfg.searches
    points = [{**p, "search": sec["search"]} for sec in sections for p in sec["points"]]
    pts = [Point.from_dict(p) for p in points]
    fit = fit_edge(pts)
    bands = [sec["band_rps"] for sec in sections]
    answered = [
        sec
        for sec in sections
        if (sec["estimate"] or {}).get("limit") == "slo" and sec.get("peak_rps")
    ]
    lows = [b[0] for b in bands if b[0] is not None]
    highs = [b[1] for b in bands if b[1] is not None]
    band = [min(lows, default=None), max(highs, default=None)]
    spread: float | None = None
    if len(answered) == k_asked:
        si = searches_interval([sec["peak_rps"] for sec in answered])
        est: dict[str, Any] = {
            "low_rps": band[0],
            "high_rps": band[1],
            "peak_rps": si.peak_rps,
            "confidence": si.confidence,
            "limit": "slo",
            "mixed_rps": [],
            "note": f"{k_asked} searches",
        }
        peak, interval, spread = si.peak_rps, list(si.ci_rps), si.sd_rps
        stopped = "found"
    elif len(answered) == len(sections):  # interrupted between two searches
        stopped = f"interrupted after {len(sections)} of {k_asked} searches"
        est = {
            "low_rps": band[0],
            "high_rps": band[1],
            "peak_rps": None,
            "confidence": 0.0,
            "limit": "budget",
            "mixed_rps": [],
            "note": stopped,
        }
        peak, interval = None, [None, None]
    else:
        bad = next(sec for sec in sections if sec not in answered)
        est = dict(bad["estimate"])
        est["note"] = f"search {bad['search']} of {k_asked}: {bad['stopped'] or est.get('note')}"
        est["peak_rps"] = None
        if est.get("limit") == "slo":  # found, then cut: no answer from it
            est["limit"] = "budget"
        peak, interval, stopped = None, [None, None], bad["stopped"]
    first = sections[0]
    return {
        **_settings(cfg),
        "estimate": est,
        "peak_rps": peak,
        "peak_from": f"mean of {k_asked} searches",
        "interval_rps": interval,
        "interval_from": "searches",
        "band_rps": band,
        "searches_asked": k_asked,
        "spread_rps": spread,  # the searches' sample sd
        "searches": [
            {key: v for key, v in sec.items() if key not in ("points", "curve", "config")}
            | {"n_points": len(sec["points"])}
            for sec in sections
        ],
        "knee_rps": knee(pts),
        "edge_fit": fit.as_dict() if fit else None,
        "calibration_rps": first.get("calibration_rps"),
        "stopped": stopped,
        "points": points,
        "curve": sorted(
            (p for p in points if p["outcome"] != "invalid"), key=lambda d: d["rate_rps"]
        ),
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def write_outputs(out_dir: Path, doc: dict[str, Any]) -> dict[str, Path]:
    """results.json (the harness's envelope, scenarios empty: every point's own results are
    in points/point_NN/), summary.md and report.html."""
    from harness.report import peak as report
    from harness.results import write_document

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results": write_document(out_dir / "results.json", doc)}
    paths["summary"] = out_dir / "summary.md"
    paths["summary"].write_text(report.peak_markdown(doc))
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(report.peak_html(doc))
    return paths


def new_peak_document(sut: Mapping[str, Any]) -> dict[str, Any]:
    from harness.results import machine_metadata, new_document

    return new_document(machine=machine_metadata(), sut=dict(sut), loadgen={})
