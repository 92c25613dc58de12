"""How often does `harness peak`'s stated interval hold the true edge, and how wide is it?

Drives the real search (`harness.peak.search.PeakSearch`) against synthetic servers whose
points meet the SLO with probability 1 / (1 + e^((rate − 400) / scale)), for sharp and
gradual edges, and prints per scale: how often [L, U] (the repeats' interval, nominally
75 % at 3 repeats) held the edge among the searches whose repeats completed, its median
width; how often the refined fit's 95 % interval (the stated one, `--precision`) held
it, its median and largest width, the share that reached the precision within the
point budget, the points used, and how many consecutive triples of searches pass the
3-run criterion (every pair's difference within the root sum of squares of their
facing half-widths, as bench/peak.py judges measured runs). ``--drift`` makes the edge wander from point to point (an AR(1) series) —
a machine whose speed moves over minutes — to show what no interval from one run's
points can see. Pure computation (no server, no load), fixed seeds.

    python bench/edge_coverage.py                  # 300 / 90 searches per scale
    python bench/edge_coverage.py --runs 300 --refine-runs 90 --precision 0.15
    python bench/edge_coverage.py --runs 0 --refine-runs 180 --scales 25,35,50 --min-each 4
    python bench/edge_coverage.py --runs 0 --refine-runs 90 --scales 35 --drift 0.05
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from harness.analysis.edge import answers_agree, edge_confidence
from harness.peak.outcomes import Point, fit_edge
from harness.peak.search import REFINE_MIN_EACH, PeakSearch, SearchParams

EDGE = 400.0


def drive(
    search: PeakSearch, scale: float, seed: int, drift: float = 0.0, corr: float = 0.0
) -> PeakSearch:
    """Feed the search synthetic outcomes. With ``drift`` the edge moves from point to
    point as EDGE · (1 + d), d an AR(1) series with standard deviation ``drift`` and
    correlation ``corr`` between consecutive points: a machine whose speed wanders over
    minutes. The edge to cover is then EDGE, the edge a rerun at another time aims at."""
    rng = random.Random(seed)
    d = rng.gauss(0.0, drift)
    for _ in range(200):
        step = search.next_step()
        if step.rate_rps is None:
            return search
        edge = EDGE * (1.0 + d)
        met = rng.random() < 1.0 / (1.0 + math.exp((step.rate_rps - edge) / scale))
        search.record(Point(step.rate_rps, "met" if met else "missed"))
        d = corr * d + math.sqrt(1.0 - corr * corr) * rng.gauss(0.0, drift)
    raise RuntimeError("the search did not stop")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="searches per scale for [L, U]")
    ap.add_argument("--refine-runs", type=int, default=90, help="searches per scale, refined")
    ap.add_argument("--precision", type=float, default=0.15)
    ap.add_argument("--max-points", type=int, default=48)
    ap.add_argument("--scales", default="2,8,25,50")
    ap.add_argument("--drift", type=float, default=0.0, help="sd of the edge's drift, e.g. 0.05")
    ap.add_argument("--drift-corr", type=float, default=0.9, help="its point-to-point correlation")
    ap.add_argument(
        "--min-each",
        type=int,
        default=REFINE_MIN_EACH,
        help="meets and misses the refine points must include before the search stops",
    )
    a = ap.parse_args()
    started = time.monotonic()
    print(
        f"edge {EDGE:g} req/s; [L, U]: repeats 3, 30-point budget, {a.runs} searches; refined: "
        f"precision {a.precision:.0%}, {a.max_points}-point budget, {a.refine_runs} searches; "
        f"{a.min_each} meets and misses among the refine points; drift sd {a.drift:.0%}, "
        f"correlation {a.drift_corr:g}"
    )
    print(
        "| scale req/s | [L, U] held | median width | refined 95 % held | median width "
        "| widest | reached precision | points median / max | triples agreeing |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for scale in (float(x) for x in a.scales.split(",")):
        claimed = held = 0
        widths = []
        for seed in range(a.runs):
            est = drive(
                PeakSearch(SearchParams(100.0, repeats=3, max_points=30)),
                scale,
                seed,
                a.drift,
                a.drift_corr,
            )
            e = est.estimate()
            if e.confidence > 0:
                claimed += 1
                held += e.low_rps <= EDGE <= e.high_rps
                widths.append(e.high_rps / e.low_rps - 1)
        cov = hits = reached = 0
        rw: list[float] = []
        pts: list[int] = []
        answers: list[tuple[float, float, float]] = []
        for seed in range(a.refine_runs):
            params = SearchParams(
                100.0,
                repeats=3,
                max_points=a.max_points,
                precision=a.precision,
                refine_min_each=a.min_each,
            )
            s = drive(PeakSearch(params), scale, seed, a.drift, a.drift_corr)
            fit = fit_edge(s.points)
            lo, hi = fit.ci_rps if fit else (None, None)
            lo, hi = lo or 0.0, hi or math.inf
            cov += 1
            hits += lo <= EDGE <= hi
            w = (hi - lo) / fit.edge_rps if fit else math.inf
            rw.append(w)
            reached += w <= a.precision
            pts.append(len(s.points))
            if fit:
                answers.append((fit.edge_rps, lo, hi))
        # the 3-run criterion (bench/peak.py's) on consecutive triples of searches
        triples = [answers[i : i + 3] for i in range(0, len(answers) - 2, 3)]
        agree = sum(
            all(answers_agree(x, y) for j, x in enumerate(tr) for y in tr[j + 1 :])
            for tr in triples
        )
        print(
            f"| {scale:g} | {held / max(claimed, 1):.0%} of {claimed} "
            f"(nominal {edge_confidence(3):.0%}) | {statistics.median(widths or [math.nan]):.1%} "
            f"| {hits / cov:.0%} | {statistics.median(rw):.1%} | {max(rw):.1%} "
            f"| {reached / cov:.0%} | {statistics.median(pts):g} / {max(pts)} "
            f"| {agree} of {len(triples)} |"
        )
    print(f"\n{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
