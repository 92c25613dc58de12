"""Another tenant's CPU on the server's cores: how much of their capacity work that was not
the run's took (integrated over the run, its stages and sliding windows, against a
budget with one unattributable event allowed), and the capacity probe's own accounting.
Validity conditions like those of ``validity.py`` (which offers them with the others):
None when fine, else one sentence with numbers and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


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
    # a probe lasts a few seconds: a few hundred ticks a core, where the counters' whole
    # ticks (2 a process of the run) are a share the budget must not be spent on — only
    # foreign CPU beyond what they can hide is another tenant's
    resolution = float(probe_cpu.get("resolution_core_s") or 0.0)  # type: ignore[arg-type]
    tenant = saturated = None
    if span > 0 and cores and isinstance(foreign, (int, float)):
        share = float(foreign) / (len(cores) * span)
        beyond = max(0.0, float(foreign) - resolution) / (len(cores) * span)
        if beyond > budget:
            tenant = (
                PROBE + f"work that was not the run's used {share:.2f} core-s per "
                f"server core-s on the server's cores over its {span:.1f} s ({beyond:.2f} "
                f"beyond the counters' resolution; budget {budget:g}): the capacity it measured, and every rate written as a multiple "
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
