"""System-wide CPU per core, and the load generator's own CPU (to flag a saturated generator).

Records only: whether the generator was saturated is decided by the checks.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.collectors import procfs
from harness.collectors.loop import CsvStream

HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class SystemTick:
    t: float
    ts: float
    late_s: float
    cpu_pct: float
    per_core: tuple[float | None, ...]
    loadgen_cpu_pct: float | None


def system_columns(cores: Iterable[int]) -> list[str]:
    return ["t", "ts", "late_s", "cpu_pct", *[f"cpu{c}_pct" for c in cores], "loadgen_cpu_pct"]


def default_loadgen_pids(exclude: Iterable[int] = ()) -> Callable[[], list[int]]:
    """The sampler's parent and its descendants, minus the sampler and ``exclude`` (the SUT).

    When the Locust master starts ``harness sample`` this is the master and its workers.
    """
    parent = os.getppid()
    me = os.getpid()
    excluded = set(exclude)

    def pids() -> list[int]:
        try:
            root = psutil.Process(parent)
            family = [parent] + [c.pid for c in root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []
        sut_tree: set[int] = set()
        for p in excluded:
            try:
                sut_tree.add(p)
                sut_tree.update(c.pid for c in psutil.Process(p).children(recursive=True))
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return [p for p in family if p != me and p not in sut_tree]

    return pids


def fixed_pids(pids: Iterable[int]) -> Callable[[], list[int]]:
    """Given pids and their descendants (``--loadgen-pid``)."""
    roots = list(pids)

    def expand() -> list[int]:
        out: list[int] = []
        for p in roots:
            try:
                out.append(p)
                out.extend(c.pid for c in psutil.Process(p).children(recursive=True))
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return out

    return expand


class SystemSampler:
    """Per-core and total CPU from /proc/stat; the generator's CPU from its processes' stat."""

    def __init__(
        self,
        out_dir: str | Path | None = None,
        *,
        loadgen_pids: Callable[[], list[int]] | None = None,
        loadgen_every_s: float = 5.0,
        recent: int = 600,
    ) -> None:
        self.loadgen_pids = loadgen_pids
        # Finding a process tree scans every process on the host: rescan every few seconds.
        self.loadgen_every_s = loadgen_every_s
        self._lg_pids: list[int] = []
        self._lg_next = 0.0
        first = procfs.read_cpu_times()
        self.cores = sorted(k for k in first if k >= 0)
        self.recent: deque[SystemTick] = deque(maxlen=recent)
        self._cpu_prev = first
        self._lg_prev: dict[tuple[int, int], int] = {}
        self._t_prev: float | None = None
        self._csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._csv = CsvStream(out / "system.csv", system_columns(self.cores))

    def _loadgen_ticks(self, t: float) -> tuple[int, dict[tuple[int, int], int]]:
        now: dict[tuple[int, int], int] = {}
        delta = 0
        if self.loadgen_pids is not None and t >= self._lg_next:
            self._lg_pids = self.loadgen_pids()
            self._lg_next = t + self.loadgen_every_s
        for pid in self._lg_pids:
            st = procfs.read_stat(f"/proc/{pid}/stat")
            if st is None:
                continue
            key = (pid, st.starttime)
            now[key] = st.utime + st.stime
            if key in self._lg_prev:
                delta += now[key] - self._lg_prev[key]
        return delta, now

    def baseline(self, t: float) -> None:
        self._cpu_prev = procfs.read_cpu_times()
        _, self._lg_prev = self._loadgen_ticks(t)
        self._t_prev = t

    def sample(self, t: float, ts: float, late_s: float = 0.0) -> SystemTick | None:
        cpu_now = procfs.read_cpu_times()
        lg_delta, lg_now = self._loadgen_ticks(t)
        dt = t - self._t_prev if self._t_prev is not None else None
        prev = self._cpu_prev
        self._cpu_prev, self._lg_prev, self._t_prev = cpu_now, lg_now, t
        if not dt or dt <= 0:
            return None

        def pct(key: int) -> float | None:
            if key not in cpu_now or key not in prev:
                return None
            busy = cpu_now[key][0] - prev[key][0]
            total = cpu_now[key][1] - prev[key][1]
            return round(100.0 * busy / total, 2) if total > 0 else 0.0

        lg = round(lg_delta * 100.0 / (HZ * dt), 2) if self.loadgen_pids else None
        tick = SystemTick(
            t=round(t, 4),
            ts=ts,
            late_s=round(late_s, 6),
            cpu_pct=pct(-1) or 0.0,
            per_core=tuple(pct(c) for c in self.cores),
            loadgen_cpu_pct=lg,
        )
        self.recent.append(tick)
        if self._csv is not None:
            self._csv.write([(tick.t, tick.ts, tick.late_s, tick.cpu_pct, *tick.per_core, lg)])
        return tick

    def close(self) -> None:
        if self._csv is not None:
            self._csv.close()
