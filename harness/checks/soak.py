"""Soak checks: memory / thread / fd leaks (REFERENCE §D) and latency drift."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from harness.analysis.trend import TrendParams, TrendResult, leak_test
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import register

MIB = 1024.0 * 1024.0

TREND_DEFAULTS: Mapping[str, Any] = {
    "warmup_frac": 0.25,
    "warmup_min_s": 0.0,
    "bucket_s": 0.0,  # 0 = automatic (span / 20, between one sample and 60 s)
    "min_buckets": 8,
    "alpha": 0.01,
    "ci": 0.90,
    "second_half_ratio": 0.5,
    "inconclusive_fails": False,
}


def _params(p: Mapping[str, Any]) -> TrendParams:
    return TrendParams(
        slope_threshold=float(p["threshold"]),
        warmup_frac=float(p["warmup_frac"]),
        warmup_min_s=float(p["warmup_min_s"]),
        bucket_s=float(p["bucket_s"]) or None,
        min_buckets=int(p["min_buckets"]),
        alpha=float(p["alpha"]),
        ci=float(p["ci"]),
        second_half_ratio=float(p["second_half_ratio"]),
    )


def _per_request(result: Mapping[str, Any], per_min: float, label: str) -> str:
    """The slope per finished request (REFERENCE §D asks for b per request)."""
    c = result.get("counters") or {}
    minutes = float(result.get("duration_s") or 0.0) / 60.0
    done = int(c.get("ok") or 0) + d.failed_total(c) if c else 0
    if minutes <= 0 or done <= 0:
        return ""
    return f", {per_min / (done / minutes):.3g} {label} per request"


def _trend_check(
    result: Mapping[str, Any],
    r: Result,
    series_key: str,
    what: str,
    scale: float,
    unit: str,
    variant: Literal["memory", "count"],
    next_step: str,
    per_req_unit: str,
) -> Check:
    server = result.get("server")
    if not server:
        return r.skipped(
            f"no server-side samples (no pid to watch): {what} cannot be judged — attach "
            "with --sut-pid or let the harness start the server"
        )
    series = server.get("series") or {}
    t, y = series.get("t") or [], series.get(series_key) or []
    if len(t) != len(y) or not t:
        return r.skipped(f"the server series has no '{series_key}' samples")
    values = np.asarray(y, dtype=float) / scale
    res = leak_test(t, values, _params(r.params), variant=variant)
    per_req_scale = 1024.0 if per_req_unit == "KiB" else 1.0  # MiB/min -> KiB
    return _trend_verdict(result, r, res, what, unit, next_step, per_req_unit, per_req_scale)


def _trend_verdict(
    result: Mapping[str, Any],
    r: Result,
    res: TrendResult,
    what: str,
    unit: str,
    next_step: str,
    per_req_unit: str,
    per_req_scale: float,
) -> Check:
    S = float(r.threshold)
    if res.verdict == "INSUFFICIENT":
        return r.skipped(
            f"insufficient samples for the {what} trend: {'; '.join(res.reasons)} — run "
            "the soak longer or set a smaller bucket_s",
            n=res.n,
        )
    b = res.slope_per_min or 0.0
    over = (
        f"{b:+.3g} {unit}/min (90 % CI {res.ci_low:+.3g}…{res.ci_high:+.3g}, "
        f"p={res.p_value:.2g}) over the last {fmt(res.span_min)} min "
        f"({res.n} medians of {fmt(res.bucket_s)} s after a {fmt(res.warmup_s)} s warm-up)"
    )
    per_req = _per_request(result, b * per_req_scale, per_req_unit)
    if res.verdict == "LEAK":
        return r.judged(
            round(b, 6),
            False,
            f"{what} leak: {over} > {fmt(S)} {unit}/min{per_req} — {next_step}",
            n=res.n,
        )
    if res.verdict == "INCONCLUSIVE":
        msg = (
            f"{what} grows {over} > {fmt(S)} {unit}/min but not conclusively "
            f"({'; '.join(res.reasons)}) — rerun with a longer soak (--duration 2h) to confirm"
        )
        if r.params["inconclusive_fails"]:
            return r.judged(round(b, 6), False, msg, n=res.n)
        return r.skipped(msg, value=round(b, 6), n=res.n)
    return r.judged(
        round(b, 6),
        True,
        f"no {what} leak: {over}; {'; '.join(res.reasons)}",
        n=res.n,
    )


@register(
    "soak.rss_trend",
    unit="MiB/min",
    op="<=",
    defaults={"threshold": 1.0, "series": "rss_bytes", **TREND_DEFAULTS},
    summary="memory leak detector (Theil–Sen slope + Mann–Kendall, warm-up excluded)",
)
def rss_trend(result: Mapping[str, Any], r: Result) -> Check:
    return _trend_check(
        result,
        r,
        r.params["series"],
        "memory",
        MIB,
        "MiB",
        "memory",
        "find what holds references (tracemalloc snapshots under load)",
        "KiB",
    )


@register(
    "soak.threads_trend",
    unit="threads/min",
    op="<=",
    defaults={"threshold": 0.5, **TREND_DEFAULTS},
    summary="thread leak detector (trend test + last third above middle third)",
)
def threads_trend(result: Mapping[str, Any], r: Result) -> Check:
    return _trend_check(
        result,
        r,
        "threads",
        "thread",
        1.0,
        "threads",
        "count",
        "look for threads started per request or per batch and never joined",
        "threads",
    )


@register(
    "soak.fds_trend",
    unit="fds/min",
    op="<=",
    defaults={"threshold": 0.5, **TREND_DEFAULTS},
    summary="file-descriptor leak detector (trend test + last third above middle third)",
)
def fds_trend(result: Mapping[str, Any], r: Result) -> Check:
    series = (result.get("server") or {}).get("series") or {}
    fds, sockets = series.get("fds") or [], series.get("socket_fds") or []
    step = "look for files, sockets or pipes opened per request and never closed"
    if not fds or len(sockets) != len(fds) or any(v is None for v in (*fds, *sockets)):
        return _trend_check(result, r, "fds", "file descriptor", 1.0, "fds", "count", step, "fds")
    # Sockets wander with the clients' connections (±15 on a 503-shedding server); files,
    # pipes and eventfds do not. Judged apart, a small leak of the quiet kind is not lost
    # in the noise of the other, and a socket leak is still judged on its own series.
    t = series.get("t") or []
    params = _params(r.params)
    other = [float(a) - float(b) for a, b in zip(fds, sockets, strict=True)]
    results = {
        "non-socket fd": leak_test(t, np.asarray(other), params, variant="count"),
        "socket fd": leak_test(t, np.asarray(sockets, dtype=float), params, variant="count"),
    }
    rank = {"LEAK": 3, "INCONCLUSIVE": 2, "PASS": 1, "INSUFFICIENT": 0}
    what, res = max(
        results.items(), key=lambda kv: (rank[kv[1].verdict], kv[1].slope_per_min or 0.0)
    )
    check = _trend_verdict(result, r, res, what, "fds", step, "fds", 1.0)
    rest = ", ".join(
        f"{name}s {x.slope_per_min:+.3g}/min ({x.verdict})"
        for name, x in results.items()
        if name != what and x.slope_per_min is not None
    )
    return dataclasses.replace(check, detail=f"{check.detail} [{rest}]") if rest else check


@register(
    "soak.latency_drift",
    unit="x",
    op="<=",
    defaults={"threshold": 2.0, "warmup_frac": 0.25, "min_excess_ms": 5.0, "min_windows": 3},
    summary="p99 late in the soak vs early (after the warm-up)",
)
def latency_drift(result: Mapping[str, Any], r: Result) -> Check:
    w = d.windows(result)
    if w is None:
        return r.skipped("no windowed latencies were recorded")
    pts = [(t, v) for t, v in zip(w.t, w.p99_ms, strict=True) if v is not None]
    if not pts:
        return r.skipped("no window had a successful response")
    t0, t1 = w.t[0], w.t[-1] + w.width_s
    start = t0 + float(r.params["warmup_frac"]) * (t1 - t0)
    third = (t1 - start) / 3.0
    early = [v for t, v in pts if start <= t < start + third]
    late = [v for t, v in pts if t >= t1 - third]
    need = int(r.params["min_windows"])
    if len(early) < need or len(late) < need:
        return r.skipped(
            f"insufficient samples: {len(early)} early and {len(late)} late windows "
            f"(need >= {need} each) — run the soak longer",
            n=min(len(early), len(late)),
        )
    e, lt = float(np.median(early)), float(np.median(late))
    ratio = lt / e if e > 0 else float("inf")
    ok = r.compare(ratio) or (lt - e) < float(r.params["min_excess_ms"])
    detail = (
        f"median windowed p99 {fmt(lt)} ms in the last third vs {fmt(e)} ms early: "
        f"{fmt(ratio)}x {'within' if ok else 'over'} {fmt(r.threshold)}x "
        f"({len(late)}/{len(early)} windows)"
    )
    if ok and not r.compare(ratio):
        detail += f" (excess < {fmt(r.params['min_excess_ms'])} ms counts as noise)"
    if not ok:
        detail += (
            " — latency grows with uptime: look for growing queues, caches or GC pressure "
            "(compare with the RSS trend)"
        )
    return r.judged(round(ratio, 4), ok, detail, n=len(early) + len(late))
