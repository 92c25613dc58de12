"""Ranking a tune's configurations on what their searches measured.

A configuration's result (``config_result``) is its search's [L, U], its figures at L and
its status (``config_status``: measured, not measured, failed). Ranks say only what was
measured (``standing``): one configuration is better than another when it held the SLO
in every outcome up to a rate at least one tolerance above the rate from which the other
missed it in every outcome; configurations the search did not separate share a rank.
The measured cases behind each rule: docs/peak-measurements.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.peak.outcomes import INVALID_TRIES, Point, Verdicts
from harness.peak.point import server_gone
from harness.peak.search import PeakSearch, SearchParams
from harness.peak.tune.space import Config, key
from harness.results.peak_records import (
    FAILED,
    MEASURED,
    NOT_MEASURED,
    evidence,
    met_once,
    status,
)

DID_NOT_START = "the server did not start"


def config_result(
    cfg: Config,
    points: Sequence[Point],
    why: str,
    cmd: str,
    floor_rps: float | None = None,
    repeats: int = 1,
    tolerance: float = 0.1,
    max_points: int = 40,
    search_limit: str | None = None,
) -> dict[str, Any]:
    """What one configuration's search found (peak = L: the highest rate that met the SLO
    in every repeat below every rate that missed it in every repeat; its p99, CPU/request
    and RSS at that rate) and its status (``config_status``). ``search_limit``: how its
    own search ended, when ``points`` hold more than that search's (head-to-head points,
    which move [L, U] but not what stopped the search)."""
    params = SearchParams(
        # where the search began: it decides the next step only while nothing was judged
        start_rps=points[0].rate_rps if points and points[0].rate_rps > 0 else 1.0,
        repeats=repeats,
        tolerance=tolerance,
        max_points=max_points,
        min_rps=floor_rps or 1.0,
    )
    est = PeakSearch(params, points).estimate()
    limit = est.limit if est.limit == "server_exit" else (search_limit or est.limit)
    status, reason = config_status(points, why, limit, max_points)
    at = None
    if est.low_rps is not None and status == MEASURED:
        cands = [p for p in points if p.outcome == "met" and abs(p.rate_rps - est.low_rps) < 0.01]
        at = cands[-1] if cands else None
    return {
        "key": key(cfg),
        "config": dict(cfg),
        "cmd": cmd,
        "status": status,
        "status_reason": reason,
        # measured: L, or 0.0 (judged, and no rate met the SLO in every repeat); None when
        # not measured or failed — no peak to rank or recommend
        "peak_rps": (est.low_rps or 0.0) if status == MEASURED else None,
        "held_rps": est.low_rps,  # L as far as the points went, whatever the status
        "upper_rps": est.high_rps,
        "limit": limit,
        "repeats": repeats,
        "confidence": est.confidence,  # of [peak, upper] holding the edge (0: no repeats)
        "stopped": why,
        "floor_rps": floor_rps,
        "max_points": max_points,
        "p99_at_peak_ms": at.p99_ms if at else None,
        "p50_at_peak_ms": at.p50_ms if at else None,
        "tpot_p99_at_peak_ms": at.tpot_p99_ms if at else None,
        "cpu_ms_per_request": at.cpu_ms_per_request if at else None,
        "rss_mib": max((p.rss_mib for p in points if p.rss_mib is not None), default=None),
        # server lifetimes the search ran on (its repeats each on a fresh server)
        "lifetimes": len({p.lifetime for p in points if p.lifetime is not None}) or 1,
        "points": [p.as_dict() for p in points],
        "n_points": len(points),
    }


def config_status(
    points: Sequence[Point], why: str, limit: str | None, max_points: int
) -> tuple[str, str | None]:
    """(status, why) of a configuration's search: ``failed`` when its server died during a
    point ("crashed at 450.0 req/s (the server exited (signal 9, SIGKILL), point 7)") or
    would not start; ``measured`` when the search ended at the server's edge (limit
    ``slo``) or found no rate that met the SLO (``none_met``); else ``not_measured``, with
    what stopped it instead — the load generator, the point budget, the search's ceiling:
    what `harness peak` calls no answer (exit 3)."""
    for i, q in enumerate(points, start=1):
        if q.server_exit is not None:
            at = f"at {q.rate_rps:.1f} req/s" if q.rate_rps > 0 else "while calibrating"
            return FAILED, f"crashed {at} ({q.server_exit}, point {i})"
    if why.startswith(DID_NOT_START) or server_gone(why):
        return FAILED, why
    if limit in ("slo", "none_met"):
        return MEASURED, None
    if limit == "generator":
        v = Verdicts.of(points)
        at = [r for r in v.by_rate if v.invalid_count(r) >= INVALID_TRIES]
        return NOT_MEASURED, (
            "the load generator, not the server, was the limit"
            + (f" ({max(at):.1f} req/s invalid {INVALID_TRIES} times)" if at else "")
        )
    if limit == "max_rps":
        return NOT_MEASURED, f"it met the SLO up to the search's ceiling ({why})"
    if limit == "budget" and len(points) >= max_points:
        return NOT_MEASURED, (
            f"its {max_points}-point budget was spent before the server's edge was found"
        )
    return NOT_MEASURED, f"its search stopped before the server's edge was found ({why})"


def standing(results: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, int]:
    """Each measured configuration's rank: 1 + how many others were *measured* better —
    held the SLO in every outcome up to a rate at least ``tolerance`` above the one from
    which it missed the SLO in every outcome (``evidence``). Configurations no other one
    was measured better than share rank 1, and so on: the search resolves peaks to its
    tolerance (it stops bisecting a bracket that narrow, and the table ties peaks that
    close), so two whose evidence overlaps, or is apart by less than that, are not
    separated, and the table says so ("=3") instead of ordering them on noise; an order
    finer than the search's own resolution is one set of server lifetimes, not the
    configurations. Judged on every outcome, not on [L, U] alone: a search out of points
    can leave U on one miss that mets above it contradict.

    A configuration that never missed (no ``missed_from``) has no one measured better. One
    that met the SLO nowhere (peak 0, no point met: it missed everywhere the search looked,
    and the tune stops looking below its floor, so its edge is not resolved) is out of the
    running: every configuration that held the SLO somewhere is better than it. One whose
    repeats met somewhere but missed at every rate it measured (peak 0 too: p99 hovering at
    the SLO over a range of rates, no rate met in every repeat) has its edge inside what was
    measured, not below the floor: it is judged like any other, on where it missed in every
    outcome. One with every point invalid (peak None) has no rank; nor has one not measured
    or failed (``status``): ``rank`` places those. The tunes that showed why each rule is
    needed: docs/peak-measurements.md."""
    measured = [r for r in results if status(r) == MEASURED]
    ev = {r["key"]: evidence(r) for r in measured}
    out: dict[str, int] = {}
    for r in measured:
        missed_from = ev[r["key"]][1]
        better = 0
        if not float(r["peak_rps"]) and not met_once(r):
            better = sum(1 for h in measured if ev[h["key"]][0] is not None)
        elif missed_from is not None:
            better = sum(
                1
                for h in measured
                if h["key"] != r["key"]
                and ev[h["key"]][0] is not None
                and float(ev[h["key"]][0]) >= float(missed_from) * (1 + tolerance)
            )
        out[r["key"]] = 1 + better
    return out


def contested(
    results: Sequence[Mapping[str, Any]], tolerance: float, band: float
) -> dict[str, list[tuple[str, float, float]]]:
    """The separations that alone keep a configuration out of rank 1, each closer than
    ``band``: for a configuration r some other one is measured better than (``standing``),
    where every one of those held the SLO less than ``band`` above the rate from which r
    missed it, the list of (better one, the rate it held, the rate r missed from). Those
    decide the recommendation and where the climb goes on from, and they are the ones a
    drift over minutes can make: a configuration's points run back to back, so a few slow
    minutes land on one configuration's whole evidence (measured: docs/peak.md, "Head to
    head"). A separation wider than ``band``
    on every side is not contested: a configuration that far below is a dominated
    direction to the climb as well (``TuneConfig.prune_margin``)."""
    measured = [r for r in results if status(r) == MEASURED]
    ev = {r["key"]: evidence(r) for r in measured}
    out: dict[str, list[tuple[str, float, float]]] = {}
    for r in measured:
        missed_from = ev[r["key"]][1]
        if (not float(r["peak_rps"]) and not met_once(r)) or missed_from is None:
            continue
        better = [
            (h["key"], float(ev[h["key"]][0]), float(missed_from))
            for h in measured
            if h["key"] != r["key"]
            and ev[h["key"]][0] is not None
            and float(ev[h["key"]][0]) >= float(missed_from) * (1 + tolerance)
        ]
        if better and all(held < missed_from * (1 + band) for _, held, _ in better):
            out[r["key"]] = better
    return out


def rank(results: Sequence[Mapping[str, Any]], tolerance: float) -> list[Mapping[str, Any]]:
    """Best first, each row with its ``rank`` (``standing``; shared ranks are ties the
    search could not separate). Within a rank: the highest peak under the SLO; peaks within
    ``tolerance`` of the best peak of their group are a tie, broken by CPU per request
    (lower first), then by key. Configurations that failed (the server died during a point,
    or would not start) rank below every measured one (each measured one is better);
    configurations not measured (``status``) come last, unranked: they have no peak to
    rank on."""
    ranks = standing(results, tolerance)
    failed = sorted((r for r in results if status(r) == FAILED), key=lambda r: r["key"])
    unmeasured = sorted((r for r in results if status(r) == NOT_MEASURED), key=lambda r: r["key"])
    results = [r for r in results if status(r) == MEASURED]
    out: list[Mapping[str, Any]] = []
    for level in sorted(set(ranks.values())):
        ordered = sorted(
            (r for r in results if ranks[r["key"]] == level),
            key=lambda r: (-float(r["peak_rps"] or 0.0), r["key"]),
        )
        i = 0
        while i < len(ordered):
            head = float(ordered[i]["peak_rps"] or 0.0)
            group = [
                r for r in ordered[i:] if float(r["peak_rps"] or 0.0) >= head * (1 - tolerance)
            ]
            if head <= 0:
                group = ordered[i:]
            group.sort(
                key=lambda r: (
                    r.get("cpu_ms_per_request") is None,
                    r.get("cpu_ms_per_request") or 0.0,
                    r["key"],
                )
            )
            out += [{**r, "rank": level} for r in group]
            i += len(group)
    out += [{**r, "rank": 1 + len(results)} for r in failed]
    return out + [{**r, "rank": None} for r in unmeasured]  # last: no evidence to rank them on


def tied_with(ranked: Sequence[Mapping[str, Any]], k: str) -> list[str]:
    """The other configurations sharing ``k``'s rank (not separated from it by the search)."""
    mine = next((r.get("rank") for r in ranked if r["key"] == k), None)
    if mine is None:
        return []
    return [r["key"] for r in ranked if r["key"] != k and r.get("rank") == mine]


def pareto(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Keys on the throughput–p99 Pareto front: no other configuration has both a higher
    (or equal) peak and a lower (or equal) p99 at its peak, one of them strictly."""
    pts = [
        (r["key"], float(r["peak_rps"]), float(r["p99_at_peak_ms"]))
        for r in results
        if r.get("peak_rps") and r.get("p99_at_peak_ms") is not None
    ]
    front = []
    for k, x, y in pts:
        dominated = any(
            (x2 >= x and y2 <= y) and (x2 > x or y2 < y) for k2, x2, y2 in pts if k2 != k
        )
        if not dominated:
            front.append(k)
    return front
