"""The peak search, pure: which rate to measure next, and what the measured points say.

The field's recipe (MLPerf LoadGen's FindPeakPerformance for its Server scenario,
perf_analyzer's ``--binary-search`` under ``--latency-threshold``): raise the offered
rate until a point misses the latency bound (*bracketing*), then halve the interval
between the last rate that met it and the first that missed (*bisection*) until it is
narrower than a tolerance. One run of that search is one sample of a noisy edge, so
neither tool says how far its answer would move on a rerun. This search adds an *edge
phase*: the two rates bounding the final interval are measured again until each has
``repeats`` outcomes; a rate whose repeats disagree is "mixed" and the bound moves one
tolerance step outward until it holds. The result is an interval [L, U]: at L the SLO
held in every repeat, at U it was missed in every repeat.

For a rate fixed in advance, [L, U] would hold the edge (the rate met half the time)
with confidence 1 − 2·½^repeats; the search picks L and U *after* seeing the outcomes,
which costs coverage on a gradual edge. So `harness peak` states another interval: after
the edge repeats, a *refine phase* measures at the fitted logistic's D-optimal rates
(edge ∓ 1.54 scale) until the fitted edge's 95 % profile-likelihood interval
(``harness.analysis.edge.EdgeFit``) is within ``precision`` of it. [L, U] stays in the
results as what the repeats showed, and is what `harness tune` ranks on (its peak is L).
The coverage of both intervals, simulated and measured: docs/peak-measurements.md.

The search treats an insufficient point (``harness.peak.outcomes``) as not earned
(measured again once at double length, then a miss), and an invalid one as no
information (measured up to ``INVALID_TRIES`` times; a bisection midpoint that stays
invalid is sidestepped when a higher rate was valid, otherwise the search stops with the
generator as the limit). A point during which the server died stops the search for
good: a server that crashes under load has failed, whatever the rates below it held.

Everything here is a function of the points measured so far, so a search is resumed by
feeding it the points a killed run had already recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from harness.analysis.edge import (
    EDGE_CI,
    edge_confidence,
)
from harness.peak.outcomes import (
    INVALID_TRIES,
    Point,
    Verdicts,
    fit_edge,
)

__all__ = [
    "D_OPTIMAL",
    "REFINE_MIN_EACH",
    "Estimate",
    "PeakSearch",
    "SearchParams",
    "Step",
    "samples_needed",
    "server_exit_step",
]

Phase = Literal["bracket", "bisect", "edge", "refine", "done"]
# the refine phase ends only after this many meets and this many misses among its own
# points: a bracket's few points can look separated by chance, and then the fit's scale
# (how gradual the edge is) comes from the penalty, not from outcomes; and stopping as
# soon as the interval is narrow enough picks the runs whose scale came out small by
# chance, so the stated interval would hold the edge less often than it says (the
# simulated coverage with 4 and with 8 each: docs/peak-measurements.md)
REFINE_MIN_EACH = 8
# refine points sit where P(met) is 0.82 and 0.18 of the fitted logistic: edge ∓ 1.54 scale
# (the D-optimal design for a two-parameter logistic fit)
D_OPTIMAL = 1.5434


@dataclass(frozen=True)
class SearchParams:
    start_rps: float  # the first rate measured
    tolerance: float = 0.05  # stop bisecting when (hi - lo) / lo <= tolerance
    repeats: int = 3  # outcomes per edge rate (1 = no edge phase)
    up_factor: float = 1.5  # bracketing: multiply the rate while it meets the SLO
    down_factor: float = 0.5  # bracketing: multiply while it misses
    min_rps: float = 1.0  # below this the server meets nothing: stop
    max_rps: float = 1e6
    max_points: int = 40
    # refine phase: after the edge repeats, points at the fitted logistic's D-optimal rates
    # until the edge's 95 % interval is at most this fraction of the edge (None: no refine)
    precision: float | None = None
    # meets and misses the refine points must include before the refine phase may stop
    refine_min_each: int = REFINE_MIN_EACH

    def __post_init__(self) -> None:
        if not self.start_rps > 0:
            raise ValueError(f"start_rps must be > 0, got {self.start_rps}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not (self.up_factor > 1 and 0 < self.down_factor < 1):
            raise ValueError("up_factor must be > 1 and down_factor in (0, 1)")
        if self.precision is not None and not 0 < self.precision < 1:
            raise ValueError(f"precision must be in (0, 1), got {self.precision}")


@dataclass(frozen=True)
class Step:
    """The search's next move: measure ``rate_rps`` (``longer``: at double length,
    because the last try at that rate had too few samples), or stop (``rate_rps`` None)."""

    phase: Phase
    rate_rps: float | None
    why: str
    longer: bool = False
    # why it stopped: found (the edge, within tolerance / repeats), none_met, max_rps,
    # budget (points spent), generator (a rate the generator could not offer),
    # server_exit (the server died during a point)
    stop: str | None = None


@dataclass(frozen=True)
class Estimate:
    """What the points say about the peak."""

    low_rps: float | None  # L: met the SLO in every repeat
    high_rps: float | None  # U: missed it in every repeat
    peak_rps: float | None  # midpoint of [L, U]; L alone when U is unknown
    confidence: float  # nominal, 0 when the repeats did not complete (edge_confidence)
    # slo: the server's edge, found; none_met: no rate met the SLO (a verdict);
    # server_exit: the server died during a point (a failure); generator, max_rps, budget:
    # the search was stopped by the load generator, its ceiling or its point budget — no
    # answer about the server
    limit: Literal["slo", "generator", "none_met", "max_rps", "budget", "server_exit"] | None
    mixed_rps: tuple[float, ...] = ()  # rates whose repeats disagreed
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mixed_rps"] = list(self.mixed_rps)
        return d


class PeakSearch:
    """Bracketing, bisection, edge repeats; a pure function of the points so far."""

    def __init__(self, params: SearchParams, points: Sequence[Point] = ()) -> None:
        self.params = params
        self.points: list[Point] = list(points)

    def record(self, point: Point) -> None:
        self.points.append(point)

    # -- the decision -------------------------------------------------------------------

    def next_step(self) -> Step:
        crashed = server_exit_step(self.points)
        if crashed is not None:
            return crashed
        if self.params.precision is None:
            return self._plain_next()
        n0, found = self._plain_end()
        if found is None:  # bracketing, bisection or the edge repeats still going
            return self._plain_next()
        if found.stop != "found":  # stopped without an edge (none met, generator, budget)
            return found
        return self._refine(found, n0)

    def _plain_end(self) -> tuple[int, Step | None]:
        """Where the search without the refine phase stopped: (the number of points it
        had used, its stop step), or (len(points), None) if it has not stopped yet."""
        plain = PeakSearch(replace(self.params, precision=None))
        for i, q in enumerate(self.points):
            step = plain.next_step()
            if step.phase == "done":
                return i, step
            plain.record(q)
        step = plain.next_step()
        return len(self.points), (step if step.phase == "done" else None)

    def _plain_next(self) -> Step:
        p = self.params
        v = Verdicts.of(self.points)
        # the budget stops a search that would measure more; a search whose last point
        # settled its answer (the edge's last repeat) stopped on that answer
        spent = len(self.points) >= p.max_points
        budget = Step("done", None, f"point budget of {p.max_points} spent", stop="budget")
        # a rate still owed a retry (insufficient: once at double length; invalid: once)
        if self.points:
            last = self.points[-1]
            retry: Step | None = None
            if last.outcome == "insufficient" and v.insufficient_pending(last.rate_rps):
                why = "too few samples: again, twice as long"
                retry = Step(self._phase(v), last.rate_rps, why, True)
            elif last.outcome == "invalid" and v.invalid_count(last.rate_rps) < INVALID_TRIES:
                retry = Step(self._phase(v), last.rate_rps, "invalid point: measured again")
            if retry is not None:
                return budget if spent else retry
        step = self._decide(v)
        if step.phase == "done":
            return step
        if spent:
            return budget
        if step.rate_rps is not None and v.invalid_count(step.rate_rps) >= INVALID_TRIES:
            return Step(
                "done",
                None,
                f"{step.rate_rps:.1f} req/s was invalid {INVALID_TRIES} times (the load generator, not the "
                "server, was the limit there)",
                stop="generator",
            )
        return step

    def _decide(self, v: Verdicts) -> Step:
        p = self.params
        ok = lambda r: v.invalid_count(r) < INVALID_TRIES  # noqa: E731 (still measurable)
        lo, hi = self._bracket(v)
        if not v.by_rate:
            return Step("bracket", p.start_rps, "first point")
        if lo is None and hi is None:  # only invalid points so far: the first rate again
            return Step("bracket", p.start_rps, "first point")
        if hi is None:  # everything measured met: go up
            nxt = (lo or p.start_rps) * p.up_factor
            if nxt > p.max_rps:
                return Step(
                    "done", None, f"met up to the {p.max_rps:g} req/s ceiling", stop="max_rps"
                )
            return Step("bracket", nxt, "met the SLO: raise the rate")
        if lo is None and any("met" in v.judged(r) for r in v.by_rate):
            # every rate measured missed at least once, but some also met: the repeats (on
            # fresh servers, in a tune) disagree near the lowest rate, so the edge is just
            # below it, not half as low — step down by the tolerance, as the edge phase
            # does (halving would stop below the floor at a rate never measured)
            return self._below_lowest(v, "every rate missed at least once, some also met")
        if lo is None:  # everything measured missed: go down
            nxt = hi * p.down_factor
            if nxt < p.min_rps:
                return Step(
                    "done", None, f"missed the SLO down to {p.min_rps:g} req/s", stop="none_met"
                )
            return Step("bracket", nxt, "missed the SLO: lower the rate")
        if (hi - lo) / lo > p.tolerance:
            # the midpoint, or a third of the way either side when the midpoint could not
            # be measured (invalid every try: a noisy box, not a limit — higher rates were valid)
            for mid in ((lo + hi) / 2.0, (lo + 2 * hi) / 3.0, (2 * lo + hi) / 3.0):
                if ok(mid):
                    return Step("bisect", mid, f"bisect [{lo:.1f}, {hi:.1f}]")
            return Step("bisect", (lo + hi) / 2.0, f"bisect [{lo:.1f}, {hi:.1f}]")
        if p.repeats <= 1:
            return Step("done", None, "interval within tolerance", stop="found")
        # edge phase: L must meet in every repeat, U miss in every repeat
        L, U = self._edge(v)
        # the two edges' repeats alternate (L, U, L, U, …): each rate's repeats are spread
        # over the edge phase, so a box that drifts meanwhile shows as mixed outcomes
        owed = []
        if L is not None and len(v.judged(L)) < p.repeats and v.all_met(L, len(v.judged(L))):
            owed.append((len(v.judged(L)), 0, L, "lower"))
        if U is not None and len(v.judged(U)) < p.repeats and v.all_missed(U, len(v.judged(U))):
            owed.append((len(v.judged(U)), 1, U, "upper"))
        if owed:
            n, _, rate, side = min(owed)
            return Step("edge", rate, f"repeat the {side} edge ({n + 1}/{p.repeats})")
        if L is None:  # every rate measured missed at least once: step below them all
            return self._below_lowest(v, "the lower edge was mixed")
        if U is None:
            nxt = self._above(v, L) * (1.0 + p.tolerance)
            if nxt > p.max_rps:
                return Step("done", None, "no rate missed the SLO in every repeat", stop="max_rps")
            return Step("edge", nxt, "the upper edge was mixed: step up")
        return Step(
            "done",
            None,
            f"edge found: [{L:.1f}, {U:.1f}] in {p.repeats} repeats each",
            stop="found",
        )

    def _refine(self, found: Step, n0: int) -> Step:
        """After the edge is found: measure at the fitted edge ∓ 1.54 scale (alternating
        below and above it) until the fit's 95 % interval is within ``precision`` of the
        edge. One 5-second point is a noisy coin near the edge; the bracket's few points
        pin a sharp edge but leave a gradual one (outcomes mixed over ±10 %) known only to
        ±20 %, and the points needed grow with the square of the edge's width — so the
        refine phase spends them where they inform the fit most, and stops when the
        interval is as narrow as asked."""
        p = self.params
        assert p.precision is not None
        v = Verdicts.of(self.points)
        if self.points and len(self.points) > n0:  # a refine rate still owed a retry
            last = self.points[-1]
            if last.outcome == "insufficient" and v.insufficient_pending(last.rate_rps):
                return Step("refine", last.rate_rps, "too few samples: again, twice as long", True)
            if last.outcome == "invalid" and v.invalid_count(last.rate_rps) < INVALID_TRIES:
                return Step("refine", last.rate_rps, "invalid point: measured again")
        fit = fit_edge(self.points, EDGE_CI)
        if fit is None:
            return found
        lo, hi = fit.ci_rps
        near = [q.outcome for q in self.points[n0:]]
        straddled = min(near.count("met"), near.count("missed")) >= p.refine_min_each
        if (
            straddled
            and lo is not None
            and hi is not None
            and (hi - lo) / fit.edge_rps <= p.precision
        ):
            return replace(
                found,
                why=f"{found.why}; fitted edge {fit.edge_rps:.1f} req/s, 95 % interval "
                f"[{lo:.1f}, {hi:.1f}] within {p.precision:.0%}",
            )
        width = "open" if lo is None or hi is None else f"{(hi - lo) / fit.edge_rps:.0%}"
        tally = f"{near.count('met')} met / {near.count('missed')} missed near the edge"
        if len(self.points) >= p.max_points:
            return replace(
                found,
                why=f"{found.why}; point budget of {p.max_points} spent refining: the fitted "
                f"edge's 95 % interval is {width} wide (asked {p.precision:.0%}), {tally} "
                f"(asked {p.refine_min_each} each)",
            )
        offset = max(D_OPTIMAL * fit.scale_rps, 0.005 * fit.edge_rps)
        refine = [q.rate_rps for q in self.points[n0:] if q.outcome != "invalid"]
        below = sum(1 for r in refine if r < fit.edge_rps)
        rate = fit.edge_rps + offset if below > len(refine) - below else fit.edge_rps - offset
        if lo is not None:
            rate = max(rate, lo)
        if hi is not None:
            rate = min(rate, hi)
        rate = round(min(max(rate, p.min_rps), p.max_rps), 2)
        if v.invalid_count(rate) >= INVALID_TRIES:
            return replace(
                found,
                why=f"{found.why}; refining stopped: {rate:.1f} req/s was invalid "
                f"{INVALID_TRIES} times (the fitted edge's 95 % interval is {width} wide)",
            )
        return Step(
            "refine",
            rate,
            f"refine the fitted edge {fit.edge_rps:.1f} req/s (95 % interval {width} wide, "
            f"asked {p.precision:.0%}; {tally})",
        )

    def _phase(self, v: Verdicts) -> Phase:
        lo, hi = self._bracket(v)
        if lo is None or hi is None:
            return "bracket"
        return "bisect" if (hi - lo) / lo > self.params.tolerance else "edge"

    @staticmethod
    def _bracket(v: Verdicts) -> tuple[float | None, float | None]:
        """lo: the highest rate whose outcomes all met, below every rate with a miss;
        hi: the lowest rate with a miss (above lo)."""
        rates = sorted(r for r in v.by_rate if v.judged(r))
        missed = [r for r in rates if "missed" in v.judged(r)]
        hi = min(missed) if missed else None
        met = [r for r in rates if v.all_met(r, 1) and (hi is None or r < hi)]
        lo = max(met) if met else None
        return lo, hi

    def _edge(self, v: Verdicts) -> tuple[float | None, float | None]:
        """L: the highest rate whose judged outcomes all met, below the lowest rate whose
        outcomes all missed; U: the lowest rate above L whose outcomes all missed."""
        rates = sorted(r for r in v.by_rate if v.judged(r))
        first_all_missed = [r for r in rates if v.all_missed(r, 1)]
        # L: highest all-met rate that is below the lowest all-missed rate
        cap = min(first_all_missed) if first_all_missed else math.inf
        mets = [r for r in rates if v.all_met(r, 1) and r < cap]
        L = max(mets) if mets else None
        above = [r for r in rates if L is None or r > L]
        Us = [r for r in above if v.all_missed(r, 1)]
        U = min(Us) if Us else None
        return L, U

    def _below_lowest(self, v: Verdicts, why: str) -> Step:
        """One tolerance below the lowest rate judged (its outcomes mixed), or stop when
        that is below the floor: no rate met the SLO in every repeat."""
        p = self.params
        lowest = min(r for r in v.by_rate if v.judged(r))
        nxt = lowest / (1.0 + p.tolerance)
        if nxt < p.min_rps:
            return Step(
                "done",
                None,
                f"no rate met the SLO in every repeat (mixed down to {lowest:g} req/s, "
                f"the floor is {p.min_rps:g})",
                stop="none_met",
            )
        return Step("edge", nxt, f"{why}: step down")

    @staticmethod
    def _above(v: Verdicts, L: float) -> float:
        """The highest measured rate above L (the mixed ones), or L."""
        higher = [r for r in v.by_rate if r > L and v.judged(r)]
        return max(higher) if higher else L

    # -- the answer ---------------------------------------------------------------------

    def estimate(self) -> Estimate:
        """[L, U] and how the search stopped. With a refine phase, [L, U] is what the
        bracketing, bisection and edge repeats proved (the refine points feed the fit
        only: a single refine outcome between L and U is not a repeated bound). A server
        that died during a point is the answer (limit ``server_exit``), with [L, U] as far
        as the points before it went."""
        crashed = server_exit_step(self.points)
        if crashed is not None:
            before = [q for q in self.points if q.server_exit is None]
            est = PeakSearch(replace(self.params, precision=None), before).estimate()
            return replace(
                est, peak_rps=None, confidence=0.0, limit="server_exit", note=crashed.why
            )
        if self.params.precision is not None:
            n0, found = self._plain_end()
            plain = PeakSearch(replace(self.params, precision=None), self.points[:n0])
            est = plain.estimate()
            if found is None:  # cut before the edge was found
                return replace(est, limit="budget", confidence=0.0)
            return est
        p = self.params
        v = Verdicts.of(self.points)
        step = self.next_step()
        L, U = self._edge(v)
        k = p.repeats
        mixed = tuple(
            sorted(
                r
                for r in v.by_rate
                if len(set(v.judged(r))) > 1 and (L is None or r > L) and (U is None or r < U)
            )
        )
        stop = step.stop if step.phase == "done" else "budget"
        if L is None:
            # "none met" is a verdict: only when rates were judged and missed, not when the
            # search stopped with nothing judged (every point invalid: no evidence either way)
            judged = any(v.judged(r) for r in v.by_rate)
            none: Any = "generator" if stop == "generator" else ("none_met" if judged else "budget")
            return Estimate(None, U, None, 0.0, none, mixed, step.why)
        confident = k > 1 and v.all_met(L, k) and U is not None and v.all_missed(U, k)
        conf = edge_confidence(k) if confident and stop == "found" else 0.0
        if U is None:
            limit: Any = stop if stop in ("generator", "max_rps") else "budget"
            return Estimate(L, None, L, 0.0, limit, mixed, step.why)
        limit = "slo" if stop == "found" else (stop or "budget")
        if limit == "none_met":
            limit = "budget"
        return Estimate(L, U, (L + U) / 2.0, conf, limit, mixed, step.why)


def server_exit_step(points: Sequence[Point]) -> Step | None:
    """The stop of a search whose server died during a point (the first such point): "the
    server exited (code 1) at 450.0 req/s during point 7". None while the server lived."""
    for i, q in enumerate(points, start=1):
        if q.server_exit is not None:
            at = f"at {q.rate_rps:.1f} req/s" if q.rate_rps > 0 else "while calibrating"
            return Step("done", None, f"{q.server_exit} {at} during point {i}", stop="server_exit")
    return None


def samples_needed(confidence: float, design_over: float = 0.005, q: float = 0.99) -> int:
    """Requests one point needs so that a server with ``design_over`` of its requests
    over the SLO (half the 1 % a p99 allows) earns a pass under the early-stopping rule
    at ``confidence``: the smallest n with n ≥ early_stopping_min_n(⌈design_over·n⌉).
    (0.95 → 1182, 0.99 → 2144.)"""
    from harness.analysis.percentiles import early_stopping_min_n

    n = early_stopping_min_n(0, q, confidence)
    for _ in range(100):
        need = early_stopping_min_n(math.ceil(design_over * n), q, confidence)
        if need <= n:
            return n
        n = need
    return n
