"""Overload checks: spike and CPU contention (recovery, fail-fast, degradation)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.analysis.contention import (
    QUICK_KINDS,
    Block,
    degradation_ratio,
    fail_fast,
    quick_rejection_bounds_ms,
)
from harness.analysis.recovery import (
    baseline_error_rate,
    baseline_p99_ms,
    error_rate_band,
    error_rates,
    recovery_time,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements


def smooth(values: Sequence[float | None], k: int) -> list[float | None]:
    """Centred rolling median over ``k`` windows; an empty window stays empty."""
    if k <= 1:
        return list(values)
    half = k // 2
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        near = [x for x in values[max(0, i - half) : i + half + 1] if x is not None]
        out.append(float(np.median(near)))
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _recovery(
    result: Mapping[str, Any],
    r: Result,
    event: str,
    event_start: float,
    event_end: float,
    baseline_spans: Sequence[tuple[float, float]],
) -> Check:
    """Recovery of both the windowed p99 and the windowed error rate after the event;
    "not exercised" (skipped) when the event disturbed neither."""
    p = r.params
    classes = [p["class_name"]] if p["class_name"] else None
    w = d.windows(result, classes)
    if w is None:
        return r.skipped("no windowed latencies were recorded")
    k = int(p["smooth_windows"])
    p99 = smooth(w.p99_ms, k)
    failed = [sum(e.values()) for e in w.errors]  # "dropped" too: the server fell behind
    err = smooth(error_rates(w.ok, failed), k)
    base_vals = [
        b for lo, hi in baseline_spans if (b := baseline_p99_ms(w.t, p99, lo, hi)) is not None
    ]
    if not base_vals:
        return r.skipped(f"no baseline windows before the {event} to define the latency band")
    baseline = float(np.median(base_vals))
    base_err = baseline_error_rate(w.t, w.ok, failed, baseline_spans) or 0.0
    err_band = error_rate_band(base_err, float(p["error_factor"]), float(p["error_margin"]))
    rec = recovery_time(
        w.t,
        p99,
        event_end,
        baseline,
        factor=float(p["factor"]),
        margin_ms=float(p["margin_ms"]),
        hold_s=float(p["hold_s"]),
        width_s=w.width_s,
        error_rate=err,
        error_band=err_band,
        event_start_s=event_start,
    )
    if rec.windows_after == 0:
        return r.skipped(
            f"no windows after the {event} ended at {fmt(event_end)} s — add a recovery stage"
        )
    band = (
        f"p99 band {fmt(rec.band_ms)} ms = max(baseline p99 {fmt(baseline)} ms x "
        f"{fmt(p['factor'])}, + {fmt(p['margin_ms'])} ms) and error-rate band "
        f"{_pct(err_band)} = max(baseline {_pct(base_err)} x {fmt(p['error_factor'])}, "
        f"+ {_pct(float(p['error_margin']))})"
    )
    if not rec.disturbed:
        return r.skipped(
            f"recovery not exercised: from the start of the {event} at {fmt(event_start)} s "
            f"on, p99 peaked at {fmt(rec.peak_ms)} ms and the error rate at "
            f"{_pct(rec.peak_error)}, inside the {band} — the {event} disturbed neither, so "
            "there was nothing to recover from; overload the server harder (a higher "
            "spike rate, more hog cores) to judge recovery",
            n=rec.windows_after,
        )
    worst = (
        f"worst after: p99 {fmt(rec.worst_after_ms)} ms, error rate {_pct(rec.worst_error_after)}"
    )
    if rec.recovery_s is None:
        after_s = rec.windows_after * w.width_s
        return r.judged(
            None,
            False,
            f"p99 and error rate never stayed back within the {band} for "
            f"{fmt(p['hold_s'])} s in the {fmt(after_s)} s after the {event} ({worst}) — "
            "something outlives the overload: an unbounded backlog still draining, a "
            "server still shedding, or a controller that backed off (batch size, workers) "
            "and does not come back; compare its batch size and queue depth before and "
            "after",
            n=rec.windows_after,
        )
    ok = r.compare(rec.recovery_s)
    detail = (
        f"p99 and error rate back within the {band}, held {fmt(p['hold_s'])} s, "
        f"{fmt(rec.recovery_s)} s after the {event}, {'<=' if ok else '>'} "
        f"{fmt(r.threshold)} s (peak p99 {fmt(rec.peak_ms)} ms, error rate "
        f"{_pct(rec.peak_error)}; {worst})"
    )
    if not ok:
        detail += " — a long tail after overload means a deep queue: bound it and shed early"
    return r.judged(round(rec.recovery_s, 3), ok, detail, n=rec.windows_after)


def _discard(stage: Mapping[str, Any] | None, r: Result | None) -> float:
    """Seconds skipped at a block's start: the check's ``discard_s`` or the stage's
    own ``warmup_s``, whichever is longer (none when ``r`` is None)."""
    if r is None:
        return 0.0
    warm = float((stage or {}).get("warmup_s") or 0.0)
    return max(float(r.params["discard_s"]), warm)


def _rate(s: Mapping[str, Any]) -> float:
    return float(s.get("rate_rps") or s.get("users") or 0.0)


@implements("spike.recovery_s")
def spike_recovery(result: Mapping[str, Any], r: Result) -> Check:
    stages = d.stages(result)
    if len(stages) < 2:
        return r.skipped("the scenario needs a baseline stage and a spike stage")
    base = d.stage(result, r.params["baseline_stage"]) if r.params["baseline_stage"] else stages[0]
    event = (
        d.stage(result, r.params["event_stage"])
        if r.params["event_stage"]
        else max(stages, key=_rate)
    )
    if base is None or event is None:
        names = ", ".join(str(s.get("name")) for s in stages)
        return r.skipped(f"baseline_stage/event_stage not among this scenario's stages ({names})")
    return _recovery(
        result,
        r,
        f"spike stage '{event['name']}'",
        float(event["start_s"]),
        float(event["end_s"]),
        [(float(base["start_s"]) + _discard(base, r), float(base["end_s"]))],
    )


def _errors_in(w: d.Windows, spans: Sequence[tuple[float, float]]) -> tuple[dict[str, int], int]:
    """Failures by kind (and drops) of requests *sent* inside ``spans``.

    Windows are keyed by intended send time, so a request sent during the overload that
    timed out later is counted here, and noise long after the overload is not.
    """
    errors: dict[str, int] = {}
    for t, e in zip(w.t, w.errors, strict=True):
        if any(lo <= t < hi for lo, hi in spans):
            for k, v in e.items():
                errors[k] = errors.get(k, 0) + v
    dropped = int(errors.pop("dropped", 0))
    return errors, dropped


def _fail_fast(
    r: Result,
    result: Mapping[str, Any],
    errors: Mapping[str, int],
    dropped: int,
    where: str,
) -> Check:
    p = r.params
    n_quick = sum(int(errors.get(k, 0)) for k in QUICK_KINDS)  # of the judged requests only
    bounds = quick_rejection_bounds_ms(d.optional_hist(result.get("error_latency_hdr")), n_quick)
    ff = fail_fast(
        errors,
        dropped=dropped,
        count_dropped_as_slow=bool(p["count_dropped_as_slow"]),
        reject_p50=bounds,
    )
    judged = ff.quick + ff.slow
    if judged < int(p["min_failures"]):
        return r.skipped(
            f"only {judged} overload failures {where} (need >= {p['min_failures']}): the "
            "server was not pushed past capacity, so shedding was not exercised — raise "
            "the overload rate",
            n=judged,
        )
    share = ff.quick_share or 0.0
    share_ok = r.compare(share)
    limit = float(p["max_reject_p50_ms"])
    lat_ok = bounds.at_most(limit) if bounds is not None else None
    if bounds is None:
        shown = "unknown: no failure-time histogram holds them"
    elif fmt(bounds.low_ms) == fmt(bounds.high_ms):
        shown = f"{fmt(bounds.high_ms)} ms"
    else:
        shown = f"between {fmt(bounds.low_ms)} and {fmt(bounds.high_ms)} ms"
    op = {True: "<=", False: ">", None: "?"}[lat_ok]
    detail = (
        f"{ff.quick} quick 503/429 vs {ff.slow} timeouts/resets/drops {where}: "
        f"{share:.1%} quick {'>=' if share_ok else '<'} {float(r.threshold):.0%}; "
        f"median 503/429 time {shown} ({op} {fmt(limit)} ms)"
    )
    if share_ok and lat_ok is None:
        return r.skipped(
            detail + " — the share passes but the 503/429 times cannot be shown quick: the "
            "run keeps one histogram of all failure times, and its other failures (other "
            "kinds, or outside the judged window) leave the median between those bounds",
            n=judged,
        )
    passed = share_ok and lat_ok is True
    if not passed:
        detail += (
            " — overload must be refused at once (bounded queue, 503 + Retry-After), "
            "not left to time out"
        )
    return r.judged(round(share, 4), passed, detail, n=judged)


@implements("spike.fail_fast")
def spike_fail_fast(result: Mapping[str, Any], r: Result) -> Check:
    stages = d.stages(result)
    event = (
        d.stage(result, r.params["event_stage"])
        if r.params["event_stage"]
        else (max(stages, key=_rate) if stages else None)
    )
    w = d.windows(result)
    if event is None or w is None:
        c = d.counters(result)
        if c is None:
            return r.skipped("no request counters were recorded")
        errors, dropped, where = c.get("failed") or {}, int(c.get("dropped") or 0), "in the run"
    else:
        lo, hi = float(event["start_s"]), float(event["end_s"]) + float(r.params["tail_s"])
        errors, dropped = _errors_in(w, [(lo, hi)])
        where = f"for requests sent in {fmt(lo)}–{fmt(hi)} s (spike stage '{event['name']}')"
    return _fail_fast(r, result, errors, dropped, where)


def _hog_runs(result: Mapping[str, Any]) -> list[tuple[float, float]]:
    """When CPU hogs really ran: the ``cpu_hog`` chaos records that applied and ended."""
    return [
        (float(c["start_s"]), float(c["end_s"]))
        for c in result.get("chaos") or []
        if c.get("action") == "cpu_hog" and c.get("ok") is True and c.get("end_s") is not None
    ]


def _hogs_planned(result: Mapping[str, Any]) -> bool:
    blocks = (result.get("contention") or {}).get("blocks") or []
    chaos = result.get("chaos") or []
    return any(b.get("kind") == "hog" for b in blocks) or any(
        c.get("action") == "cpu_hog" for c in chaos
    )


NO_HOG_RAN = (
    "hog blocks were planned but no CPU hog ran in them (no cpu_hog record that applied): "
    "there is nothing to compare — the run's validity says why the chaos did not happen"
)


def contention_blocks(result: Mapping[str, Any], r: Result | None) -> dict[str, list[Block]]:
    """Blocks by kind, from ``contention.blocks`` or else from the cpu_hog chaos events.

    A hog block is the planned block intersected with the hogs that really ran (the
    ``cpu_hog`` chaos records that applied): a hog that failed or was skipped leaves no
    hog block, so a baseline is never judged as contention (the run is also invalid, see
    harness.analysis.chaos_evidence). Each block starts after its discarded seconds
    (``discard_s`` or the block's stage ``warmup_s``), counted from when the hog really
    started: the scheduler and the server's queue need a moment to settle.
    """
    out: dict[str, list[Block]] = {"baseline": [], "hog": [], "after": []}
    runs = _hog_runs(result)
    blocks = (result.get("contention") or {}).get("blocks") or []
    if blocks:
        for b in blocks:
            skip = _discard(d.stage(result, b.get("stage") or b.get("name") or ""), r)
            lo, hi = float(b["start_s"]), float(b["end_s"])
            spans = [(lo, hi)]
            if b["kind"] == "hog":
                spans = [(max(lo, a), min(hi, z)) for a, z in runs if min(hi, z) > max(lo, a)]
            for a, z in spans:
                out.setdefault(b["kind"], []).append(Block(b["kind"], min(a + skip, z), z))
        return out
    if not runs:
        return out
    skip = _discard(None, r)
    first = min(a for a, _ in runs)
    last = max(z for _, z in runs)
    out["baseline"].append(Block("baseline", min(skip, first), first))
    out["hog"] = [Block("hog", min(a + skip, z), z) for a, z in runs]
    end = float(result.get("duration_s") or last)
    if end > last:
        out["after"].append(Block("after", min(last + skip, end), end))
    return out


def _last_hog(result: Mapping[str, Any]) -> tuple[float, float] | None:
    """When the last hog that ran in a hog block (or at all, without blocks) began and
    really ended — past its block if it overran, since the server was still short of CPU."""
    runs = _hog_runs(result)
    blocks = [
        (float(b["start_s"]), float(b["end_s"]))
        for b in (result.get("contention") or {}).get("blocks") or []
        if b.get("kind") == "hog"
    ]
    if blocks:
        runs = [(a, z) for a, z in runs if any(min(hi, z) > max(lo, a) for lo, hi in blocks)]
    return max(runs, key=lambda x: x[1]) if runs else None


@implements("contention.throughput_ratio")
def contention_throughput(result: Mapping[str, Any], r: Result) -> Check:
    blocks = contention_blocks(result, r)
    if not blocks["hog"] and _hogs_planned(result):
        return r.skipped(NO_HOG_RAN)
    if not blocks["hog"] or not blocks["baseline"]:
        return r.skipped("the scenario has no baseline and CPU-hog blocks")
    w = d.windows(result)
    if w is None:
        return r.skipped("no windowed counts were recorded")
    rps = [ok / w.width_s for ok in w.ok]
    p50 = w.p50_ms
    disc = float(r.params["discard_s"])
    # blocks already start after their discarded seconds
    tp = degradation_ratio(
        w.t, rps, blocks["baseline"], blocks["hog"], discard_s=0.0, width_s=w.width_s
    )
    lat = degradation_ratio(
        w.t, p50, blocks["baseline"], blocks["hog"], discard_s=0.0, width_s=w.width_s
    )
    need = int(r.params["min_windows"])
    if tp.n_baseline < need or tp.n_test < need or tp.ratio is None:
        return r.skipped(
            f"insufficient samples: {tp.n_baseline} baseline and {tp.n_test} hog windows "
            f"after discarding {fmt(disc)} s per block (need >= {need} each) — lengthen the blocks",
            n=min(tp.n_baseline, tp.n_test),
        )
    ok = r.compare(tp.ratio)
    detail = (
        f"median throughput {fmt(tp.test_median)} req/s with hogs vs {fmt(tp.baseline_median)} "
        f"without: {fmt(tp.ratio)}x {'>=' if ok else '<'} {fmt(r.threshold)}x; median p50 "
        f"{fmt(lat.test_median)} vs {fmt(lat.baseline_median)} ms "
        f"({tp.n_test}/{tp.n_baseline} windows)"
    )
    if not ok:
        detail += (
            " — the server collapses when it loses CPU: look at per-thread %wait and shed "
            "load instead of queueing"
        )
    return r.judged(round(tp.ratio, 4), ok, detail, n=tp.n_test + tp.n_baseline)


@implements("contention.fail_fast")
def contention_fail_fast(result: Mapping[str, Any], r: Result) -> Check:
    blocks = contention_blocks(result, None)  # every failure in a hog block counts
    if not blocks["hog"] and _hogs_planned(result):
        return r.skipped(NO_HOG_RAN)
    w = d.windows(result)
    if not blocks["hog"] or w is None:
        c = d.counters(result)
        if c is None:
            return r.skipped("no request counters were recorded")
        errors, dropped, where = c.get("failed") or {}, int(c.get("dropped") or 0), "in the run"
    else:
        tail = float(r.params["tail_s"])
        errors, dropped = _errors_in(w, [(b.start_s, b.end_s + tail) for b in blocks["hog"]])
        where = f"for requests sent during the CPU hogs (+{fmt(tail)} s)"
    return _fail_fast(r, result, errors, dropped, where)


@implements("contention.recovery_s")
def contention_recovery(result: Mapping[str, Any], r: Result) -> Check:
    blocks = contention_blocks(result, r)
    last = _last_hog(result)
    if last is None and _hogs_planned(result):
        return r.skipped(NO_HOG_RAN)
    if last is None or not blocks["hog"] or not blocks["baseline"]:
        return r.skipped("the scenario has no baseline and CPU-hog blocks")
    # The band comes from the blocks before the first hog: a server that did not recover
    # between hog blocks must not set its own bar with its later baseline blocks.
    first_hog = min(b.start_s for b in blocks["hog"])
    clean = [b for b in blocks["baseline"] if b.end_s <= first_hog] or blocks["baseline"]
    # Recovery is from the last hog: disturbed means its block or the time after it left
    # a band (an earlier hog's effect that lasts into it counts too).
    return _recovery(result, r, "CPU hogs", last[0], last[1], [(b.start_s, b.end_s) for b in clean])
