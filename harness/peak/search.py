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

What [L, U] is worth: let p(x) be the chance that one point at rate x meets the SLO,
falling with x, and the edge e the rate with p(e) = ½. For a rate fixed in advance, if
e < L then ``repeats`` independent passes at L had probability < ½^repeats — nominally
1 − 2·½^repeats (75 % at 3 repeats). But the search picks L and U *after* seeing the
outcomes (a mixed bound moves until it holds), and that selection costs coverage on a
gradual edge: over 300 simulated searches [L, U] held the edge 89 % of the time when
outcomes turn within ±2 % of it, 83 % within ±6 % and 67 % within ±12 % — below the
nominal 75 %. So `harness peak` states another interval: after the edge repeats, a
*refine phase* measures at the fitted logistic's D-optimal rates (edge ∓ 1.54 scale)
until the fitted edge's 95 % profile-likelihood interval (Firth-penalized, see EdgeFit)
is within ``precision`` of it; that interval's coverage is measured in
tests/test_peak_edge_fit.py. [L, U] stays in the results as what the repeats showed,
and is what `harness tune` ranks on (its peak is L).

A point is one measurement at one rate; its ``outcome`` is ``met`` (p99 over all
requests and the error rate within their limits, with enough samples), ``missed``,
``insufficient`` (too few samples for the early-stopping rule either way) or
``invalid`` (the harness's validity rules refused the run: generator saturated,
dispatch lag, sampler gaps — a limit of the load generator, not of the server). The
search treats an insufficient point as not earned (measured again once at double
length, then a miss), and an invalid one as no information (measured up to
``INVALID_TRIES`` times; a bisection midpoint that stays invalid is sidestepped when a
higher rate was valid, otherwise the search stops with the generator as the limit).
A point during which the server died (its process exited, or it stopped answering) is
missed and carries the cause (``server_exit``): the search stops there for good — a
server that crashes under load has failed, whatever the rates below it held.

Everything here is a function of the points measured so far, so a search is resumed by
feeding it the points a killed run had already recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Outcome = Literal["met", "missed", "insufficient", "invalid"]
# tries at one rate before an invalid point stops the search there: a shared box makes a
# transient dispatch-lag invalidity common at low SLOs (10 % of a 100 ms SLO is 10 ms)
INVALID_TRIES = 3
Phase = Literal["bracket", "bisect", "edge", "refine", "done"]
# the fitted edge's interval is a 95 % profile-likelihood interval
EDGE_CI = 0.95
# the refine phase ends only after this many meets and this many misses among its own
# points: the bracket's few points can look separated (met ×4 at ≤ 453 req/s, missed ×3
# at 471 in a measured run) and then the fit's scale — how gradual the edge is — comes
# from the penalty, not from outcomes (that run's interval claimed 12 %; the two runs
# around it measured outcomes mixed from 450 to 620 req/s). And stopping as soon as the
# interval is narrow enough picks the runs whose scale came out small by chance, so a
# stated 95 % interval held the edge less often: over 180 simulated searches per scale
# (bench/edge_coverage.py --min-each), 92 / 92 / 88 % at scales 25 / 35 / 50 req/s with 4
# each, 95 / 94 / 93 % with 8, for 3-7 more points (median 30 → 37 at scale 25)
REFINE_MIN_EACH = 8
# refine points sit where P(met) is 0.82 and 0.18 of the fitted logistic: edge ∓ 1.54 scale
# (the D-optimal design for a two-parameter logistic fit)
D_OPTIMAL = 1.5434
# the scale's profile grid: 160 log-spaced scales over 4.6 decades (a step of 7 %)
PROFILE_GRID = 160


@dataclass(frozen=True)
class Point:
    """One measured rate and what the harness judged of it."""

    rate_rps: float
    outcome: Outcome
    p50_ms: float | None = None
    p99_ms: float | None = None  # over all requests: a failure ranks above every success
    error_rate: float | None = None
    goodput_rps: float | None = None  # ok answers within the SLO per second
    achieved_rps: float | None = None
    n: int = 0
    duration_s: float = 0.0
    reasons: tuple[str, ...] = ()  # why invalid / missed / insufficient
    run_dir: str | None = None
    capacity_rps: float | None = None  # the calibration probe's figure, if this point ran it
    cpu_ms_per_request: float | None = None  # server CPU over the point stage / its answers
    rss_mib: float | None = None  # the server's largest RSS during the point
    # which server lifetime of the search measured it (1, 2, …; None: one lifetime only)
    lifetime: int | None = None
    # the server died during this point: how ("the server exited (signal 9, SIGKILL)")
    server_exit: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        if d["p99_ms"] is not None and math.isinf(d["p99_ms"]):
            d["p99_ms"] = None
            d["p99_is_failure"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["reasons"] = tuple(known.get("reasons") or ())
        if d.get("p99_is_failure"):
            known["p99_ms"] = math.inf
        return cls(**known)


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


def answers_agree(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Two runs' answers (peak, interval low, interval high) agree when their difference
    is within the root sum of squares of the facing half-widths (the lower run's upper
    half, the higher run's lower half): what "the same peak within their stated
    intervals" means for two independent estimates."""
    lo_run, hi_run = (a, b) if a[0] <= b[0] else (b, a)
    up, down = lo_run[2] - lo_run[0], hi_run[0] - hi_run[1]
    return hi_run[0] - lo_run[0] <= math.hypot(up, down)


@dataclass(frozen=True)
class SearchesInterval:
    """The peak of K independent searches: their mean and a Student-t interval from
    their spread (``searches_interval``)."""

    peak_rps: float
    ci_rps: tuple[float, float]
    sd_rps: float  # the searches' sample standard deviation
    k: int
    confidence: float = EDGE_CI


def searches_interval(edges: Sequence[float], confidence: float = EDGE_CI) -> SearchesInterval:
    """Mean ± t(confidence, K-1) · sd / √K over K searches' edges.

    One search's interval is from its own points, and its points all come from one
    stretch of minutes on one server: a change of speed between lifetimes or over the
    next stretch is in none of them (measured: over six runs of `harness peak` on the
    reference server the edge moved with sd 32 req/s where the runs' own intervals
    implied 17; docs/peak.md). K searches, each on a freshly started server, spread over the run's
    minutes, measure that move: their spread is the whole variance of one search's
    answer — its points' noise, the server lifetime's and the machine's drift over the
    run — and Student's t accounts for estimating it from K of them. A rate is not
    negative: the lower end stops at 0."""
    from scipy.stats import t

    k = len(edges)
    if k < 2:
        raise ValueError(f"an interval from the searches' spread needs >= 2, got {k}")
    mean = sum(edges) / k
    sd = math.sqrt(sum((e - mean) ** 2 for e in edges) / (k - 1))
    half = float(t.ppf(0.5 + confidence / 2, k - 1)) * sd / math.sqrt(k)
    return SearchesInterval(mean, (max(0.0, mean - half), mean + half), sd, k, confidence)


def edge_confidence(repeats: int) -> float:
    """The nominal confidence that [L, U] holds the edge, for bounds fixed in advance; the
    search's bounds are chosen after the outcomes, and hold less often on a gradual edge
    (module docstring: 67 % measured where this says 75 %)."""
    return max(0.0, 1.0 - 2.0 * 0.5**repeats) if repeats > 1 else 0.0


@dataclass
class Verdicts:
    """Outcomes per rate, in measurement order (rates rounded to 0.01 req/s)."""

    by_rate: dict[float, list[Outcome]] = field(default_factory=dict)

    @classmethod
    def of(cls, points: Sequence[Point]) -> Verdicts:
        v = cls()
        for p in points:
            v.by_rate.setdefault(_key(p.rate_rps), []).append(p.outcome)
        return v

    def judged(self, rate: float) -> list[Outcome]:
        """Outcomes at ``rate`` that count: met / missed. An insufficient outcome counts
        as a miss once it was measured again (the second try at double length)."""
        raw = self.by_rate.get(_key(rate), [])
        out: list[Outcome] = []
        pending_insufficient = 0
        for o in raw:
            if o in ("met", "missed"):
                out.append(o)
            elif o == "insufficient":
                pending_insufficient += 1
                if pending_insufficient >= 2:
                    out.append("missed")
                    pending_insufficient = 0
        return out

    def invalid_count(self, rate: float) -> int:
        return sum(1 for o in self.by_rate.get(_key(rate), []) if o == "invalid")

    def insufficient_pending(self, rate: float) -> bool:
        raw = [o for o in self.by_rate.get(_key(rate), []) if o != "invalid"]
        return bool(raw) and raw[-1] == "insufficient" and self.judged(rate)[-1:] != ["missed"]

    def all_met(self, rate: float, k: int) -> bool:
        j = self.judged(rate)
        return len(j) >= k and all(o == "met" for o in j)

    def all_missed(self, rate: float, k: int) -> bool:
        j = self.judged(rate)
        return len(j) >= k and all(o == "missed" for o in j)


def _key(rate: float) -> float:
    return round(float(rate), 2)


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
            # does. (A tune's search halved here: from 171.9 req/s, mixed, to below its
            # floor, and reported "missed the SLO down to 128.9" — a rate it never measured —
            # with a point of its budget left.)
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


def knee(points: Sequence[Point]) -> float | None:
    """The rate where p99 turns up (Kneedle: the measured point farthest below the chord
    from the lowest to the highest rate's p99, both axes scaled to [0, 1]). Points whose
    p99 is a failure or that are invalid are left out; None with fewer than 3 rates."""
    best: dict[float, float] = {}
    for p in points:
        if p.outcome == "invalid" or p.p99_ms is None or not math.isfinite(p.p99_ms):
            continue
        r = _key(p.rate_rps)
        best[r] = min(best.get(r, math.inf), float(p.p99_ms))
    if len(best) < 3:
        return None
    xs = sorted(best)
    ys = [best[x] for x in xs]
    x0, x1 = xs[0], xs[-1]
    y0, y1 = min(ys), max(ys)
    if x1 <= x0 or y1 <= y0:
        return None
    xn = [(x - x0) / (x1 - x0) for x in xs]
    yn = [(y - y0) / (y1 - y0) for y in ys]
    # convex increasing curve: the knee is where the curve lies farthest below the chord
    c0, c1 = yn[0], yn[-1]
    diffs = [(c0 + (c1 - c0) * xn[i]) - yn[i] for i in range(len(xs))]
    i = max(range(len(xs)), key=lambda j: diffs[j])
    return xs[i] if diffs[i] > 0 else None


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


@dataclass(frozen=True)
class EdgeFit:
    """The edge fitted to every judged outcome: P(met | rate x) = 1 / (1 + e^((x − edge)/scale)).

    ``edge_rps`` is the rate at which a point meets the SLO half the time, ``ci_rps`` its
    profile-likelihood interval at ``confidence`` (the edges whose penalized likelihood
    ratio to the best fit stays within the χ²₁ quantile), ``sustained_rps`` the rate met
    95 % of the time (edge − scale·ln 19). Uses every point, not only the two edge rates,
    so on a noisy server (outcomes mixed over a wide band) it says where the middle of the
    band is and how sure that is, where [L, U] can only say how wide the band is.

    The likelihood carries Firth's penalty (½·log det of the Fisher information, the
    Jeffreys prior): a search's outcomes are nearly separated by construction — met below
    the bracket, missed above, mixed only at one or two rates — and there the plain
    maximum-likelihood scale collapses towards 0 and its interval with it (a measured run:
    met, met, missed at 503.4 req/s and missed 3/3 at 516.7 gave a scale of 0.6 req/s and
    a 95 % interval 2.6 % wide, which the next run's edge, 517, fell outside). Firth's
    estimate exists for separated data and its profile interval keeps its coverage there
    (Heinze & Schemper 2002); ``tests/test_peak_edge_fit.py`` measures that coverage."""

    edge_rps: float
    ci_rps: tuple[float | None, float | None]
    scale_rps: float
    sustained_rps: float
    confidence: float
    n: int
    method: str = "firth"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci_rps"] = list(self.ci_rps)
        return d


def _outcomes(points: Sequence[Point]) -> tuple[list[float], list[float]]:
    """(rate, 1 met / 0 missed) per judged outcome: insufficient twice counts as missed,
    invalid points are left out."""
    v = Verdicts.of(points)
    xs: list[float] = []
    ys: list[float] = []
    for r in v.by_rate:
        for o in v.judged(r):
            xs.append(float(r))
            ys.append(1.0 if o == "met" else 0.0)
    return xs, ys


def fit_edge(
    points: Sequence[Point], confidence: float = 0.95, *, firth: bool = True
) -> EdgeFit | None:
    """Penalized maximum-likelihood logistic fit of met/missed against the rate (see
    EdgeFit; ``firth=False`` is the plain likelihood); None with fewer than 3 judged
    outcomes or without both met and missed."""
    xs, ys = _outcomes(points)
    if len(xs) < 3 or not (0 < sum(ys) < len(ys)):
        return None
    return fit_outcomes(xs, ys, confidence, firth=firth)


def fit_outcomes(
    xs: Sequence[float], ys: Sequence[float], confidence: float = 0.95, *, firth: bool = True
) -> EdgeFit:
    import numpy as np
    from scipy.optimize import brentq, minimize_scalar
    from scipy.stats import chi2

    x_raw = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    # work in standardized rates: the fit is the same, the numbers better conditioned
    mid = float(x_raw.mean())
    unit = float(x_raw.std()) or max(abs(mid), 1.0) * 0.01
    x = (x_raw - mid) / unit

    span = float(x.max() - x.min()) or 1.0
    # the scale's profile is taken on a log-spaced grid (then a parabola through the best
    # three): every penalized likelihood of one edge in one vectorized pass, instead of a
    # bounded 1-D search per edge
    log_s = np.linspace(math.log(1e-4 * span), math.log(4.0 * span), PROFILE_GRID)
    inv_s = np.exp(-log_s)[:, None]
    xx = x * x

    def pll(e: float) -> Any:
        """Penalized log-likelihood of edge e at every grid scale (standardized units)."""
        z = np.clip((x[None, :] - e) * inv_s, -50, 50)
        p = np.clip(1.0 / (1.0 + np.exp(z)), 1e-12, 1 - 1e-12)
        ll = (y * np.log(p) + (1 - y) * np.log1p(-p)).sum(axis=1)
        if firth:
            # Fisher information of the linear predictor's (intercept, slope): its
            # determinant, in closed form for the 2 x 2 matrix
            w = p * (1 - p)
            a, b, c = w.sum(axis=1), (w * x).sum(axis=1), (w * xx).sum(axis=1)
            det = a * c - b * b
            ok = det > 0
            ll = ll + np.where(ok, 0.5 * np.log(np.where(ok, det, 1.0)), -1e6)
        return ll

    def profile(e: float) -> tuple[float, float]:
        """max over the scale at this edge: (penalized log-likelihood, scale)."""
        ll = pll(e)
        i = int(np.argmax(ll))
        if 0 < i < len(ll) - 1:
            l0, l1, l2 = float(ll[i - 1]), float(ll[i]), float(ll[i + 1])
            curv = l0 - 2 * l1 + l2
            if curv < 0:
                d = 0.5 * (l0 - l2) / curv  # the parabola's vertex, in grid steps
                step = float(log_s[1] - log_s[0])
                return l1 - 0.25 * (l0 - l2) * d, math.exp(float(log_s[i]) + d * step)
        return float(ll[i]), math.exp(float(log_s[i]))

    lo_x, hi_x = float(x.min()) - 0.5 * span, float(x.max()) + 0.5 * span
    grid = np.linspace(lo_x, hi_x, 25)
    prof = [profile(float(e))[0] for e in grid]
    i = int(np.argmax(prof))
    # the profile is unimodal: refine the maximum within the neighbouring grid cells
    res = minimize_scalar(
        lambda e: -profile(e)[0],
        bounds=(float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])),
        method="bounded",
        options={"xatol": 1e-4 * span},
    )
    best_e = float(res.x)
    best_ll, best_s = profile(best_e)
    limit = best_ll - chi2.ppf(confidence, 1) / 2.0

    def end(bound: float) -> float | None:
        """Where the profile crosses the limit between the best edge and ``bound``; None
        (open on that side) when it is still above the limit at the bound."""
        if profile(bound)[0] >= limit:
            return None
        return float(brentq(lambda e: profile(e)[0] - limit, bound, best_e, xtol=1e-4 * span))

    ci_lo, ci_hi = end(lo_x), end(hi_x)

    def rps(v: float) -> float:
        return round(mid + v * unit, 2)

    return EdgeFit(
        edge_rps=rps(best_e),
        ci_rps=(None if ci_lo is None else rps(ci_lo), None if ci_hi is None else rps(ci_hi)),
        scale_rps=round(best_s * unit, 3),
        sustained_rps=rps(best_e - best_s * math.log(19.0)),
        confidence=confidence,
        n=len(xs),
        method="firth" if firth else "mle",
    )
