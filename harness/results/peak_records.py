"""The ``peak`` and ``tune`` sections of a results document, and the readers of a tune's
configurations that the tune itself and its reports share.

``harness peak`` writes ``doc["peak"]`` (``PeakSection``) and ``harness tune`` writes
``doc["tune"]`` (``TuneSection``); ``harness.results.schema`` publishes both from these
types. Meaning of every field: docs/peak.md ("Outputs"). Keys added after the first
version of a section are ``NotRequired`` (a document written before them still loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from harness.analysis.edge import judged_outcomes, rate_key

PointOutcome = Literal["met", "missed", "insufficient", "invalid"]
PeakLimit = Literal["slo", "generator", "none_met", "max_rps", "budget", "server_exit"]


class PeakPoint(TypedDict):
    """One measured rate of a search and what the harness judged of it."""

    rate_rps: float
    outcome: PointOutcome
    p50_ms: NotRequired[float | None]
    p99_ms: NotRequired[float | None]  # over all requests; null with p99_is_failure
    tpot_p99_ms: NotRequired[float | None]  # in tokens (p50/p99 are then TTFT's)
    p99_is_failure: NotRequired[bool]  # more than 1 % of the requests failed
    error_rate: NotRequired[float | None]
    goodput_rps: NotRequired[float | None]  # ok answers within the SLO per second
    achieved_rps: NotRequired[float | None]
    n: NotRequired[int]
    duration_s: NotRequired[float]
    reasons: NotRequired[list[str]]
    run_dir: NotRequired[str | None]
    capacity_rps: NotRequired[float | None]  # the capacity probe's, on the point that ran it
    cpu_ms_per_request: NotRequired[float | None]
    rss_mib: NotRequired[float | None]
    lifetime: NotRequired[int | None]  # the server lifetime that measured it (tune)
    server_exit: NotRequired[str | None]  # the server died during the point: how
    search: NotRequired[int]  # which of several searches (harness peak --searches)


class PeakEstimate(TypedDict):
    """[L, U] from the repeats and what stopped the search."""

    low_rps: float | None
    high_rps: float | None
    peak_rps: float | None
    confidence: float
    limit: PeakLimit | None
    mixed_rps: list[float]
    note: str


class EdgeFitRecord(TypedDict):
    """The logistic edge fitted to every judged outcome (``harness.analysis.edge``)."""

    edge_rps: float
    ci_rps: list[float | None]
    scale_rps: float
    sustained_rps: float
    confidence: float
    n: int
    method: str


class PeakSearchSummary(TypedDict):
    """One search of several: its own section without its points."""

    search: int
    peak_rps: float | None
    peak_from: str
    band_rps: list[float | None]
    estimate: PeakEstimate
    edge_fit: EdgeFitRecord | None
    elapsed_s: float
    n_points: int
    server: NotRequired[dict[str, Any]]


class PeakSection(TypedDict):
    """``harness peak``: the highest open-loop rate within the SLO, its interval, every
    point and the curve."""

    slo_p99_ms: float  # in tokens: the p99 time to first token's bound
    slo_tpot_ms: NotRequired[float | None]  # in tokens: the p99 time per output token's
    max_error_rate: float
    confidence: float
    samples_per_point: int
    tolerance: float
    repeats: int
    edge_confidence: float
    config: dict[str, Any]
    estimate: PeakEstimate
    peak_rps: float | None
    peak_from: str
    interval_rps: list[float | None]
    interval_from: Literal["edge_ci", "repeats", "searches"]
    band_rps: list[float | None]
    knee_rps: float | None
    edge_fit: EdgeFitRecord | None
    calibration_rps: float | None
    stopped: str
    points: list[PeakPoint]
    curve: list[PeakPoint]
    elapsed_s: float
    search: NotRequired[int]
    server: NotRequired[dict[str, Any]]
    searches_asked: NotRequired[int]
    spread_rps: NotRequired[float | None]
    searches: NotRequired[list[PeakSearchSummary]]


ConfigStatus = Literal["measured", "not_measured", "failed"]


class TuneConfigResult(TypedDict):
    """One configuration of a tune: its search's figures, status and rank."""

    key: str
    config: dict[str, str]
    cmd: str
    peak_rps: float | None
    upper_rps: float | None
    limit: str | None
    repeats: int
    confidence: float
    stopped: str
    p99_at_peak_ms: float | None  # in tokens: the TTFT's (failures over the bound)
    p50_at_peak_ms: float | None
    tpot_p99_at_peak_ms: NotRequired[float | None]  # in tokens only
    cpu_ms_per_request: float | None
    rss_mib: float | None
    points: list[PeakPoint]
    n_points: int
    status: NotRequired[ConfigStatus]
    status_reason: NotRequired[str | None]
    held_rps: NotRequired[float | None]
    floor_rps: NotRequired[float | None]
    max_points: NotRequired[int]
    lifetimes: NotRequired[int]
    rank: NotRequired[int | None]  # shared ranks: not separated; null: not measured


class HeadToHead(TypedDict):
    """A separation measured again in alternating rounds, and whether it stood."""

    better: str
    worse: str
    held_rps: float
    missed_rps: float
    stands: bool
    rounds_reproduced: int
    failed: NotRequired[list[str]]


class TuneChecklist(TypedDict):
    """The quick checklist on the fastest configuration."""

    exit_code: int
    verdict: str
    failed_checks: list[str]
    out: str
    line: str


class Pruned(TypedDict):
    key: str
    reason: str


class TuneSection(TypedDict):
    """``harness tune``: configurations ranked by their peak under the SLO, the
    recommendation and the fastest one's checklist."""

    mode: str
    fastest: NotRequired[str | None]
    objective: str
    template: str
    space: dict[str, list[str]]
    space_size: int
    default: str
    ranked: list[TuneConfigResult]
    recommended: str | None
    tied_with_recommended: NotRequired[list[str]]
    recommended_cmd: str | None
    default_is_best: bool
    margin_over_default: float | None
    margin_over_worst: float | None
    worst: str | None
    pareto: list[str]
    pruned: list[Pruned]
    head_to_head: NotRequired[list[HeadToHead]]
    measured: int
    resumed: bool
    elapsed_s: float
    slo_p99_ms: float  # in tokens: the p99 time to first token's bound
    slo_tpot_ms: NotRequired[float | None]  # in tokens: the p99 time per output token's
    peak_config: dict[str, Any]
    interrupted: NotRequired[bool]
    checklist: NotRequired[TuneChecklist]
    checklist_skipped: NotRequired[str]
    verdict: NotRequired[str]
    left_open: NotRequired[list[str]]


# --- readers of a tune's configurations -------------------------------------------------

# a configuration's status: its search ended at the server's edge (``measured``: a peak,
# or no rate met the SLO), or was stopped by something else — the load generator, the
# point budget, the search's ceiling (``not_measured``: no answer about the server) — or
# the server failed: it died during a point, or would not start (``failed``)
MEASURED, NOT_MEASURED, FAILED = "measured", "not_measured", "failed"


def status(r: Mapping[str, Any]) -> str:
    """A result's status; for a result written before statuses were kept: from its limit
    (``slo``/``none_met`` measured, another one not), else from its peak (None: not
    measured)."""
    if r.get("status"):
        return str(r["status"])
    if r.get("peak_rps") is None:
        return NOT_MEASURED
    if r.get("limit") is not None and r["limit"] not in ("slo", "none_met"):
        return NOT_MEASURED
    return MEASURED


def evidence(r: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(held, missed_from) of one configuration's search, over *every* judged outcome:
    ``held`` the highest rate met in all its outcomes with every outcome at every lower rate
    met too; ``missed_from`` the lowest rate missed in all its outcomes with every outcome
    at every higher rate missed too. On a search whose outcomes are monotone in the rate
    they are its [L, U]; where they are not (a miss at one rate, then a met above it — a
    noisy server, or a search that ran out of points before its repeats), they widen to
    where every outcome agrees. Without points (a result from before points were kept):
    the peak and the rate it missed at."""
    pts = r.get("points")
    if not pts:
        return (float(r["peak_rps"]) or None) if r.get("peak_rps") else None, r.get("upper_rps")
    by_rate: dict[float, list[str]] = {}
    for p in pts:
        by_rate.setdefault(rate_key(p["rate_rps"]), []).append(str(p["outcome"]))
    judged = {x: judged_outcomes(o) for x, o in by_rate.items()}
    rates = sorted(x for x, j in judged.items() if j)
    held = None
    for x in rates:
        if any(o != "met" for o in judged[x]):
            break
        held = x
    missed_from = None
    for x in reversed(rates):
        if any(o != "missed" for o in judged[x]):
            break
        missed_from = x
    return held, missed_from


def met_once(r: Mapping[str, Any]) -> bool:
    """Whether any of a configuration's points met the SLO."""
    return any(p.get("outcome") == "met" for p in r.get("points") or [])


def measured_worse(top: Mapping[str, Any], r: Mapping[str, Any], tolerance: float) -> bool:
    """Whether ``top`` was measured better than ``r``: ``top`` held the SLO in every
    outcome up to a rate at least ``tolerance`` above the one from which ``r`` missed it in
    every outcome — what a configuration's points show even when its search did not end
    at its edge."""
    held, missed_from = evidence(top)[0], evidence(r)[1]
    return held is not None and missed_from is not None and held >= missed_from * (1 + tolerance)


def unmeasured(tune: Mapping[str, Any]) -> list[str]:
    """Configurations the search set out to measure and could not: their searches were
    stopped by the load generator, the point budget or the search's ceiling."""
    return [r["key"] for r in tune.get("ranked") or [] if status(r) == NOT_MEASURED]


def failed(tune: Mapping[str, Any]) -> list[str]:
    """Configurations whose server died during a point, or would not start."""
    return [r["key"] for r in tune.get("ranked") or [] if status(r) == FAILED]


def verdict_of(tune: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The tune's verdict and the configurations that leave its recommendation open.

    ``fail``: no configuration measured and some failed (their servers died or did not
    start), or none met the SLO at any rate measured, or the fastest configuration's quick
    checklist failed (then nothing is recommended). ``invalid``: no configuration measured
    and none failed (nothing to rank), or the fastest one's checklist was invalid, or a
    configuration not measured was not measured worse than the fastest (its search stopped
    before showing it below: the recommendation is only the best of the rest — those are
    the keys returned). ``not_judged``: the fastest one's checklist judged nothing.
    ``pass``: the fastest configuration's checklist passed (or was not asked for:
    ``--no-checklist``) and every configuration not measured was measured worse than it.
    Failed configurations below a measured winner do not move it: they are ranked, never
    recommended."""
    from harness.results.document import combine_verdicts

    ranked = tune.get("ranked") or []
    if not any(status(r) == MEASURED for r in ranked):
        return ("fail" if failed(tune) else "invalid"), []
    fastest = tune.get("fastest", tune.get("recommended"))
    top = next((r for r in ranked if r["key"] == fastest), None)
    if top is None:
        return "fail", []
    tol = float((tune.get("peak_config") or {}).get("tolerance") or 0.0)
    open_ = [
        r["key"] for r in ranked if status(r) == NOT_MEASURED and not measured_worse(top, r, tol)
    ]
    verdicts = ["invalid"] if open_ else []
    chk = tune.get("checklist")
    if chk:
        verdicts.append(chk.get("verdict") or "not_judged")
    return combine_verdicts(verdicts) or "pass", open_


def slo_text(slo_p99_ms: float, slo_tpot_ms: float | None = None) -> str:
    """The SLO of a peak search as a sentence fragment (``PeakConfig.slo_text``; the reports read it
    back from a ``peak`` section's ``slo_p99_ms`` / ``slo_tpot_ms``)."""
    if slo_tpot_ms is None:
        return f"p99 <= {slo_p99_ms:g} ms over all requests"
    return f"TTFT p99 <= {slo_p99_ms:g} ms and TPOT p99 <= {slo_tpot_ms:g} ms"
