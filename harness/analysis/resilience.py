"""Before / during / after a chaos event: the steady-state hypothesis, measured.

Chaos Toolkit's model — state the steady state, break something, check the steady state
again — joined with load statistics: for any chaos event (a pause, a kill, a SIGTERM, a
network fault), the same numbers over three spans of the run:

* **before**: up to ``span_s`` seconds ending at the event's start (not earlier than the
  previous event's end or ``skip_s`` into the run, so one event's tail is not another's
  baseline);
* **during**: the event itself, start to end as recorded (a kill's ends when the
  restarted server is ready);
* **after**: up to ``span_s`` seconds from the event's end (not past the next event's
  start or the run's end).

Latency and errors come from the window rows (keyed by intended send time: a request sent
during a freeze that fails later counts *during*); server resources from the sampler's
series. Pure functions over plain sequences: the checks (harness.checks.freeze, .crash, .shutdown) and
the reports (harness.report) feed them what they read from the results document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SPAN_S = 10.0
SKIP_S = 2.0
EDGE = 0.05  # of a window's width: how far an event's edge may miss a window's edge  # the first seconds of a run are connection set-up, not a baseline
BAND_LABELS = ("before", "during", "after")
# Failure kinds that mean the server never answered the request (it was lost to it), as
# opposed to an answer that was an error (a 503 is an answer).
UNANSWERED_KINDS = ("timeout", "connection", "bad_response", "cancelled")
# Of those, the ones where the server *held* the request without answering until the
# client gave up (or the run ended): a closed or refused connection fails at once, a
# held one only at the client's timeout.
HELD_KINDS = ("timeout", "cancelled")
# Answers that were not this request's own: a request answered twice or with another's.
MISANSWERED_KINDS = ("id_mismatch", "cross_wired", "bad_response")


@dataclass(frozen=True)
class Span:
    label: str
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)


@dataclass(frozen=True)
class BandStats:
    """One span's numbers (None: nothing recorded there)."""

    label: str
    start_s: float
    end_s: float
    sent: int  # requests sent (window n), ok + every failure kind incl. dropped
    ok: int
    failed: int
    error_rate: float | None  # failed / sent
    ok_rps: float | None  # ok answers per second of span
    p99_ms: float | None  # median of the windowed p99s (the span's typical p99)
    p99_max_ms: float | None  # worst windowed p99 in the span
    rss_mib: float | None  # medians of the server's sampled series
    threads: float | None
    fds: float | None  # non-socket fds (sockets follow the load)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spans(
    start_s: float,
    end_s: float,
    run_end_s: float,
    *,
    span_s: float = SPAN_S,
    prev_end_s: float | None = None,
    next_start_s: float | None = None,
    skip_s: float = SKIP_S,
) -> list[Span]:
    """The before / during / after spans of one event (clipped as the module says)."""
    lo = max(start_s - span_s, prev_end_s if prev_end_s is not None else skip_s, 0.0)
    hi = min(end_s + span_s, run_end_s, next_start_s if next_start_s is not None else math.inf)
    return [
        Span("before", lo, max(lo, start_s)),
        Span("during", start_s, max(start_s, end_s)),
        Span("after", end_s, max(end_s, hi)),
    ]


def _in(t: float, width_s: float, span: Span) -> bool:
    """Whether the window ``[t, t + width_s)`` counts in ``span``. A window that overlaps
    the event at all is *during* it (a freeze that began 1 ms into a window stalled that
    window's requests); *before* takes only windows that end by the event's start, *after*
    only those that start at or after its end. ``EDGE`` of a window's width forgives the
    timeline's millisecond jitter."""
    tol = EDGE * width_s
    if span.label == "during":
        if span.length_s == 0:
            return t - tol <= span.start_s < t + width_s - tol
        return t + width_s > span.start_s + tol and t < span.end_s - tol
    if span.label == "before":
        return t >= span.start_s - tol and t + width_s <= span.end_s + tol
    return t >= span.start_s - tol and t < span.end_s - tol


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


def window_band(
    span: Span,
    t_s: Sequence[float],
    n: Sequence[int],
    ok: Sequence[int],
    p99_ms: Sequence[float | None],
    width_s: float,
) -> dict[str, Any]:
    """Sent / ok / failed / error rate / p99 of the windows in ``span``."""
    sent = good = 0
    p99s: list[float] = []
    for t, a, b, p in zip(t_s, n, ok, p99_ms, strict=True):
        if not _in(float(t), width_s, span):
            continue
        sent += int(a)
        good += int(b)
        if p is not None and math.isfinite(p):
            p99s.append(float(p))
    failed = sent - good
    return {
        "sent": sent,
        "ok": good,
        "failed": failed,
        "error_rate": failed / sent if sent else None,
        "ok_rps": good / span.length_s if span.length_s > 0 else None,
        "p99_ms": _median(p99s),
        "p99_max_ms": max(p99s) if p99s else None,
    }


def series_median(t_s: Sequence[float], values: Sequence[float | None], span: Span) -> float | None:
    """Median of the sampled values with ``start <= t < end`` (None: no sample there)."""
    vals = [
        float(v)
        for t, v in zip(t_s, values, strict=False)
        if v is not None and span.start_s <= float(t) < span.end_s and math.isfinite(float(v))
    ]
    return _median(vals)


def band_stats(
    span: Span,
    windows: Mapping[str, Sequence[Any]] | None,
    width_s: float,
    server: Mapping[str, Sequence[Any]] | None,
) -> BandStats:
    """``windows``: ``t``, ``n``, ``ok``, ``p99_ms`` (merged over classes); ``server``: the
    sampler's series (``t``, ``rss_bytes``, ``threads``, ``fds``, ``socket_fds``)."""
    w = (
        window_band(span, windows["t"], windows["n"], windows["ok"], windows["p99_ms"], width_s)
        if windows
        else {
            "sent": 0,
            "ok": 0,
            "failed": 0,
            "error_rate": None,
            "ok_rps": None,
            "p99_ms": None,
            "p99_max_ms": None,
        }
    )
    rss = threads = fds = None
    if server and server.get("t"):
        t = server["t"]
        rss_b = series_median(t, server.get("rss_bytes") or [], span)
        rss = rss_b / (1 << 20) if rss_b is not None else None
        threads = series_median(t, server.get("threads") or [], span)
        fds = series_median(t, non_socket_fds(server), span)
    return BandStats(
        span.label, span.start_s, span.end_s, **w, rss_mib=rss, threads=threads, fds=fds
    )


def non_socket_fds(server: Mapping[str, Sequence[Any]]) -> list[float | None]:
    """fds that are not sockets, per sample: sockets come and go with the clients'
    connections; files, pipes and eventfds left behind are the server's own."""
    fds = list(server.get("fds") or [])
    socks = list(server.get("socket_fds") or [])
    if len(socks) != len(fds):
        return [float(f) if f is not None else None for f in fds]
    return [
        float(f) - float(s) if f is not None and s is not None else None
        for f, s in zip(fds, socks, strict=True)
    ]


def event_bands(
    start_s: float,
    end_s: float,
    run_end_s: float,
    windows: Mapping[str, Sequence[Any]] | None,
    width_s: float,
    server: Mapping[str, Sequence[Any]] | None,
    *,
    span_s: float = SPAN_S,
    prev_end_s: float | None = None,
    next_start_s: float | None = None,
) -> list[BandStats]:
    """The three bands of one event, in order before, during, after."""
    return [
        band_stats(s, windows, width_s, server)
        for s in spans(
            start_s,
            end_s,
            run_end_s,
            span_s=span_s,
            prev_end_s=prev_end_s,
            next_start_s=next_start_s,
        )
    ]


@dataclass(frozen=True)
class Step:
    """A resource's level before an event and once the server settled after it."""

    name: str
    before: float | None
    after: float | None

    @property
    def step(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


def resource_steps(server: Mapping[str, Sequence[Any]], before: Span, after: Span) -> list[Step]:
    """Threads, non-socket fds and RSS (MiB): median before vs median after."""
    t = server.get("t") or []
    rss = [None if v is None else float(v) / (1 << 20) for v in server.get("rss_bytes") or []]
    return [
        Step(
            "threads",
            series_median(t, server.get("threads") or [], before),
            series_median(t, server.get("threads") or [], after),
        ),  # fmt: skip
        Step(
            "fds",
            series_median(t, non_socket_fds(server), before),
            series_median(t, non_socket_fds(server), after),
        ),  # fmt: skip
        Step("rss_mib", series_median(t, rss, before), series_median(t, rss, after)),
    ]
