"""Conditions under which a run judges nothing (STYLE habit 9).

Each function returns None when the condition is fine, or one sentence with numbers
saying what went wrong and what to do. They take plain series and counters, or the
sampler's ``server`` / ``system`` sections as docs/outputs.md describes them; which
limits apply is ``harness.checks.engine.validity``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.analysis.foreign_cpu import PROBE as PROBE
from harness.analysis.foreign_cpu import ForeignShare as ForeignShare
from harness.analysis.foreign_cpu import foreign_cpu_budget as foreign_cpu_budget
from harness.analysis.foreign_cpu import foreign_shares as foreign_shares
from harness.analysis.foreign_cpu import probe_problems as probe_problems
from harness.analysis.percentiles import percentile_ms

# What to do when the generator, not the server, was the limit. Workers help only where
# they get cores of their own: on a 2-core box the server has one and the generator the
# other, so a second Locust process there shares the generator's core.
GENERATOR_REMEDY = (
    "lower the rate, or give the load generator more CPU: Locust workers (--processes N) "
    "on cores the server does not use, or on another machine (--master / --worker)"
)


def longest_run_above(
    t_s: Sequence[float], values: Sequence[float | None], threshold: float
) -> tuple[float, int]:
    """Longest stretch (seconds, samples) of consecutive samples ``>= threshold``.

    A stretch of k samples spans from its first to one interval past its last sample, so
    a single tick counts as one interval, not zero.
    """
    t = np.asarray(t_s, dtype=float)
    if len(t) == 0:
        return 0.0, 0
    interval = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    best_s, best_k = 0.0, 0
    start: int | None = None
    for i, v in enumerate(values):
        above = v is not None and math.isfinite(v) and v >= threshold
        if above and start is None:
            start = i
        if start is not None and (not above or i == len(t) - 1):
            last = i if above else i - 1
            span = float(t[last] - t[start]) + interval
            if span > best_s:
                best_s, best_k = span, last - start + 1
            start = None
    return best_s, best_k


def sustained_level(
    t_s: Sequence[float], values: Sequence[float | None], sustain_s: float
) -> float | None:
    """The highest level the series held for ``sustain_s``: the largest L for which
    ``longest_run_above(t_s, values, L)`` spans ``sustain_s`` or more (so
    ``loadgen_saturated`` fires exactly when this reaches its ``max_pct``). None when no
    stretch is that long. A missing sample breaks a stretch, as it does there.
    """
    t = np.asarray(t_s, dtype=float)
    if len(t) == 0:
        return None
    interval = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    v = [x if x is not None and math.isfinite(x) else -math.inf for x in values]
    best: float | None = None
    j = 0
    for i in range(len(t)):
        j = max(j, i)
        while j < len(t) and float(t[j] - t[i]) + interval < sustain_s:
            j += 1
        if j == len(t):
            break  # no later window is long enough either
        level = min(v[i : j + 1])
        if level > -math.inf and (best is None or level > best):
            best = level
    return best


def loadgen_saturated(
    t_s: Sequence[float],
    cpu_pct: Sequence[float | None],
    *,
    max_pct: float = 90.0,
    sustain_s: float = 5.0,
) -> str | None:
    """The load generator's CPU was ``>= max_pct`` for ``sustain_s`` or longer."""
    span, k = longest_run_above(t_s, cpu_pct, max_pct)
    if span >= sustain_s:
        peak = max(float(v) for v in cpu_pct if v is not None and math.isfinite(v))
        return (
            f"load generator CPU >= {max_pct:g} % for {span:.0f} s in a row ({k} samples, "
            f"peak {peak:.0f} %): the generator, not the server, was the bottleneck — "
            + GENERATOR_REMEDY
        )
    return None


def loadgen_process_saturated(
    t_s: Sequence[float],
    processes: Sequence[Mapping[str, object]],
    *,
    max_pct: float = 90.0,
    sustain_s: float = 5.0,
) -> str | None:
    """One generator process held ``>= max_pct`` CPU for ``sustain_s`` or longer.

    Per process, because each Locust process is one gevent loop on one core: a saturated
    worker sends late even when its siblings idle and the summed series looks half used.
    ``processes``: ``system.loadgen_processes`` (``pid``, ``name``, ``cpu_pct`` aligned
    with ``t_s``).
    """
    worst: tuple[float, int, Mapping[str, object], list] | None = None
    for proc in processes:
        cpu = list(proc.get("cpu_pct") or [])
        if len(cpu) != len(t_s):
            continue
        span, k = longest_run_above(t_s, cpu, max_pct)
        if span >= sustain_s and (worst is None or span > worst[0]):
            worst = (span, k, proc, cpu)
    if worst is None:
        return None
    span, k, proc, cpu = worst
    peak = max(float(v) for v in cpu if v is not None and math.isfinite(v))
    who = proc.get("name") if proc.get("pid") is None else f"{proc.get('pid')} ({proc.get('name')})"
    return (
        f"load generator process {who} CPU >= "
        f"{max_pct:g} % for {span:.0f} s in a row ({k} samples, peak {peak:.0f} %): that "
        "Locust process, one core's worth of gevent loop, was the bottleneck whatever its "
        "siblings did — " + GENERATOR_REMEDY
    )


def loadgen_process_held(
    t_s: Sequence[float], processes: Sequence[Mapping[str, object]], sustain_s: float
) -> float | None:
    """The highest CPU level any one generator process held for ``sustain_s``
    (``sustained_level`` per process, so it reaches ``max_pct`` exactly when
    ``loadgen_process_saturated`` fires)."""
    levels = [
        sustained_level(t_s, list(p.get("cpu_pct") or []), sustain_s)
        for p in processes
        if len(p.get("cpu_pct") or []) == len(t_s)
    ]
    held = [x for x in levels if x is not None]
    return max(held) if held else None


def loadgen_mean_saturated(
    cpu_s_by_worker: Mapping[str, float], duration_s: float, *, max_pct: float = 90.0
) -> str | None:
    """Without sampled generator CPU (no sampler ran): a Locust process whose CPU time
    over the whole run averaged ``>= max_pct`` of a core was saturated for most of it.
    Coarse — a saturated stretch inside an idle run averages out — but never silent."""
    if duration_s <= 0:
        return None
    for name, cpu_s in sorted(cpu_s_by_worker.items()):
        pct = 100.0 * float(cpu_s) / duration_s
        if pct >= max_pct:
            return (
                f"load generator process {name!r} used {pct:.0f} % of a core on average "
                f"over the {duration_s:.0f} s run (>= {max_pct:g} %): the generator, not "
                "the server, was the bottleneck — " + GENERATOR_REMEDY
            )
    return None


def dispatch_lag_excessive(
    lag_hist: HdrHistogram | None, slo_ms: float, *, max_fraction: float = 0.1
) -> str | None:
    """Open-loop dispatch lag p99 above ``max_fraction`` of the latency SLO."""
    if lag_hist is None or lag_hist.get_total_count() == 0:
        return None
    p99 = percentile_ms(lag_hist, 99.0)
    limit = max_fraction * slo_ms
    if p99 is not None and p99 > limit:
        return (
            f"dispatch lag p99 {p99:.1f} ms > {limit:.1f} ms ({max_fraction:.0%} of the "
            f"{slo_ms:g} ms SLO, n={lag_hist.get_total_count()}): requests left late, so "
            "latencies are not the server's — " + GENERATOR_REMEDY
        )
    return None


def sampler_gaps(
    t_s: Sequence[float],
    *,
    interval_s: float,
    ticks: int | None = None,
    missed_ticks: int | None = None,
    max_missed_frac: float = 0.05,
    max_gap_intervals: float = 5.0,
) -> str | None:
    """The server sampler missed too many ticks, or left a hole that could hide a spike."""
    problems = _gap_problems(
        t_s,
        interval_s=interval_s,
        ticks=ticks,
        missed_ticks=missed_ticks,
        max_missed_frac=max_missed_frac,
        max_gap_intervals=max_gap_intervals,
    )
    if problems:
        return "server sampler: " + "; ".join(problems) + BUSY
    return None


BUSY = " — the box was too busy to sample; rerun with fewer parallel jobs or a longer --interval"


def _coverage(t_s: Sequence[float], *, offset_s: float, run_s: float, interval_s: float) -> float:
    """The fraction of the run [0, run_s] between the first and the last sample (each
    widened by one interval: a sampler cannot tick before its first interval ends)."""
    if not t_s or run_s <= 0:
        return 0.0
    first = float(t_s[0]) + offset_s - interval_s
    last = float(t_s[-1]) + offset_s + interval_s
    return max(0.0, min(last, run_s) - max(first, 0.0)) / run_s


def sampler_problems(
    server: Mapping[str, object],
    system: Mapping[str, object] | None,
    *,
    run_start_unix: float | None,
    run_s: float,
    needed: Mapping[str, str],
    min_coverage: float = 0.9,
    max_missed_frac: float = 0.05,
    max_gap_intervals: float = 5.0,
) -> str | None:
    """A sampler ran (``server`` is its section) but its evidence is missing or partial.

    Problems: no samples of the server at all; samples covering less than
    ``min_coverage`` of the run (first/last sample against the run, the sampler's clock
    moved onto the scenario's with both sections' ``started_unix``); too many missed ticks
    or a long gap; no or short load-generator CPU series (the saturation rule would not
    run); a series a listed check reads (``needed``: check id → series) not recorded.
    """
    series: Mapping[str, list] = server.get("series") or {}
    t = list(series.get("t") or [])
    interval = float(server.get("interval_s") or 1.0)
    started = server.get("started_unix")
    offset = (
        float(started) - float(run_start_unix)
        if started is not None and run_start_unix is not None
        else 0.0
    )
    problems: list[str] = []
    died: list[str] = []
    if not t:
        died.append("no samples of the server process")
    else:
        cov = _coverage(t, offset_s=offset, run_s=run_s, interval_s=interval)
        if run_s > 0 and cov < min_coverage:
            died.append(
                f"server samples cover {cov:.0%} of the {run_s:.0f} s run (< "
                f"{min_coverage:.0%}; t = {t[0] + offset:.0f}…{t[-1] + offset:.0f} s)"
            )
    problems += _gap_problems(
        t,
        interval_s=interval,
        ticks=server.get("ticks"),
        missed_ticks=server.get("missed_ticks"),
        max_missed_frac=max_missed_frac,
        max_gap_intervals=max_gap_intervals,
    )
    sys_series: Mapping[str, list] = (system or {}).get("series") or {}
    st = sys_series.get("t") or []
    cpu = sys_series.get("loadgen_cpu_pct") or []
    measured = (
        [x for x, c in zip(st, cpu, strict=False) if c is not None] if len(st) == len(cpu) else []
    )
    if not measured:
        died.append("no load-generator CPU samples (generator saturation cannot be judged)")
    else:
        sys_started = (system or {}).get("started_unix", started)
        sys_offset = (
            float(sys_started) - float(run_start_unix)
            if sys_started is not None and run_start_unix is not None
            else offset
        )
        cov = _coverage(measured, offset_s=sys_offset, run_s=run_s, interval_s=interval)
        if run_s > 0 and cov < min_coverage:
            died.append(
                f"load-generator CPU samples cover {cov:.0%} of the run (< {min_coverage:.0%})"
            )
    if t:
        for cid, key in needed.items():
            values = series.get(key)
            if not values or all(x is None for x in values):
                died.append(f"no '{key}' series, which {cid} reads")
    if not problems and not died:
        return None
    advice = []
    errors = int(server.get("tick_errors") or 0)
    if errors and (died or problems):
        died.append(f"{errors} sampler tick(s) raised, the last: {server.get('last_error')}")
    if died:
        tail = server.get("log_tail")
        advice.append(
            "the sampler stopped, started late or could not read the server — see "
            "samples/sampler.log"
            + (f" (its last line: {str(tail).splitlines()[-1]!r})" if tail else "")
            + " and rerun"
        )
    if problems:
        advice.append(BUSY.removeprefix(" — "))
    return "server sampler: " + "; ".join(died + problems) + " — " + "; ".join(advice)


def _gap_problems(
    t_s: Sequence[float],
    *,
    interval_s: float,
    ticks: int | None = None,
    missed_ticks: int | None = None,
    max_missed_frac: float = 0.05,
    max_gap_intervals: float = 5.0,
) -> list[str]:
    problems: list[str] = []
    if missed_ticks is not None and ticks is not None:
        expected = ticks + missed_ticks
        if expected > 0 and missed_ticks / expected > max_missed_frac:
            problems.append(
                f"missed {missed_ticks} of {expected} ticks "
                f"({missed_ticks / expected:.1%} > {max_missed_frac:.0%})"
            )
    t = np.asarray(t_s, dtype=float)
    if len(t) > 1 and interval_s > 0:
        gap = float(np.max(np.diff(t)))
        if gap > max_gap_intervals * interval_s:
            problems.append(
                f"a {gap:.1f} s gap between samples (> {max_gap_intervals:g} x the "
                f"{interval_s:g} s interval)"
            )
    return problems


def accounting_imbalance(counters: Mapping[str, object]) -> int:
    """scheduled − (ok + Σfailed + dropped + in_flight + aborted); 0 when every request is
    accounted."""
    failed = counters.get("failed") or {}
    if not isinstance(failed, Mapping):
        raise TypeError(f"counters.failed must be a mapping, got {type(failed).__name__}")
    total = (
        int(counters.get("ok", 0) or 0)
        + sum(int(v) for v in failed.values())
        + int(counters.get("dropped", 0) or 0)
        + int(counters.get("in_flight", 0) or 0)
        + int(counters.get("aborted", 0) or 0)
    )
    return int(counters.get("scheduled", 0) or 0) - total


def accounting_unbalanced(counters: Mapping[str, object], where: str = "run") -> str | None:
    diff = accounting_imbalance(counters)
    if diff:
        return (
            f"request accounting does not balance for the {where}: scheduled "
            f"{counters.get('scheduled')} != ok + failed + dropped + in_flight "
            f"(off by {diff:+d}) — a harness defect; report it with results.json"
        )
    return None
