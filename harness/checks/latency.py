"""Service-level checks: cold start, steady state, mixed priority."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from harness.analysis.percentiles import (
    nearest_rank,
    new_histogram,
    percentile_ms,
    slo_assessment,
    value_at_rank_us,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements


def stage_list(name: str) -> list[str] | None:
    """``name`` as a one-stage list, or None (= whole run) when empty."""
    return [name] if name else None


def unanswered(c: Mapping[str, Any]) -> int:
    """Finished requests with no good answer: failed (any kind), timed out or dropped.

    ``cancelled`` is left out with the requests in flight at the end: the harness, not the
    server, stopped those (a closed-loop user replaced mid-request), so they are neither
    answered nor failed.
    """
    failed = d.failed_total(c) - int((c.get("failed") or {}).get("cancelled") or 0)
    return failed + int(c.get("dropped") or 0)


def _share(bad: int, n: int) -> str:
    return f"{bad / n:.2%}" if n else "n/a"


@implements("cold_start.time_to_ready_s")
def time_to_ready(result: Mapping[str, Any], r: Result) -> Check:
    ttr = result.get("time_to_ready_s")
    if ttr is None:
        return r.skipped(
            "the harness did not start the server (attached with --target), so there is no "
            "start-to-ready time; use --sut-cmd to measure it"
        )
    ok = r.compare(float(ttr))
    verb = "within" if ok else "over"
    detail = f"ready {fmt(ttr)} s after start, {verb} {fmt(r.threshold)} s"
    if not ok:
        detail += (
            " — check model loading and warmup; poll the model's ready endpoint, not only "
            "the server's readiness endpoint"
        )
    return r.judged(float(ttr), ok, detail, n=1)


def tail_rank(n: int, q: float, min_tail: int) -> int:
    """The nearest rank of quantile ``q`` among ``n`` values, lowered so that at least
    ``min_tail`` values rank at or above it (at least 1): with fewer than
    ``min_tail / (1 − q)`` values, the quantile would be one of the last few samples."""
    return max(1, min(nearest_rank(n, q), n - min_tail + 1))


@implements("cold_start.first_p99_ratio")
def first_p99_ratio(result: Mapping[str, Any], r: Result) -> Check:
    first = result.get("first_requests") or {}
    if not first or (not first.get("latency_hdr") and "scheduled" not in first):
        return r.skipped("no first-request data was recorded in this scenario")
    fh = d.optional_hist(first.get("latency_hdr")) or new_histogram()
    # results written before failures were counted hold only the ok first answers
    counted = "scheduled" in first
    bad = unanswered(first) if counted else 0
    n_first = fh.get_total_count() + bad
    min_tail = int(r.params["min_tail"])
    need = max(int(r.params["min_first"]), min_tail)
    if n_first < need:
        return r.skipped(
            f"only {n_first} first requests finished (need >= {need}) — "
            "raise load.first_requests, or see how many were still in flight at the end",
            n=n_first,
        )
    steady_name = r.params["steady_stage"] or (
        d.stages(result)[-1]["name"] if d.stages(result) else ""
    )
    sh = d.histogram(result, stage_names=[steady_name] if steady_name else None)
    if sh.get_total_count() == 0:
        sh = d.histogram(result)
    n_steady = sh.get_total_count()
    if n_steady == 0:
        return r.skipped("no steady-state latencies to compare the first requests with")
    # the first requests are judged over every one sent, failures ranked above all
    # successes, at their p99 — or, with too few for min_tail requests at or above the
    # p99, at the min_tail-th slowest; the warm reference is the ok-only p99 (smaller, so
    # the ratio is stricter)
    rank = tail_rank(n_first, 0.99, min_tail)
    at_or_above = n_first - rank + 1
    ok_n = fh.get_total_count()
    p_first = math.inf if rank > ok_n else value_at_rank_us(fh, rank) / 1000.0
    which = (
        f"p99 ({at_or_above} at or above it)"
        if rank == nearest_rank(n_first, 0.99)
        else f"{at_or_above}th slowest (p{100.0 * rank / n_first:.3g}; a p99 of "
        f"{n_first} would be decided by its {n_first - nearest_rank(n_first, 0.99) + 1} "
        "slowest)"
    )
    p_first_ok = percentile_ms(fh, 99.0)
    p_steady = percentile_ms(sh, 99.0) or 0.0
    ratio = p_first / p_steady if p_steady > 0 else float("inf")
    excess = p_first - p_steady
    # sub-millisecond steady p99s make ratios noise: a small absolute excess passes
    ok = r.compare(ratio) or excess < float(r.params["min_excess_ms"])
    verdict = "within" if ok else "over"
    steady = f"steady p99 {fmt(p_steady)} ms (n={n_steady})"
    if math.isinf(p_first):
        detail = (
            f"{bad} of the first {n_first} requests sent failed or were dropped "
            f"({_share(bad, n_first)}), so their {which} is a failure (successful-only "
            f"p99 {fmt(p_first_ok)} ms) vs {steady}: over {fmt(r.threshold)}x"
        )
    else:
        detail = (
            f"first {n_first} requests sent: {which} {fmt(p_first)} ms ({bad} failed or "
            f"dropped, counted as slowest; successful-only p99 {fmt(p_first_ok)} ms) vs "
            f"{steady}: {fmt(ratio)}x, {verdict} {fmt(r.threshold)}x"
        )
    if ok and not r.compare(ratio):
        detail += (
            f" (excess {fmt(excess)} ms < {fmt(r.params['min_excess_ms'])} ms counts as noise)"
        )
    if not counted:
        detail += (
            " (this results document does not count the first requests' failures: only "
            "their ok answers were judged)"
        )
    if not ok:
        detail += (
            " — warm the model up before reporting ready (run a few inferences at start)"
            if bad == 0
            else " — the first requests fail or stall: load and warm the model before "
            "reporting ready (gate readiness on a test inference)"
        )
    return r.judged(round(ratio, 3), ok, detail, n=n_first)


@implements("cold_start.first_error_rate")
def first_error_rate(result: Mapping[str, Any], r: Result) -> Check:
    first = result.get("first_requests") or {}
    if not first:
        return r.skipped("no first-request data was recorded in this scenario")
    if "scheduled" not in first:
        return r.skipped(
            "this results document does not count the first requests' failures (written by "
            "an older harness) — run the scenario again"
        )
    bad = unanswered(first)
    denom = int(first.get("ok") or 0) + bad
    if denom < int(r.params["min_first"]):
        return r.skipped(
            f"only {denom} first requests finished (need >= {r.params['min_first']}) — "
            "raise load.first_requests, or see how many were still in flight at the end",
            n=denom,
        )
    rate = bad / denom
    ok = r.compare(rate)
    detail = (
        f"{bad} of the first {denom} requests sent failed or were dropped ({rate:.2%}) "
        f"{'<=' if ok else '>'} {float(r.threshold):.2%}; by kind: {failure_kinds(first)}"
    )
    if not ok:
        detail += (
            " — the server reported ready before it could serve them: gate readiness on a "
            "loaded, warmed model (a test inference), not on the process being up"
        )
    return r.judged(round(rate, 6), ok, detail, n=denom)


def _p99_check(
    r: Result,
    hist: Any,
    c: Mapping[str, Any] | None,
    what: str,
    next_step: str,
    confidence_param: float = 0.99,
) -> Check:
    """p99 over every finished request against the SLO: a request that failed, timed out
    or was dropped counts as over it (ranked above every success), so failing the slowest
    requests cannot pass an SLO. Requests in flight at the end are neither."""
    if c is None:
        return r.skipped(
            f"no request counters were recorded for the {what} requests, so failed ones "
            "cannot be counted against the SLO",
        )
    slo = float(r.threshold)
    bad = unanswered(c)
    a = slo_assessment(hist, slo, 99.0, confidence_param, failed=bad)
    if a.n == 0:
        return r.skipped(f"no successful or failed {what} requests were recorded", n=0)
    n_ok = hist.get_total_count()
    beside = f"successful-only p99 {fmt(percentile_ms(hist, 99.0))} ms over {n_ok}"
    if a.verdict == "insufficient":
        return r.skipped(
            f"insufficient samples: {what} p99 {fmt(a.value_ms)} ms from n={a.n} with "
            f"{a.overs} over {fmt(slo)} ms ({bad} of them failed or dropped); a confident "
            f"verdict needs n >= {a.min_n} (early stopping, {a.confidence:.0%}) — run longer "
            "or at a higher rate",
            value=a.value_ms,
            n=a.n,
        )
    ok = a.verdict == "pass"
    if a.value_ms is not None and math.isinf(a.value_ms):
        detail = (
            f"{what} p99 is a failure: {bad} of {a.n} finished requests failed or were "
            f"dropped ({_share(bad, a.n)}; {failure_kinds(c)}), more than the 1 % a p99 leaves — "
            f"each counts as over {fmt(slo)} ms ({beside})"
        )
    else:
        detail = (
            f"{what} p99 {fmt(a.value_ms)} ms {'<=' if ok else '>'} {fmt(slo)} ms over all "
            f"{a.n} finished requests ({a.overs} over the SLO, {bad} of them failed or "
            f"dropped; {beside})"
        )
    if not ok:
        detail += f" — {next_step}"
        if bad:
            detail += "; failed and dropped requests count as over the SLO: see errors by kind"
    return r.judged(a.value_ms, ok, detail, n=a.n)


@implements("steady.p99_ms")
def steady_p99(result: Mapping[str, Any], r: Result) -> Check:
    names = stage_list(r.params["stage"])
    hist = d.histogram(result, stage_names=names)
    return _p99_check(
        r,
        hist,
        d.counters(result, stage_names=names),
        "steady-state",
        "profile the slow path (per-thread CPU in the report) or lower the offered rate",
        float(r.params["confidence"]),
    )


def failure_rate(c: Mapping[str, Any], include_dropped: bool) -> tuple[float | None, int, int]:
    """(rate, bad, denominator) over requests that finished (in-flight ones excluded)."""
    bad = d.failed_total(c) + (int(c.get("dropped") or 0) if include_dropped else 0)
    denom = int(c.get("scheduled") or 0) - int(c.get("in_flight") or 0)
    if not include_dropped:
        denom -= int(c.get("dropped") or 0)
    return (bad / denom if denom > 0 else None), bad, denom


def rate_of_enough(
    r: Result, c: Mapping[str, Any], include_dropped: bool, what: str, next_step: str
) -> tuple[float, int, int] | Check:
    """``_failure_rate`` over at least ``min_requests`` finished requests, else a skip."""
    rate, bad, denom = failure_rate(c, include_dropped)
    if rate is None or denom < int(r.params["min_requests"]):
        return r.skipped(
            f"insufficient samples: {denom} finished {what}requests (need >= "
            f"{r.params['min_requests']}) — {next_step}",
            n=max(denom, 0),
        )
    return rate, bad, denom


def failure_kinds(c: Mapping[str, Any]) -> str:
    kinds = {k: v for k, v in (c.get("failed") or {}).items() if v}
    if c.get("dropped"):
        kinds["dropped"] = c["dropped"]
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])) or "none"


@implements("steady.error_rate")
def steady_error_rate(result: Mapping[str, Any], r: Result) -> Check:
    c = d.counters(result, stage_names=stage_list(r.params["stage"]))
    if c is None:
        return r.skipped("no request counters were recorded")
    got = rate_of_enough(r, c, bool(r.params["include_dropped"]), "", "run longer")
    if isinstance(got, Check):
        return got
    rate, bad, denom = got
    ok = r.compare(rate)
    detail = (
        f"{bad} of {denom} requests failed ({rate:.2%}) {'<=' if ok else '>'} "
        f"{float(r.threshold):.2%}; by kind: {failure_kinds(c)}"
    )
    if not ok:
        detail += (
            " — see errors by kind over time in the report; 503s mean the rate is above capacity"
        )
    return r.judged(round(rate, 6), ok, detail, n=denom)


def _offered(result: Mapping[str, Any], names: list[str] | None) -> tuple[float, float] | None:
    """(offered requests, seconds) over open-loop stages; None if any stage is closed."""
    chosen = [s for s in d.stages(result) if names is None or s.get("name") in names]
    if not chosen or any(s.get("rate_rps") is None for s in chosen):
        return None
    secs = sum(float(s["end_s"]) - float(s["start_s"]) for s in chosen)
    reqs = sum(float(s["rate_rps"]) * (float(s["end_s"]) - float(s["start_s"])) for s in chosen)
    return reqs, secs


# One-sided z of the false-alarm rate the generator note uses (0.1 %).
_Z_999 = 3.09


@implements("steady.throughput")
def steady_throughput(result: Mapping[str, Any], r: Result) -> Check:
    names = stage_list(r.params["stage"])
    c = d.counters(result, stage_names=names)
    offered = _offered(result, names)
    if c is None:
        return r.skipped("no request counters were recorded")
    if offered is None or offered[1] <= 0:
        secs = float(result.get("duration_s") or 0.0)
        if float(r.threshold) <= 0 or secs <= 0:
            return r.skipped(
                "closed-loop stages have no offered rate; set an absolute floor with "
                "threshold = <req/s> in the checklist"
            )
        achieved = int(c["ok"]) / secs
        ok = achieved >= float(r.threshold)
        detail = (
            f"{fmt(achieved)} ok req/s over {fmt(secs)} s; {'>=' if ok else '<'} "
            f"{fmt(float(r.threshold))} req/s (the absolute floor set)"
        )
        if not ok:
            detail += " — the server is below the floor: check errors and CPU per thread"
        return r.judged(round(achieved, 3), ok, detail, n=int(c["ok"]))
    nominal, secs = offered
    scheduled = int(c.get("scheduled") or 0)
    if scheduled <= 0:
        return r.skipped("no request was offered in the stages judged")
    achieved = int(c["ok"]) / secs
    # The offered load is the count of requests whose send time came (Poisson in number
    # when arrivals are): served is judged against that count, so the arrivals' own
    # sampling error never reaches the verdict. An absolute floor, when set, replaces it.
    threshold = float(r.threshold)
    if threshold <= 0:
        threshold = float(r.params["min_ratio"]) * scheduled / secs
    ok = achieved >= threshold
    detail = (
        f"{fmt(achieved)} ok req/s over {fmt(secs)} s: {int(c['ok'])} answered ok of the "
        f"{scheduled} requests offered ({int(c['ok']) / scheduled:.1%}; nominal "
        f"{fmt(nominal / secs)} req/s); {'>=' if ok else '<'} {fmt(threshold)} req/s"
    )
    if scheduled < nominal - _Z_999 * math.sqrt(nominal) - 1:
        detail += (
            f" (the generator offered fewer than the nominal {fmt(nominal, 4)} could "
            "plausibly give, even with Poisson arrivals: see dispatch lag and whether the "
            "run was cut short)"
        )
    if not ok:
        detail += (
            " — the server did not serve the load it was offered: check errors, requests "
            "still in flight at the end, and CPU per thread"
        )
    return r.judged(round(achieved, 3), ok, detail, n=int(c["ok"]), threshold=round(threshold, 3))


def _overload_evidence(
    result: Mapping[str, Any], names: list[str] | None, cls: str, min_reject: float, slo_ms: float
) -> str | None:
    """Why we believe the stage was above capacity (None: no sign of it).

    Protection of the high class is only shown when the others paid for it: they were
    rejected, or their p99 went past the SLO. Without that a pass would be vacuous.
    """
    others = [n for n in d.class_names(result) if n != cls]
    if not others:
        return None
    oc = d.counters(result, stage_names=names, classes=others)
    rate = failure_rate(oc, True)[0] if oc else None
    if rate is not None and rate >= min_reject:
        return f"other classes rejected {rate:.1%}"
    p99 = percentile_ms(d.histogram(result, stage_names=names, classes=others), 99.0)
    if p99 is not None and p99 > slo_ms:
        return f"other classes' p99 {fmt(p99)} ms"
    return None


def _not_exercised(r: Result, cls: str) -> Check:
    return r.skipped(
        f"the stage did not overload the server: the classes other than '{cls}' were "
        f"neither rejected (>= {float(r.params['min_other_reject_rate']):.0%}) nor slow "
        "— priority protection was not exercised; raise the overload rate"
    )


def _high_class(result: Mapping[str, Any], r: Result) -> tuple[str, list[str] | None] | Check:
    """The high-priority class and the stages judged, or the skip when there is none."""
    cls = r.params["class_name"] or d.high_class(result)
    if cls is None:
        return r.skipped("the traffic mix has no high-priority class (priority >= 1)")
    return cls, stage_list(r.params["stage"])


@implements("priority.high_p99_ms")
def high_p99(result: Mapping[str, Any], r: Result) -> Check:
    got = _high_class(result, r)
    if isinstance(got, Check):
        return got
    cls, names = got
    hist = d.histogram(result, stage_names=names, classes=[cls])
    c = _p99_check(
        r,
        hist,
        d.counters(result, stage_names=names, classes=[cls]),
        f"class '{cls}'",
        "the server is not serving high priority first; check its priority queues",
        float(r.params["confidence"]),
    )
    if c.passed:
        why = _overload_evidence(
            result, names, cls, float(r.params["min_other_reject_rate"]), float(r.threshold)
        )
        if why is None:
            return _not_exercised(r, cls)
        c = dataclasses.replace(c, detail=f"{c.detail}; overloaded: {why}")
    return c


@implements("priority.high_reject_rate")
def high_reject_rate(result: Mapping[str, Any], r: Result) -> Check:
    got = _high_class(result, r)
    if isinstance(got, Check):
        return got
    cls, names = got
    c = d.counters(result, stage_names=names, classes=[cls])
    if c is None:
        return r.skipped(f"no counters for class '{cls}'")
    got = rate_of_enough(r, c, True, f"'{cls}' ", "raise its share or run longer")
    if isinstance(got, Check):
        return got
    rate, bad, denom = got
    ok = r.compare(rate)
    others = [n for n in d.class_names(result) if n != cls]
    oc = d.counters(result, stage_names=names, classes=others) if others else None
    orate = failure_rate(oc, True)[0] if oc else None
    detail = (
        f"class '{cls}': {bad} of {denom} rejected or failed ({rate:.2%}) "
        f"{'<=' if ok else '>'} {float(r.threshold):.2%}"
    )
    if orate is not None:
        detail += f"; other classes {orate:.2%}"
    if not ok:
        detail += " — shed lower priorities first (per-priority queue bounds)"
    else:
        why = _overload_evidence(
            result, names, cls, float(r.params["min_other_reject_rate"]), float(r.params["slo_ms"])
        )
        if why is None:
            return _not_exercised(r, cls)
    return r.judged(round(rate, 6), ok, detail, n=denom)
