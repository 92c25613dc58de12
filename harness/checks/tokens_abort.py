"""``llm.abort_recovery``: after a storm of clients hanging up mid-stream, the server is back
to its baseline — what a disconnected client held is freed.

It reads the server's own gauge of what it holds, scraped from its ``/metrics`` during
the run (``harness.collectors.metrics``; the results document's ``metrics`` section):
the KV-cache usage (vLLM's ``vllm:kv_cache_usage_perc`` or its older
``vllm:gpu_cache_usage_perc``, SGLang's ``sglang:token_usage``; a fraction of the cache,
0-1, averaged over the label sets of one scrape). The baseline is the median of the
samples in the baseline stage (after its first ``discard_s``); the end of the recovery
is the median of the samples in its last ``tail_s``. Both stages run the same load with
no aborts, so a healthy server holds the same in-flight requests' blocks in both; a
server that leaks an aborted request's blocks holds every one of them on top. The check
fails when the end of the recovery exceeds the baseline by more than ``threshold``
(fraction points of the cache).

Without a KV gauge it judges the server's resident memory (RSS, sampled by the
harness's own collector when it watches the server's pid) the same way, relative to
the baseline (``rss_threshold``); with neither it is skipped, naming what was missing.
A run whose storm stage aborted no stream is skipped too: there was nothing to recover
from.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements

# the KV-cache gauges, by server: the first one a run's /metrics has is judged
KV_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


def _stage(result: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((s for s in result.get("stages") or [] if s.get("name") == name), None)


def _sampler_offset(result: Mapping[str, Any]) -> float | None:
    """Scenario time of the sampler's t = 0 (its metrics share its time base)."""
    r0 = result.get("started_unix")
    for section in ("server", "system"):
        s = (result.get(section) or {}).get("started_unix")
        if isinstance(s, int | float) and isinstance(r0, int | float):
            return float(s) - float(r0)
    return None


def kv_series(result: Mapping[str, Any]) -> tuple[str, list[float], list[float]] | None:
    """(gauge name, scenario times, usage 0-1) of the first KV gauge scraped, each scrape's
    label sets averaged; None when the run has none (or no time base to place it)."""
    series = (result.get("metrics") or {}).get("series") or {}
    off = _sampler_offset(result)
    if off is None:
        return None
    for gauge in KV_GAUGES:
        by_t: dict[float, list[float]] = {}
        for key, ser in series.items():
            if key.split("{")[0] != gauge:
                continue
            for t, v in zip(ser.get("t") or [], ser.get("v") or [], strict=False):
                by_t.setdefault(float(t), []).append(float(v))
        if by_t:
            ts = sorted(by_t)
            return gauge, [t + off for t in ts], [sum(by_t[t]) / len(by_t[t]) for t in ts]
    return None


def rss_series(result: Mapping[str, Any]) -> tuple[list[float], list[float]] | None:
    """(scenario times, RSS bytes) of the watched server; None when it was not sampled."""
    server = result.get("server") or {}
    series = server.get("series") or {}
    t, y = series.get("t") or [], series.get("rss_bytes") or []
    off = _sampler_offset(result)
    if off is None or len(t) != len(y):
        return None
    pairs = [(float(a) + off, float(b)) for a, b in zip(t, y, strict=True) if b is not None]
    if not pairs:
        return None
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _between(ts: Sequence[float], vs: Sequence[float], lo: float, hi: float) -> list[float]:
    return [v for t, v in zip(ts, vs, strict=True) if lo <= t < hi]


def _aborted_in(result: Mapping[str, Any], stage: str) -> int | None:
    cell = ((result.get("tokens") or {}).get("by_stage") or {}).get("classes", {}).get(stage)
    return None if cell is None else int(cell.get("aborted") or 0)


def _recovery_goodput(result: Mapping[str, Any], stage: str) -> str:
    cell = ((result.get("tokens") or {}).get("by_stage") or {}).get("classes", {}).get(stage)
    if not cell:
        return ""
    total = int(cell.get("requests") or 0) + int(cell.get("dropped") or 0)
    ok = int(cell.get("conforming") or 0)
    return f"; {ok} of {total} streams sent in the recovery got a whole answer" if total else ""


@implements("llm.abort_recovery")
def abort_recovery(result: Mapping[str, Any], r: Result) -> Check:
    p = r.params
    names = (str(p["baseline_stage"]), str(p["storm_stage"]), str(p["recovery_stage"]))
    stages = [_stage(result, n) for n in names]
    missing = [n for n, s in zip(names, stages, strict=True) if s is None]
    if missing:
        return r.skipped(
            f"the run has no stage {missing[0]!r}: name the baseline, storm and recovery "
            "stages in the check's baseline_stage / storm_stage / recovery_stage"
        )
    base, _, rec = stages
    assert base is not None and rec is not None
    aborted = _aborted_in(result, names[1])
    if not aborted:
        return r.skipped(
            f"no stream was aborted in stage {names[1]!r} (give the scenario's [llm] "
            "abort_share and abort_stages): there was no storm to recover from"
        )
    b_lo = float(base["start_s"]) + float(p["discard_s"])
    b_hi = float(base["end_s"])
    r_hi = float(rec["end_s"])
    r_lo = max(float(rec["start_s"]), r_hi - float(p["tail_s"]))
    min_samples = int(p["min_samples"])
    where = f"baseline {fmt(b_lo)}-{fmt(b_hi)} s, end of the recovery {fmt(r_lo)}-{fmt(r_hi)} s"
    goodput = _recovery_goodput(result, names[2])
    kv = kv_series(result)
    if kv is not None:
        gauge, ts, vs = kv
        before, after = _between(ts, vs, b_lo, b_hi), _between(ts, vs, r_lo, r_hi)
        if min(len(before), len(after)) < min_samples:
            return r.skipped(
                f"{len(before)} / {len(after)} samples of {gauge} in the {where} "
                f"(< {min_samples}): scrape /metrics more often or lengthen the stages"
            )
        b, a = statistics.median(before), statistics.median(after)
        rise = a - b
        ok = r.compare(rise)
        detail = (
            f"{gauge} median {a:.1%} at the end of the recovery vs {b:.1%} in the baseline "
            f"({len(after)} / {len(before)} scrapes; {where}): {rise * 100:+.1f} points, "
            f"{'≤' if ok else '>'} {float(r.threshold) * 100:g} after {aborted} aborted "
            f"streams{goodput}"
        )
        if not ok:
            detail += (
                " — what a disconnected client held is not freed: its KV blocks stay "
                "allocated after the hang-up, and the cache fills with each one until "
                "nothing is admitted (free a sequence's blocks on every abort path)"
            )
        return r.judged(round(rise, 4), ok, detail, n=len(after))
    rss = rss_series(result)
    if rss is None:
        scraped = bool((result.get("metrics") or {}).get("series"))
        gauges = ", ".join(KV_GAUGES)
        return r.skipped(
            (
                f"the server exported no KV-cache gauge in /metrics ({gauges})"
                if scraped
                else f"/metrics was not scraped (--metrics-url URL: {gauges})"
            )
            + " and its RSS was not sampled (watch its pid: --sut-pid, or let the harness "
            "start it): nothing says what it holds"
        )
    ts, vs = rss
    before, after = _between(ts, vs, b_lo, b_hi), _between(ts, vs, r_lo, r_hi)
    if min(len(before), len(after)) < min_samples or not before:
        return r.skipped(
            f"{len(before)} / {len(after)} RSS samples in the {where} (< {min_samples})"
        )
    b, a = statistics.median(before), statistics.median(after)
    rise = (a - b) / b if b > 0 else 0.0
    limit = float(p["rss_threshold"])
    ok = rise <= limit
    mib = 1024.0 * 1024.0
    detail = (
        f"no KV-cache gauge in /metrics: the server's RSS median {a / mib:.1f} MiB at the end "
        f"of the recovery vs {b / mib:.1f} MiB in the baseline ({where}): {rise:+.1%}, "
        f"{'≤' if ok else '>'} {limit:.0%} after {aborted} aborted streams{goodput}"
    )
    if not ok:
        detail += (
            " — memory a disconnected client held is not freed (its request's state, its "
            "cache or its buffers outlive the hang-up)"
        )
    return r.judged(round(rise, 4), ok, detail, n=len(after), threshold=limit)
