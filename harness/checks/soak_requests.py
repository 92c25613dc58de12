"""Soak checks of what the requests got over the soak: failures (in bursts or spread) and
latency drift (a slope or a late step in the windowed p99). The server's resource
trends: soak.py."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from harness.analysis.hdr import nearest_rank
from harness.analysis.percentiles import binom_ppf
from harness.analysis.trend import (
    bucket_medians,
    mann_kendall,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.latency import (
    failure_kinds,
    failure_rate,
    rate_of_enough,
    stage_list,
    unanswered,
)
from harness.checks.model import Check, Result
from harness.checks.registry import implements
from harness.results import readers


def _row_counters(errors: Mapping[str, Any], ok: int) -> dict[str, Any]:
    """A window row's outcomes in the shape of the run's counters (every request of a row
    has finished), so the steady checks' failure rules (``failure_rate``, ``unanswered``)
    read a window exactly as they read a whole run."""
    failed = {str(k): int(v) for k, v in errors.items() if k != "dropped"}
    dropped = int(errors.get("dropped") or 0)
    return {
        "scheduled": ok + dropped + sum(failed.values()),
        "ok": ok,
        "dropped": dropped,
        "in_flight": 0,
        "failed": failed,
    }


@dataclasses.dataclass(frozen=True)
class _Window:
    """One sliding window of the error-rate check: its failures against its bound."""

    start_s: float
    bad: int
    n: int
    # failures a server failing at the whole-soak threshold exceeds with probability
    # alpha/K (computed for the windows whose share is over window_threshold)
    bound: int | None = None

    @property
    def share(self) -> float:
        return self.bad / self.n if self.n else 0.0


@dataclasses.dataclass(frozen=True)
class _Bursts:
    length_s: float  # each window's length
    count: int  # K: the windows judged (sliding by one row)
    over: list[_Window]  # the windows over both bounds, in time order
    worst: _Window | None  # the window with the largest failure share


def _bursts(result: Mapping[str, Any], r: Result, include_dropped: bool) -> _Bursts | None:
    """Every ``window_s`` stretch of the judged span (sliding by one recorded window),
    judged against the per-window bound; None when no windows were recorded.

    A window fails when its failure share is over ``window_threshold`` *and* its failure
    count is over what a server failing at the whole-soak ``threshold`` p would exceed with
    probability ``alpha``/K (the binomial upper quantile at n, p; K windows): by the union
    bound, a server whose requests fail independently at p or less fails no window in
    1 − ``alpha`` of its runs, however many windows overlap.
    """
    w = d.windows(result)
    if w is None:
        return None
    lo, hi = -math.inf, math.inf
    if r.params["stage"]:
        st = d.stage(result, r.params["stage"])
        if st is not None:
            lo, hi = float(st["start_s"]), float(st["end_s"])
    rows = [
        (t, failure_rate(_row_counters(errs, ok), include_dropped)[1:])
        for t, ok, errs in zip(w.t, w.ok, w.errors, strict=True)
        if lo <= t < hi
    ]
    if not rows:
        return None
    width = w.width_s
    t0 = rows[0][0]
    size = int(round((rows[-1][0] - t0) / width)) + 1
    bad, fin = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    for t, (b, n) in rows:
        i = int(round((t - t0) / width))
        bad[i] += b
        fin[i] += max(n, 0)
    m = min(size, max(1, int(round(float(r.params["window_s"]) / width))))
    cb = np.concatenate([[0], np.cumsum(bad)])
    cn = np.concatenate([[0], np.cumsum(fin)])
    sums_b, sums_n = cb[m:] - cb[:-m], cn[m:] - cn[:-m]
    k = len(sums_b)
    q = 1.0 - float(r.params["alpha"]) / k
    p0 = float(r.threshold)
    share_max = float(r.params["window_threshold"])
    judged = [
        _Window(t0 + j * width, int(b), int(n))
        for j, (b, n) in enumerate(zip(sums_b, sums_n, strict=True))
        if n > 0
    ]
    # the binomial bound only where the share is over (most windows of a run have none)
    over = [
        x
        for x in (
            dataclasses.replace(x, bound=binom_ppf(q, x.n, p0))
            for x in judged
            if x.share > share_max
        )
        if x.bad > x.bound
    ]
    worst = max(judged, key=lambda x: (x.share, x.bad), default=None)
    return _Bursts(m * width, k, over, worst)


def _burst_words(b: _Bursts, r: Result) -> str:
    """The windows over the per-window bound (where failures began, the worst), or the
    worst window when none is."""
    if not b.over:
        x = b.worst
        if x is None:
            return f"no {fmt(b.length_s)} s window finished a request"
        return (
            f"no {fmt(b.length_s)} s window over {float(r.params['window_threshold']):.0%} "
            f"failed ({b.count} sliding windows; the worst from t={fmt(x.start_s)} s: "
            f"{x.bad} of {x.n}, {x.share:.1%})"
        )
    first, last = b.over[0], b.over[-1]
    worst = max(b.over, key=lambda x: (x.share, x.bad))
    return (
        f"{len(b.over)} of {b.count} sliding {fmt(b.length_s)} s windows failed more than "
        f"{float(r.params['window_threshold']):.0%} of their requests, from "
        f"t={fmt(first.start_s)} s to t={fmt(last.start_s + b.length_s)} s; the worst from "
        f"t={fmt(worst.start_s)} s: {worst.bad} of {worst.n} failed ({worst.share:.1%}), "
        f"over the {worst.bound} a server failing {float(r.threshold):.0%} of requests "
        f"exceeds in 1 of {fmt(b.count / float(r.params['alpha']))} windows"
    )


@implements("soak.error_rate")
def soak_error_rate(result: Mapping[str, Any], r: Result) -> Check:
    """Failures over the whole soak (failed, timed out, reset, dropped at the client's cap:
    ``steady.error_rate``'s rule) ≤ ``threshold``, and in every ``window_s`` stretch of it
    (``_bursts``): a server that stops serving part-way fails here, whatever its latency."""
    c = d.counters(result, stage_names=stage_list(r.params["stage"]))
    if c is None:
        return r.skipped("no request counters were recorded")
    include = bool(r.params["include_dropped"])
    got = rate_of_enough(r, c, include, "", "run the soak longer or at a higher rate")
    if isinstance(got, Check):
        return got
    rate, bad, denom = got
    whole_ok = r.compare(rate)
    whole = (
        f"{bad} of {denom} requests over the soak failed ({rate:.2%}) "
        f"{'<=' if whole_ok else '>'} {float(r.threshold):.2%}; by kind: {failure_kinds(c)}"
    )
    bursts = _bursts(result, r, include)
    step = (
        " — the server stops serving part-way through the soak: see errors by kind over "
        "time in the report (a resource that runs out with uptime: connections, file "
        "descriptors, a queue that never drains, a credential that expires)"
    )
    if bursts is None:
        return r.judged(
            round(rate, 6),
            whole_ok,
            f"{whole}; no windowed counts were recorded, so bursts of failures were not judged"
            + ("" if whole_ok else step),
            n=denom,
        )
    if not whole_ok:
        return r.judged(round(rate, 6), False, f"{whole}; {_burst_words(bursts, r)}{step}", n=denom)
    if bursts.over:
        worst = max(bursts.over, key=lambda x: (x.share, x.bad))
        return r.judged(
            round(worst.share, 6),
            False,
            f"{_burst_words(bursts, r)}; over the whole soak {whole}{step}",
            n=worst.n,
            threshold=float(r.params["window_threshold"]),
        )
    return r.judged(round(rate, 6), True, f"{whole}; {_burst_words(bursts, r)}", n=denom)


def _row_p99_ms(row: Mapping[str, Any]) -> float | None:
    """A window row's p99 over every request that finished in it, failed, timed-out and
    dropped ones ranked above every success (as ``steady.p99_ms`` ranks them): ``inf``
    when more than 1 % failed; None when none finished.

    A row keeps its ok answers' p99 and max, not their histogram: the rank the failures
    shift the p99 to is the ok p99's own (exact), the slowest ok answer's (exact), or one
    between them, which is read as the slowest (an upper bound)."""
    ok = int(row.get("ok") or 0)
    bad = unanswered(_row_counters(row.get("errors") or {}, ok))
    n = ok + bad
    if n == 0:
        return None
    rank = nearest_rank(n, 0.99)
    if rank > ok:
        return math.inf
    key = "p99_ms" if rank <= nearest_rank(ok, 0.99) else "max_ms"
    value = row.get(key) if row.get(key) is not None else row.get("p99_ms")
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def _window_p99s(
    result: Mapping[str, Any],
) -> tuple[float, list[float], list[float], list[float]] | None:
    """(width, every window start, the starts with a finished request, their p99 over
    every request — the worst class's), or None when no windows were recorded."""
    rows, width = readers.window_rows(result)
    if not rows:
        return None
    starts: set[float] = set()
    worst: dict[float, float] = {}
    for row in rows:
        t = float(row["t"])
        starts.add(t)
        v = _row_p99_ms(row)
        if v is not None:
            worst[t] = max(worst.get(t, v), v)
    ts = sorted(worst)
    return width, sorted(starts), ts, [worst[t] for t in ts]


def _ranked(y: np.ndarray) -> np.ndarray:
    """``y`` with each failure (inf) replaced by one value above every finite one: the
    same order, so the rank tests (Mann–Kendall, Mann–Whitney) can read it."""
    finite = y[np.isfinite(y)]
    top = (float(finite.max()) + 1.0) if finite.size else 1.0
    return np.where(np.isfinite(y), y, top)


@dataclasses.dataclass
class _Growth:
    """The two measures of latency_drift (the fit's slope, the thirds' step) judged the
    same way: a ratio over the threshold fails only when significant at ``alpha`` and at
    least ``floor`` ms above its start; otherwise the reason it still passes is kept."""

    r: Result
    alpha: float
    floor: float
    reasons: list[str] = dataclasses.field(default_factory=list)  # over, yet passes: why
    fails: list[str] = dataclasses.field(default_factory=list)

    def judge(
        self, ratio: float, p: float, excess_ms: float, words: tuple[str, str], failure: str
    ) -> None:
        """``words``: what the measure is called in the reasons (its significance, its
        excess); ``failure``: what a real growth means."""
        if self.r.compare(ratio):
            return
        if p >= self.alpha:
            self.reasons.append(f"the {words[0]} is not significant (p >= {fmt(self.alpha)})")
        elif excess_ms < self.floor:
            self.reasons.append(f"the {words[1]} is < {fmt(self.floor)} ms (noise)")
        else:
            self.fails.append(failure)


@implements("soak.latency_drift")
def latency_drift(result: Mapping[str, Any], r: Result) -> Check:
    """The windowed p99 over every request (failures ranked slowest, a window with more
    than 1 % failed is a failure, +inf) after the warm-up, judged two ways; either fails:

    * the fit: a Theil–Sen line through ~20 bucket medians (per-second p99s are
      autocorrelated), its end over its start, with Mann–Kendall significance — a slope;
    * the thirds: the median window p99 of the last third of the judged span over that of
      the first third, with a one-sided Mann–Whitney test on their bucket medians — a step.
      A Theil–Sen slope is the median of the pairwise slopes, and a step covering the last
      third makes only 4/9 of the pairs rise: the fit stays flat under a 10x step.

    Each fails only over ``threshold`` x, significant at ``alpha`` and at least
    ``min_excess_ms`` above its start (noise on a millisecond p99 is no drift).
    """
    from scipy.stats import mannwhitneyu, theilslopes  # here: a second to import

    got = _window_p99s(result)
    if got is None:
        return r.skipped("no windowed latencies were recorded")
    width, starts, wts, wys = got
    if not wts:
        return r.skipped("no window had a finished request")
    t0, t1 = starts[0], starts[-1] + width
    start = t0 + float(r.params["warmup_frac"]) * (t1 - t0)
    span = [(t, v) for t, v in zip(wts, wys, strict=True) if t >= start]
    need = 3 * int(r.params["min_windows"])
    if len(span) < need:
        return r.skipped(
            f"insufficient samples: {len(span)} windows after the warm-up (need >= {need}) "
            "— run the soak longer",
            n=len(span),
        )
    ts = np.asarray([t for t, _ in span])
    ys = np.asarray([v for _, v in span])
    failing = int(np.sum(~np.isfinite(ys)))
    if failing == len(ys):
        return r.skipped(
            f"every one of the {len(ys)} windows after the warm-up failed more than 1 % of "
            "its requests: there is no latency to compare (soak.error_rate judges the "
            "failures)",
            n=len(span),
        )
    floor = float(r.params["min_excess_ms"])
    alpha = float(r.params["alpha"])
    bucket_s = max(width, (ts[-1] - ts[0] + width) / float(r.params["buckets"]))
    tb, yb = bucket_medians(ts, ys, bucket_s, float(ts[0]))
    if len(tb) < 3:
        return r.skipped(f"insufficient samples: {len(tb)} buckets", n=len(span))
    ranked = _ranked(yb)
    _, p_trend = mann_kendall(ranked)
    parts: list[str] = []
    ratios: list[float] = []
    growth = _Growth(r, alpha, floor)
    # the fit: a slope, through the buckets whose median is a latency
    fin = np.isfinite(yb)
    if int(fin.sum()) >= 3:
        fit = theilslopes(yb[fin], tb[fin] / 60.0)
        at_start = fit.intercept + fit.slope * tb[0] / 60.0
        at_end = fit.intercept + fit.slope * tb[-1] / 60.0
        fit_ratio = max(at_end, 0.0) / max(at_start, floor)
        ratios.append(fit_ratio)
        parts.append(
            f"trend {fit.slope:+.3g} ms/min (Theil–Sen, Mann–Kendall p={p_trend:.2g}, "
            f"{len(tb)} medians of {fmt(bucket_s)} s): fitted {fmt(at_start)} → "
            f"{fmt(at_end)} ms, {fmt(fit_ratio)}x"
        )
        growth.judge(
            fit_ratio,
            p_trend,
            at_end - at_start,
            ("trend", "fitted excess"),
            "latency grows with uptime: look for growing queues, caches or GC "
            "pressure (compare with the RSS trend)",
        )
    # the thirds: a step
    third = (ts[-1] + width - ts[0]) / 3.0
    early, late = ys[ts < ts[0] + third], ys[ts >= ts[0] + 2 * third]
    b_early, b_late = ranked[tb < ts[0] + third], ranked[tb >= ts[0] + 2 * third]
    if early.size and late.size:
        p_early, p_late = float(np.median(early)), float(np.median(late))
        p_step = (
            float(mannwhitneyu(b_late, b_early, alternative="greater").pvalue)
            if b_early.size and b_late.size
            else 1.0
        )
        words = f"last third {fmt(p_late)} ms vs first third {fmt(p_early)} ms"
        if math.isinf(p_early):
            parts.append(
                f"{words}: most windows of the first third already failed more than 1 % "
                "of their requests, so no step is measured from it"
            )
        else:
            step_ratio = p_late / max(p_early, floor)
            ratios.append(step_ratio)
            parts.append(
                f"{words} (median window p99, Mann–Whitney p={p_step:.2g}), {fmt(step_ratio)}x"
            )
            growth.judge(
                step_ratio,
                p_step,
                p_late - p_early,
                ("step", "step"),
                "most windows of the last third failed more than 1 % of their "
                "requests (their p99 a failure): see soak.error_rate and the "
                "errors by kind over time"
                if math.isinf(p_late)
                else "latency stepped up late in the soak: look for what changed then "
                "(a cache or pool that filled, a background job, a degraded mode)",
            )
    value = max(ratios) if ratios else 1.0
    ok = not growth.fails
    minutes = (ts[-1] - ts[0] + width) / 60.0
    counted = (
        f"; {failing} of {len(ys)} windows failed more than 1 % of their requests, their "
        "p99 a failure"
        if failing
        else ""
    )
    detail = (
        f"windowed p99 over every request (failures ranked slowest{counted}) over "
        f"{fmt(minutes)} min after a {fmt(start - t0)} s warm-up: "
        + "; ".join(parts)
        + f" — {fmt(value)}x {'within' if r.compare(value) else 'over'} {fmt(r.threshold)}x"
    )
    if ok and growth.reasons:
        detail += " but " + " and ".join(growth.reasons)
    if growth.fails:
        detail += " — " + "; ".join(growth.fails)
    return r.judged(round(value, 4) if math.isfinite(value) else value, ok, detail, n=len(span))
