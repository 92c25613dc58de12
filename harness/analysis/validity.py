"""Conditions under which a run judges nothing (STYLE habit 9).

Each function returns None when the condition is fine, or one sentence with numbers
saying what went wrong and what to do. They take plain series and counters, or the
sampler's ``server`` / ``system`` sections as docs/outputs.md describes them; which
limits apply is ``harness.checks.engine.validity``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

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


@dataclass(frozen=True)
class ForeignShare:
    """CPU on the server's cores that was not the run's, integrated over one window.

    ``core_s``: core-seconds used by work outside the run; ``capacity_core_s``: the
    server's cores x the seconds of the window that were measured (ticks with no figure
    count in neither). ``share`` = core_s / capacity_core_s: 0.31 is 0.31 core-s taken
    per core-s the server's cores had.
    """

    where: str
    start_s: float
    end_s: float
    core_s: float
    capacity_core_s: float

    @property
    def share(self) -> float:
        return self.core_s / self.capacity_core_s if self.capacity_core_s > 0 else 0.0


def foreign_shares(
    t_s: Sequence[float],
    foreign_pct: Sequence[float | None],
    cores: Sequence[float | None] | float,
    windows: Sequence[tuple[str, float, float]],
    *,
    offset_s: float = 0.0,
    interval_s: float | None = None,
    window_s: float = 10.0,
    run_s: float | None = None,
) -> list[ForeignShare]:
    """The foreign share over each named window (scenario seconds) and over every
    ``window_s`` window of ``[0, run_s]`` (one ending at each tick).

    A tick at ``t`` (sampler time, moved onto scenario time by ``offset_s``) covers the
    interval since the previous tick (the first: one ``interval_s``); a window takes the
    part of each tick inside it. A named window shorter than ``window_s`` is judged over
    the ``window_s`` around its middle (inside ``[0, run_s]``): one or two ticks are too
    few to tell a tenant from a process of the run caught between rescans.
    ``cores``: how many cores each tick's figure is over (``foreign_cores``), or one
    number for all.
    """
    t = [float(x) for x in t_s]
    if not t or len(foreign_pct) != len(t):
        return []
    if interval_s is None:
        interval_s = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    ncores = [cores] * len(t) if isinstance(cores, (int, float)) else list(cores)
    if len(ncores) != len(t):
        return []
    ticks: list[tuple[float, float, float, float]] = []  # (start, end, core_s/s, cores)
    prev = t[0] - interval_s
    for ti, pct, n in zip(t, foreign_pct, ncores, strict=True):
        a, b = prev + offset_s, ti + offset_s
        prev = ti
        if pct is None or not math.isfinite(pct) or not n or b <= a:
            continue
        ticks.append((a, b, float(pct) / 100.0, float(n)))
    if not ticks:
        return []
    end = run_s if run_s is not None else ticks[-1][1]
    starts = np.array([x[0] for x in ticks])
    ends = np.array([x[1] for x in ticks])
    rate = np.array([x[2] for x in ticks])
    ncore = np.array([x[3] for x in ticks])
    # the integrals up to each tick's end: a window is two look-ups, not a pass
    cum_used = np.concatenate(([0.0], np.cumsum(rate * (ends - starts))))
    cum_cap = np.concatenate(([0.0], np.cumsum(ncore * (ends - starts))))

    def upto(x: float) -> tuple[float, float]:
        i = int(np.searchsorted(ends, x, side="left"))  # ticks before i end at or before x
        used, cap = float(cum_used[i]), float(cum_cap[i])
        if i < len(ticks) and x > starts[i]:
            part = x - float(starts[i])
            used += float(rate[i]) * part
            cap += float(ncore[i]) * part
        return used, cap

    def share(where: str, a: float, b: float) -> ForeignShare:
        (ua, ca), (ub, cb) = upto(a), upto(b)
        return ForeignShare(where, a, b, ub - ua, cb - ca)

    def widened(a: float, b: float) -> tuple[float, float]:
        if b - a >= window_s or end <= window_s:
            return (max(0.0, a), min(end, b)) if end > 0 else (a, b)
        mid = (a + b) / 2
        lo = min(max(0.0, mid - window_s / 2), end - window_s)
        return lo, lo + window_s

    out = [share(where, *widened(a, b)) for where, a, b in windows]
    if window_s > 0:
        for tb in ends:
            a = float(tb) - window_s
            if a < -1e-9 or tb > end + 1e-9:
                continue
            out.append(share(f"a {window_s:g} s window", a, float(tb)))
    return [w for w in out if w.capacity_core_s > 0]


def foreign_cpu_budget(
    shares: Sequence[ForeignShare],
    foreign: Sequence[Mapping[str, object]] = (),
    *,
    budget: float = 0.05,
    offset_s: float = 0.0,
    interval_s: float = 1.0,
    cores: Sequence[int] | None = None,
) -> str | None:
    """Work that was not the run's used more of the server's cores than ``budget`` (a
    share of their capacity) over one of ``shares``' windows: the server shared its CPU
    with another tenant, and its latencies are not its own. The reason gives the worst
    window's figure, the whole run's when that is among them (first), and the busiest
    processes outside the run in the worst window (``foreign``:
    ``system.foreign_processes``, sampler time; moved by ``offset_s``)."""
    if not shares:
        return None
    worst = max(shares, key=lambda w: w.share)
    if worst.share <= budget:
        return None
    span = max(1e-9, worst.end_s - worst.start_s)
    by: dict[tuple[object, object], float] = {}
    for row in foreign:
        t = row.get("t")
        pct = row.get("cpu_pct")
        if (
            isinstance(t, (int, float))
            and isinstance(pct, (int, float))
            and worst.start_s < float(t) + offset_s <= worst.end_s + 1e-9
        ):
            key = (row.get("pid"), row.get("name"))
            by[key] = by.get(key, 0.0) + float(pct) * interval_s  # % of a core x seconds
    named = sorted(by.items(), key=lambda kv: -kv[1])[:2]
    who = (
        "busiest outside the run: "
        + ", ".join(f"pid {pid} ({name}) {v / span:.0f} % of a core" for (pid, name), v in named)
        if named
        else "no single process stood out (short-lived processes, the kernel, a hypervisor)"
    )
    run = shares[0]
    whole = (
        f"; over the whole run {run.share:.2f}"
        if run is not worst and run.where == "the run"
        else ""
    )
    on = f" (core{'s' if len(cores) > 1 else ''} {', '.join(map(str, cores))})" if cores else ""
    return (
        f"work that was not the run's used {worst.share:.2f} core-s per server core-s on the "
        f"server's cores{on} over {worst.where} (t = {worst.start_s:.0f}-{worst.end_s:.0f} s; "
        f"budget {budget:g}{whole}); {who}: the server shared its CPU with another tenant, so "
        "what was measured is not the server's alone — rerun on a quiet machine, or give "
        "the server cores nothing else uses (--sut-cores)"
    )


# Every reason about the capacity probe starts so (harness.acceptance does not pin a
# capacity measured by a probe judged disturbed or saturated).
PROBE = "the capacity probe: "


def probe_problems(
    probe_cpu: Mapping[str, object] | None,
    *,
    budget: float = 0.05,
    loadgen_max_pct: float = 90.0,
) -> tuple[str | None, str | None]:
    """(another tenant, the generator saturated) during the capacity probe, from the
    probe's own CPU accounting (``calibration.cpu``, ``harness.load.calibrate``). Either
    makes the capacity — and every rate written as a multiple of it — not the server's."""
    if not probe_cpu or not probe_cpu.get("measured"):
        return None, None
    span = float(probe_cpu.get("span_s") or 0.0)
    cores = list(probe_cpu.get("server_cores") or [])  # type: ignore[call-overload]
    foreign = probe_cpu.get("foreign_core_s")
    tenant = saturated = None
    if span > 0 and cores and isinstance(foreign, (int, float)):
        share = float(foreign) / (len(cores) * span)
        if share > budget:
            tenant = (
                PROBE + f"work that was not the run's used {share:.2f} core-s per "
                f"server core-s on the server's cores over its {span:.1f} s (budget "
                f"{budget:g}): the capacity it measured, and every rate written as a multiple "
                "of it, is not the server's alone — rerun on a quiet machine, or set the "
                "capacity (--capacity-rps, load.capacity_rps)"
            )
    lg = probe_cpu.get("loadgen_cpu_s")
    if span > 0 and isinstance(lg, (int, float)):
        pct = 100.0 * float(lg) / span
        if pct >= loadgen_max_pct:
            saturated = (
                PROBE + f"the load generator's process used {pct:.0f} % of a core "
                f"over its {span:.1f} s (>= {loadgen_max_pct:g} %): the capacity it measured is "
                "the generator's, not the server's — fewer calibration users "
                "(load.calibration_users), or set the capacity (--capacity-rps, "
                "load.capacity_rps)"
            )
    return tenant, saturated


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
    """scheduled − (ok + Σfailed + dropped + in_flight); 0 when every request is accounted."""
    failed = counters.get("failed") or {}
    if not isinstance(failed, Mapping):
        raise TypeError(f"counters.failed must be a mapping, got {type(failed).__name__}")
    total = (
        int(counters.get("ok", 0) or 0)
        + sum(int(v) for v in failed.values())
        + int(counters.get("dropped", 0) or 0)
        + int(counters.get("in_flight", 0) or 0)
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
