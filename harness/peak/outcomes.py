"""What a peak search measured: its points, the outcomes at each rate, and the edge those
outcomes fit.

A point is one measurement at one rate; its ``outcome`` is ``met`` (p99 over all
requests and the error rate within their limits, with enough samples), ``missed``,
``insufficient`` (too few samples for the early-stopping rule either way) or
``invalid`` (the harness's validity rules refused the run: generator saturated,
dispatch lag, sampler gaps — a limit of the load generator, not of the server). An
insufficient point counts as a miss once it was measured again; an invalid one is no
information. A point during which the server died (its process exited, or it stopped
answering) is missed and carries the cause (``server_exit``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from harness.analysis.edge import (
    EDGE_CI,
    EdgeFit,
    fit_outcomes,
    judged_outcomes,
    kneedle,
    rate_key,
)

Outcome = Literal["met", "missed", "insufficient", "invalid"]
# tries at one rate before an invalid point stops the search there: a shared box makes a
# transient dispatch-lag invalidity common at low SLOs (10 % of a 100 ms SLO is 10 ms)
INVALID_TRIES = 3


@dataclass(frozen=True)
class Point:
    """One measured rate and what the harness judged of it."""

    rate_rps: float
    outcome: Outcome
    p50_ms: float | None = None
    p99_ms: float | None = None  # over all requests: a failure ranks above every success
    # (in tokens: p50_ms and p99_ms are the time to first token's, and this the p99 time
    # per output token of the streams that got a whole answer)
    tpot_p99_ms: float | None = None
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


@dataclass
class Verdicts:
    """Outcomes per rate, in measurement order (rates rounded to 0.01 req/s)."""

    by_rate: dict[float, list[Outcome]] = field(default_factory=dict)

    @classmethod
    def of(cls, points: Sequence[Point]) -> Verdicts:
        v = cls()
        for p in points:
            v.by_rate.setdefault(rate_key(p.rate_rps), []).append(p.outcome)
        return v

    def judged(self, rate: float) -> list[Outcome]:
        """Outcomes at ``rate`` that count: met / missed. An insufficient outcome counts
        as a miss once it was measured again (the second try at double length)."""
        return judged_outcomes(self.by_rate.get(rate_key(rate), []))  # type: ignore[return-value]

    def invalid_count(self, rate: float) -> int:
        return sum(1 for o in self.by_rate.get(rate_key(rate), []) if o == "invalid")

    def insufficient_pending(self, rate: float) -> bool:
        raw = [o for o in self.by_rate.get(rate_key(rate), []) if o != "invalid"]
        return bool(raw) and raw[-1] == "insufficient" and self.judged(rate)[-1:] != ["missed"]

    def all_met(self, rate: float, k: int) -> bool:
        j = self.judged(rate)
        return len(j) >= k and all(o == "met" for o in j)

    def all_missed(self, rate: float, k: int) -> bool:
        j = self.judged(rate)
        return len(j) >= k and all(o == "missed" for o in j)


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
    points: Sequence[Point], confidence: float = EDGE_CI, *, firth: bool = True
) -> EdgeFit | None:
    """Penalized maximum-likelihood logistic fit of met/missed against the rate
    (``harness.analysis.edge.EdgeFit``; ``firth=False`` is the plain likelihood); None
    with fewer than 3 judged outcomes or without both met and missed."""
    xs, ys = _outcomes(points)
    if len(xs) < 3 or not (0 < sum(ys) < len(ys)):
        return None
    return fit_outcomes(xs, ys, confidence, firth=firth)


def knee(points: Sequence[Point]) -> float | None:
    """The rate where p99 turns up (``harness.analysis.edge.kneedle`` over each rate's
    lowest p99). Points whose p99 is a failure or that are invalid are left out; None with
    fewer than 3 rates."""
    best: dict[float, float] = {}
    for p in points:
        if p.outcome == "invalid" or p.p99_ms is None or not math.isfinite(p.p99_ms):
            continue
        r = rate_key(p.rate_rps)
        best[r] = min(best.get(r, math.inf), float(p.p99_ms))
    xs = sorted(best)
    return kneedle(xs, [best[x] for x in xs])
