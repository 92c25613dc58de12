"""Network checks: the server under a slow or lossy network (the fault proxy's toxics).

Both read the ``network`` chaos records: each holds the proxy's own count of what its
toxic did (``detail.counters``: seconds of delay added, connections reset or held), so
what the server was exposed to is measured, not assumed. A toxic that touched nothing
makes the run invalid before any check is judged (``harness.analysis.chaos_evidence``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.chaos_records import baseline_end as _before
from harness.checks.model import Check, Result
from harness.checks.overload import _recovery
from harness.checks.registry import implements

# toxics that add time to a request (judged for amplification) and the ones that break
# connections (judged for leaks)
DELAYING = ("latency", "bandwidth", "slicer")
BREAKING = ("reset_peer", "timeout")


def network_events(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``network`` chaos records that applied and ended, in start order."""
    out = [
        c
        for c in result.get("chaos") or []
        if c.get("action") == "network"
        and c.get("ok") is True
        and isinstance(c.get("start_s"), int | float)
        and isinstance(c.get("end_s"), int | float)
    ]
    return sorted(out, key=lambda c: float(c["start_s"]))


def _toxic(rec: Mapping[str, Any]) -> str:
    return str((rec.get("params") or {}).get("toxic"))


def _counters(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    return (rec.get("detail") or {}).get("counters") or {}


def _median_p50(
    w: d.Windows, lo: float, hi: float, unanswered: float | None = None
) -> tuple[float | None, int, int]:
    """Median of the windows' p50 in [lo, hi), the windows counted, requests sent.

    A window whose requests were sent but none answered counts as ``unanswered`` (+inf
    during a fault: a request that never came back is slower than any answer); None
    leaves it out (the clean baseline)."""
    vals, sent = [], 0
    for t, n, p50 in zip(w.t, w.n, w.p50_ms, strict=True):
        if lo <= t and t + w.width_s <= hi:
            sent += n
            if p50 is not None:
                vals.append(p50)
            elif n > 0 and unanswered is not None:
                vals.append(unanswered)
    return (float(np.median(vals)) if vals else None), len(vals), sent


def _clean_before(
    events: Sequence[Mapping[str, Any]], i: int, discard_s: float, settle_s: float
) -> tuple[float, float]:
    """The clean stretch before event ``i``: from the previous event's end + settle_s (the
    run's start + discard_s for the first) to event ``i``'s start."""
    lo = discard_s if i == 0 else float(events[i - 1]["end_s"]) + settle_s
    return lo, float(events[i]["start_s"])


def _clean_after(
    events: Sequence[Mapping[str, Any]], i: int, settle_s: float, run_end: float
) -> tuple[float, float]:
    """The clean stretch after event ``i``: from its end + settle_s to the next event's
    start (the run's end after the last)."""
    hi = float(events[i + 1]["start_s"]) if i + 1 < len(events) else run_end
    return float(events[i]["end_s"]) + settle_s, hi


def _bracket(
    w: d.Windows, spans: Sequence[tuple[float, float]], min_windows: int
) -> tuple[float | None, list[str]]:
    """The clean latency around a fault: the mean of the median window p50 of each clean
    stretch in ``spans`` that has ``min_windows`` answered windows (None: none has). With
    a stretch on each side, the server's own drift through the run (its time rising or
    falling whatever the network does) is interpolated to the fault's time instead of
    being charged to the fault."""
    medians, notes = [], []
    for lo, hi in spans:
        med, n, _ = _median_p50(w, lo, hi)
        if med is not None and n >= min_windows:
            medians.append(med)
            notes.append(f"{fmt(med)} ms ({fmt(lo)}–{fmt(hi)} s)")
    return (float(np.mean(medians)) if medians else None), notes


@implements("network.latency_amplification")
def latency_amplification(result: Mapping[str, Any], r: Result) -> Check:
    p = r.params
    events = network_events(result)
    delaying = [i for i, e in enumerate(events) if _toxic(e) in DELAYING]
    if not delaying:
        return r.skipped(
            "no latency, bandwidth or slicer toxic applied in this run: nothing to amplify"
        )
    w = d.windows(result)
    if w is None:
        return r.skipped("no windowed latencies were recorded")
    worst: tuple[float, str] | None = None
    parts: list[str] = []
    judged = 0
    for i in delaying:
        e = events[i]
        start, end = float(e["start_s"]), float(e["end_s"])
        name = f"{_toxic(e)} {(e.get('params') or {}).get('stream')} ({fmt(start)}–{fmt(end)} s)"
        settle_s, min_n = float(p["settle_s"]), int(p["min_windows"])
        before = _clean_before(events, i, float(p["discard_s"]), settle_s)
        after = _clean_after(events, i, settle_s, float(result.get("duration_s") or end))
        base, base_notes = _bracket(w, (before, after), min_n)
        during, dur_n, sent = _median_p50(w, start + float(p["discard_s"]), end, math.inf)
        delay_s = _counters(e).get("delay_s")
        span = end - start - float(p["discard_s"])
        if base is None or dur_n < min_n:
            parts.append(
                f"{name}: {len(base_notes)} clean stretch(es) beside it and {dur_n} window(s) "
                f"during it with answers (each needs {min_n}): not judged"
            )
            continue
        if not isinstance(delay_s, int | float) or sent <= 0 or span <= 0:
            parts.append(f"{name}: the proxy recorded no delay figure: not judged")
            continue
        # The proxy's own total of added seconds over the requests sent while it was on
        # (the rate during the judged windows x the toxic's length): the mean delay a
        # request was given, whatever the toxicity and the chunks per request.
        rate = sent / (dur_n * w.width_s) if dur_n else 0.0
        requests = rate * (end - start)
        injected_ms = 1000.0 * float(delay_s) / requests if requests > 0 else 0.0
        if injected_ms < float(p["min_injected_ms"]):
            parts.append(
                f"{name}: {fmt(injected_ms)} ms injected per request < "
                f"{fmt(p['min_injected_ms'])} ms: too little to judge"
            )
            continue
        added = during - base
        ratio = added / injected_ms if math.isfinite(added) else math.inf
        judged += 1
        parts.append(
            f"{name}: median p50 {fmt(during)} ms vs {fmt(base)} ms clean beside it "
            f"({' and '.join(base_notes)}) = "
            f"{added:+.3g} ms for {fmt(injected_ms)} ms injected per request "
            f"({fmt(ratio)}x{'; windows with no answer count as never answered' if math.isinf(during) else ''})"
        )
        if worst is None or ratio > worst[0]:
            worst = (ratio, name)
    if worst is None:
        return r.skipped("; ".join(parts) or "no network event to judge")
    ok = r.compare(worst[0])
    detail = (
        f"worst {worst[1]}: latency added {fmt(worst[0])}x the delay the proxy injected, "
        f"{'<=' if ok else '>'} {fmt(r.threshold)}x [" + "; ".join(parts) + "]"
    )
    if not ok:
        detail += (
            " — the server turned the network's delay into more of its own: a slow client "
            "holds something every request needs (a lock, a worker, a connection slot) "
            "across its I/O; read the body before taking shared resources"
        )
    value = round(worst[0], 3) if math.isfinite(worst[0]) else math.inf
    return r.judged(value, ok, detail, n=judged)


def _server_span(
    result: Mapping[str, Any], key: str, spans: Sequence[tuple[float, float]]
) -> list[float]:
    """Server samples of ``key`` whose scenario time falls in any of ``spans``."""
    series = (result.get("server") or {}).get("series") or {}
    return _in_spans(result, series.get(key) or [], spans)


def _in_spans(
    result: Mapping[str, Any], y: Sequence[float | None], spans: Sequence[tuple[float, float]]
) -> list[float]:
    """The known values of ``y`` (on the server's ticks) whose scenario time falls in any
    of ``spans``."""
    t = ((result.get("server") or {}).get("series") or {}).get("t") or []
    off = _offset(result)
    if off is None or len(t) != len(y):
        return []
    return [
        float(v)
        for ti, v in zip(t, y, strict=True)
        if v is not None and any(lo <= float(ti) + off < hi for lo, hi in spans)
    ]


def _offset(result: Mapping[str, Any]) -> float | None:
    """Scenario time of the sampler's t = 0."""
    s = (result.get("server") or {}).get("started_unix")
    r0 = result.get("started_unix")
    if not isinstance(s, int | float) or not isinstance(r0, int | float):
        return None
    return float(s) - float(r0)


def _net_sockets(result: Mapping[str, Any], spans: Sequence[tuple[float, float]]) -> list[float]:
    """The server's sockets less the harness's own connections, tick by tick: a tick
    missing either (a count read late) is left out, never paired with another tick's."""
    series = (result.get("server") or {}).get("series") or {}
    socks, conns = series.get("socket_fds") or [], series.get("client_conns") or []
    if len(socks) != len(conns):
        return []
    net = [
        None if s is None or c is None else float(s) - float(c)
        for s, c in zip(socks, conns, strict=True)
    ]
    return _in_spans(result, net, spans)


@implements("network.leaks")
def leaks(result: Mapping[str, Any], r: Result) -> Check:
    p = r.params
    events = network_events(result)
    breaking = [e for e in events if _toxic(e) in BREAKING]
    if not breaking:
        return r.skipped("no reset_peer or timeout toxic applied in this run: nothing broke")
    if not result.get("server"):
        return r.skipped(
            "no server-side samples (no pid was watched): leaked sockets and threads cannot "
            "be judged — let the harness start the server (--sut-cmd) or attach with --sut-pid"
        )
    end_run = float(result.get("duration_s") or 0.0)
    first, last = float(breaking[0]["start_s"]), float(breaking[-1]["end_s"])
    quiet = [(float(e["start_s"]), float(e["end_s"])) for e in events]

    def clean(lo: float, hi: float) -> list[tuple[float, float]]:
        """[lo, hi) minus every network event."""
        out, cur = [], lo
        for a, b in quiet:
            if b <= cur or a >= hi:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
        if cur < hi:
            out.append((cur, hi))
        return out

    before = clean(float(p["discard_s"]), first)
    after = clean(last + float(p["settle_s"]), end_run)
    resets = sum(int(_counters(e).get("resets") or 0) for e in breaking)
    held = sum(int(_counters(e).get("connections_held") or 0) for e in breaking)
    found: list[tuple[float, str]] = []
    notes = []
    for what, vals_of in (
        ("sockets (net of the harness's own connections)", lambda s: _net_sockets(result, s)),
        ("threads", lambda s: _server_span(result, "threads", s)),
    ):
        b, a = vals_of(before), vals_of(after)
        if len(b) < int(p["min_samples"]) or len(a) < int(p["min_samples"]):
            notes.append(f"{what}: {len(b)} sample(s) before, {len(a)} after: not judged")
            continue
        step = float(np.median(a)) - float(np.median(b))
        found.append((step, what))
        notes.append(
            f"{what}: median {fmt(float(np.median(b)))} before the first fault, "
            f"{fmt(float(np.median(a)))} from {fmt(p['settle_s'])} s after the last ({step:+.3g})"
        )
    if not found:
        return r.skipped(
            "; ".join(notes) + f" (need {p['min_samples']} each; run the recovery phase "
            "longer or keep --sample on)"
        )
    step, what = max(found)
    ok = r.compare(step)
    detail = (
        f"{fmt(step)} {what} more once the server settled after {resets} connection "
        f"reset(s) and {held} blackholed connection(s), {'<=' if ok else '>'} "
        f"{fmt(r.threshold)} [" + "; ".join(notes) + "]"
    )
    if not ok:
        per = step / resets if resets else math.nan
        detail += (
            f" — {fmt(per)} per reset: look for per-connection state (a socket, a thread, "
            "a buffer) released on a clean close only; the error path of a reset must "
            "release it too"
        )
    return r.judged(step, ok, detail, n=resets + held)


@implements("network.recovery_s")
def recovery(result: Mapping[str, Any], r: Result) -> Check:
    """After the last connection-breaking fault (a blackhole, resets): time until p99 and
    the error rate are back within the bands of the clean stretches before the faults."""
    p = r.params
    events = network_events(result)
    breaking = [e for e in events if _toxic(e) in BREAKING]
    if not breaking:
        return r.skipped("no reset_peer or timeout toxic applied in this run: nothing broke")
    last = breaking[-1]
    start, end = float(last["start_s"]), float(last["end_s"])
    # the baseline: the clean stretches before the first fault and between faults, each
    # ending before requests still in flight at the next fault's start (as freeze's)
    spans = []
    for i, e in enumerate(events):
        lo, hi = _clean_before(events, i, float(p["discard_s"]), float(p["settle_s"]))
        hi = _before(result, hi)
        if hi > lo:
            spans.append((lo, hi))
        if e is last:
            break
    label = f"{_toxic(last)} ({fmt(end - start)} s, the last connection-breaking fault)"
    check = _recovery(result, r, label, start, end, spans)
    if check.passed is False:
        check = dataclasses.replace(
            check,
            detail=check.detail
            + " — the server did not come back once the network did: look for state that "
            "outlives a broken connection (a circuit breaker tripped by client disconnects, "
            "a pool slot held until its own timeout, a reconnect backoff)",
        )
    return check
