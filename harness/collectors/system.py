"""System-wide CPU per core, and the load generator's own CPU (to flag a saturated generator).

The generator's CPU is recorded summed (``system.csv``, for the report) and per process
(``loadgen.csv``): each Locust process runs one gevent loop on one core, so one worker
at 100 % beside an idle one is saturated although the sum is only half of two cores.
Records only: whether the generator was saturated is decided by the checks.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

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
    # (pid, name, %CPU, RSS bytes) of each generator process measured over this interval:
    # the RSS shows whether the harness itself grows over a long soak
    loadgen_procs: tuple[tuple[int, str, float, int | None], ...] = ()


LOADGEN_COLUMNS = ["t", "pid", "name", "cpu_pct", "rss_bytes"]


def system_columns(cores: Iterable[int]) -> list[str]:
    return ["t", "ts", "late_s", "cpu_pct", *[f"cpu{c}_pct" for c in cores], "loadgen_cpu_pct"]


def _tree(pid: int) -> list[int]:
    kids = procfs.descendants(pid)
    return [] if kids is None else [pid, *kids]


# The process name CPU hogs give themselves: they are children of the load generator
# (the chaos timeline runs in the Locust master) but their CPU is the chaos, not the load.
HOG_COMM = "harness-hog"


def _is_hog(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == HOG_COMM
    except OSError:
        return False


def loadgen_pids(
    roots: Iterable[int] | None = None, exclude: Callable[[], Iterable[int]] = tuple
) -> Callable[[], list[int]]:
    """The load generator's processes: ``roots`` and their descendants (default root: the
    sampler's parent), minus the sampler itself and the process trees of ``exclude()``
    (the SUT — a Locust master that started the server has it among its children) and
    the CPU hogs of the chaos timeline.
    """
    tops = list(roots) if roots is not None else [os.getppid()]
    me = os.getpid()

    def pids() -> list[int]:
        family = [p for r in tops for p in _tree(r)]
        skip = {me, *(p for s in exclude() for p in _tree(s))}
        return [p for p in family if p not in skip and not _is_hog(p)]

    return pids


class SystemSampler:
    """Per-core and total CPU from /proc/stat; the generator's CPU (and RSS) from its processes."""

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
        self._csv = self._lg_csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._csv = CsvStream(out / "system.csv", system_columns(self.cores))
            self._lg_csv = CsvStream(out / "loadgen.csv", LOADGEN_COLUMNS)

    def loadgen_now(self) -> list[int]:
        """The generator's processes as of the last rescan."""
        return list(self._lg_pids)

    def _loadgen_ticks(
        self, t: float
    ) -> tuple[int, dict[tuple[int, int], int], list[tuple[int, str, int]]]:
        """(summed Δticks, counters by (pid, start), per-process (pid, name, Δticks))."""
        now: dict[tuple[int, int], int] = {}
        delta = 0
        per: list[tuple[int, str, int]] = []
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
                d = now[key] - self._lg_prev[key]
                delta += d
                per.append((pid, st.name, d))
        return delta, now, per

    def baseline(self, t: float) -> None:
        self._cpu_prev = procfs.read_cpu_times()
        _, self._lg_prev, _ = self._loadgen_ticks(t)
        self._t_prev = t

    def sample(self, t: float, ts: float, late_s: float = 0.0) -> SystemTick | None:
        cpu_now = procfs.read_cpu_times()
        lg_delta, lg_now, lg_per = self._loadgen_ticks(t)
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
            loadgen_procs=tuple(
                (pid, name, round(d * 100.0 / (HZ * dt), 2), procfs.read_rss_bytes(pid))
                for pid, name, d in lg_per
            ),
        )
        self.recent.append(tick)
        if self._csv is not None:
            self._csv.write([(tick.t, tick.ts, tick.late_s, tick.cpu_pct, *tick.per_core, lg)])
        if self._lg_csv is not None:
            self._lg_csv.write([(tick.t, *p) for p in tick.loadgen_procs])
        return tick

    def close(self) -> None:
        for f in (self._csv, self._lg_csv):
            if f is not None:
                f.close()
