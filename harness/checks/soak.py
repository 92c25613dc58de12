"""Soak checks of the server's resources: memory, thread and fd leaks (trends over the
soak). What the requests got over it (failures, latency drift): soak_requests.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from harness.analysis.trend import (
    TrendParams,
    TrendResult,
    leak_test,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements, resolve_params

MIB = 1024.0 * 1024.0


# The server series each soak check reads (``rss_trend`` reads the one its ``series``
# parameter names): listed but missing, the run cannot judge what it was asked to.
SERVER_SERIES: Mapping[str, str | None] = {
    "soak.rss_trend": None,  # params["series"]
    "soak.threads_trend": "threads",
    "soak.fds_trend": "fds",
}


def needed_server_series(
    check_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """check id → the server series it needs, for the enabled soak checks the scenario lists."""
    overrides = overrides or {}
    out: dict[str, str] = {}
    for cid, key in SERVER_SERIES.items():
        if cid not in check_config:
            continue
        params = resolve_params(cid, check_config.get(cid), overrides.get(cid))
        if params.get("enabled", True):
            out[cid] = str(params["series"]) if key is None else key
    return out


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
    """The slope per finished request (a leak per request is what a fix is sized against)."""
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
            f"no server-side samples (no pid was watched): {what} cannot be judged — attach "
            "with --sut-pid or let the harness start the server (and do not pass --no-sample)"
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
            f"({'; '.join(res.reasons)})"
        )
        full = result.get("mode") == "full"
        if r.params["inconclusive_fails"] or (full and r.params["inconclusive_fails_full"]):
            why = "inconclusive_fails" if r.params["inconclusive_fails"] else "a full run"
            return r.judged(
                round(b, 6),
                False,
                f"{msg} — counted as a failure ({why}): rerun with a longer soak "
                "(--duration 2h) to tell a leak from a plateau",
                n=res.n,
            )
        return r.skipped(
            f"{msg} — rerun with a longer soak (--duration 2h) to confirm (a full run "
            "fails on this)",
            value=round(b, 6),
            n=res.n,
        )
    return r.judged(
        round(b, 6),
        True,
        f"no {what} leak: {over}; {'; '.join(res.reasons)}",
        n=res.n,
    )


@implements("soak.rss_trend")
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


@implements("soak.threads_trend")
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


@implements("soak.fds_trend")
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
    # The server's socket count includes one socket per connection the harness holds
    # (its keep-alive pool keeps as many as the peak concurrency, which rises with
    # latency): judge what is left once those are taken out, so the harness's own
    # connections are never read as the server's leak.
    conns = series.get("client_conns") or []
    # a count read late leaves its tick unknown (harness.load.own_conns): the net series
    # is judged on the ticks that have one. Falling back to all sockets for a few late
    # counts would judge the harness's keep-alive pool as the server's: it grows as the
    # load starts and plateaus, +3 to +27 sockets/min over the first 30 s of a healthy
    # quick soak across two hosts (one tick of 61 was unknown in a measured contention
    # run). Fewer ticks only cost the trend test power, and it says when too few are
    # left; only a series mostly without counts is judged whole, as one without any.
    known = [i for i, c in enumerate(conns) if c is not None]
    net = len(conns) == len(sockets) and len(known) >= max(2, 0.5 * len(sockets))
    if net:
        socket_t = [t[i] for i in known]
        socket_series = np.asarray([float(sockets[i]) - float(conns[i]) for i in known])
    else:
        socket_t, socket_series = t, np.asarray(sockets, dtype=float)
    results = {
        "non-socket fd": leak_test(t, np.asarray(other), params, variant="count"),
        "socket fd": leak_test(socket_t, socket_series, params, variant="count"),
    }
    # The worse verdict; on a tie the quiet series, whose slope is the defect's own (the
    # socket count also follows the clients' concurrency, which rises with latency).
    rank = {"LEAK": 3, "INCONCLUSIVE": 2, "PASS": 1, "INSUFFICIENT": 0}
    what, res = max(results.items(), key=lambda kv: (rank[kv[1].verdict], kv[0] == "non-socket fd"))
    check = _trend_verdict(result, r, res, what, "fds", step, "fds", 1.0)
    rest = ", ".join(
        f"{name}s {x.slope_per_min:+.3g}/min ({x.verdict})"
        for name, x in results.items()
        if name != what and x.slope_per_min is not None
    )
    if net:
        gross = leak_test(t, np.asarray(sockets, dtype=float), params, variant="count")
        note = (
            f"sockets net of the harness's own connections to the server (median "
            f"{fmt(float(np.median(np.asarray([conns[i] for i in known], dtype=float))))}"
        )
        if len(known) < len(conns):
            note += f"; {len(conns) - len(known)} of {len(conns)} ticks without a count left out"
        if gross.slope_per_min is not None:
            note += f"; all sockets {gross.slope_per_min:+.3g}/min"
        rest = f"{rest}; {note})" if rest else f"{note})"
    return dataclasses.replace(check, detail=f"{check.detail} [{rest}]") if rest else check
