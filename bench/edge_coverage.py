"""How often does `harness peak`'s stated interval hold the true edge, and how wide is it?

Drives the real search (`harness.peak.search.PeakSearch`) against synthetic servers whose
points meet the SLO with probability 1 / (1 + e^((rate − 400) / scale)), for sharp and
gradual edges, and prints per scale: how often [L, U] (the repeats' interval, nominally
75 % at 3 repeats) held the edge among the searches whose repeats completed, its median
width; how often the refined fit's 95 % interval (the stated one, `--precision`) held
it, its median and largest width, the share that reached the precision within the
point budget, and the points used. Pure computation (no server, no load), fixed seeds.

    python bench/edge_coverage.py                  # 300 / 90 searches per scale
    python bench/edge_coverage.py --runs 300 --refine-runs 90 --precision 0.15
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from harness.peak.search import PeakSearch, Point, SearchParams, edge_confidence, fit_edge

EDGE = 400.0


def drive(search: PeakSearch, scale: float, seed: int) -> PeakSearch:
    rng = random.Random(seed)
    for _ in range(200):
        step = search.next_step()
        if step.rate_rps is None:
            return search
        met = rng.random() < 1.0 / (1.0 + math.exp((step.rate_rps - EDGE) / scale))
        search.record(Point(step.rate_rps, "met" if met else "missed"))
    raise RuntimeError("the search did not stop")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="searches per scale for [L, U]")
    ap.add_argument("--refine-runs", type=int, default=90, help="searches per scale, refined")
    ap.add_argument("--precision", type=float, default=0.15)
    ap.add_argument("--max-points", type=int, default=48)
    ap.add_argument("--scales", default="2,8,25,50")
    a = ap.parse_args()
    started = time.monotonic()
    print(
        f"edge {EDGE:g} req/s; [L, U]: repeats 3, 30-point budget, {a.runs} searches; refined: "
        f"precision {a.precision:.0%}, {a.max_points}-point budget, {a.refine_runs} searches"
    )
    print(
        "| scale req/s | [L, U] held | median width | refined 95 % held | median width "
        "| widest | reached precision | points median / max |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for scale in (float(x) for x in a.scales.split(",")):
        claimed = held = 0
        widths = []
        for seed in range(a.runs):
            est = drive(PeakSearch(SearchParams(100.0, repeats=3, max_points=30)), scale, seed)
            e = est.estimate()
            if e.confidence > 0:
                claimed += 1
                held += e.low_rps <= EDGE <= e.high_rps
                widths.append(e.high_rps / e.low_rps - 1)
        cov = hits = reached = 0
        rw: list[float] = []
        pts: list[int] = []
        for seed in range(a.refine_runs):
            params = SearchParams(100.0, repeats=3, max_points=a.max_points, precision=a.precision)
            s = drive(PeakSearch(params), scale, seed)
            fit = fit_edge(s.points)
            lo, hi = fit.ci_rps if fit else (None, None)
            lo, hi = lo or 0.0, hi or math.inf
            cov += 1
            hits += lo <= EDGE <= hi
            w = (hi - lo) / fit.edge_rps if fit else math.inf
            rw.append(w)
            reached += w <= a.precision
            pts.append(len(s.points))
        print(
            f"| {scale:g} | {held / max(claimed, 1):.0%} of {claimed} "
            f"(nominal {edge_confidence(3):.0%}) | {statistics.median(widths):.1%} "
            f"| {hits / cov:.0%} | {statistics.median(rw):.1%} | {max(rw):.1%} "
            f"| {reached / cov:.0%} | {statistics.median(pts):g} / {max(pts)} |"
        )
    print(f"\n{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
