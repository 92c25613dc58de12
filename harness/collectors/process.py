"""pidstat -t for a process tree: per-thread CPU, wait and context switches; per-tree
memory, threads and file descriptors. Records only; never judges.

Formulas (REFERENCE §C, sysstat pidstat.c), with dt from a monotonic clock:
``%usr = Δ(utime−guest)/(HZ·dt)·100``, ``%system = Δstime/(HZ·dt)·100``,
``%guest = Δguest/(HZ·dt)·100``, ``%wait = Δrunq_wait_ns/1e9/dt·100``,
``%CPU = Δ(utime+stime)/(HZ·dt)·100``, ``cswch/s = Δvoluntary/dt``,
``nvcswch/s = Δnonvoluntary/dt``. Threads are keyed by (pid, TID, start time) because TIDs
are reused. A thread born since the last tick is measured from zero (all its time fell in
this interval); one seen for the first time otherwise only gets a baseline.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.collectors import procfs
from harness.collectors.loop import CsvStream

HZ = os.sysconf("SC_CLK_TCK")

PROCESS_COLUMNS = [
    "t",
    "ts",
    "late_s",
    "pid_count",
    "rss_bytes",
    "uss_bytes",
    "pss_bytes",
    "threads",
    "fds",
    "cpu_pct",
    "usr_pct",
    "sys_pct",
    "cswch_s",
    "nvcswch_s",
]
THREAD_COLUMNS = [
    "t",
    "pid",
    "tid",
    "start_ticks",
    "name",
    "usr_pct",
    "system_pct",
    "guest_pct",
    "wait_pct",
    "cpu_pct",
    "cpu",
    "cswch_s",
    "nvcswch_s",
]


@dataclass(frozen=True)
class ThreadRow:
    t: float
    pid: int
    tid: int
    start_ticks: int
    name: str
    usr_pct: float
    system_pct: float
    guest_pct: float
    wait_pct: float | None
    cpu_pct: float
    cpu: int
    cswch_s: float
    nvcswch_s: float

    def as_row(self) -> tuple:
        return (
            self.t,
            self.pid,
            self.tid,
            self.start_ticks,
            self.name,
            self.usr_pct,
            self.system_pct,
            self.guest_pct,
            self.wait_pct,
            self.cpu_pct,
            self.cpu,
            self.cswch_s,
            self.nvcswch_s,
        )


@dataclass(frozen=True)
class ProcessTick:
    t: float
    ts: float
    late_s: float
    pid_count: int
    rss_bytes: int
    uss_bytes: int | None
    pss_bytes: int | None
    threads: int
    fds: int
    cpu_pct: float
    usr_pct: float
    sys_pct: float
    cswch_s: float
    nvcswch_s: float

    def as_row(self) -> tuple:
        return (
            self.t,
            self.ts,
            self.late_s,
            self.pid_count,
            self.rss_bytes,
            self.uss_bytes,
            self.pss_bytes,
            self.threads,
            self.fds,
            self.cpu_pct,
            self.usr_pct,
            self.sys_pct,
            self.cswch_s,
            self.nvcswch_s,
        )


# Raw counters of one task: utime, stime, guest, wait_ns (or None), vcs, nvcs.
_Raw = tuple[int, int, int, int | None, int, int]


def _boottime_ticks() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) * HZ


class ProcessSampler:
    """Sample ``pid`` (and, by default, its descendants) each time ``sample()`` is called.

    ``out_dir`` receives ``process.csv`` and ``threads.csv`` (flushed every tick); pass None
    to keep samples in memory only. ``recent`` bounds the ticks held in memory.
    """

    def __init__(
        self,
        pid: int,
        out_dir: str | Path | None = None,
        *,
        include_children: bool = True,
        uss_every_s: float = 10.0,
        recent: int = 600,
        boottime_ticks: Callable[[], float] = _boottime_ticks,
    ) -> None:
        self.pid = pid
        self.include_children = include_children
        self.uss_every_s = uss_every_s
        self._boottime_ticks = boottime_ticks
        self.recent: deque[ProcessTick] = deque(maxlen=recent)
        self.last_threads: list[ThreadRow] = []
        self._threads_prev: dict[tuple[int, int, int], _Raw] = {}
        self._procs_prev: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._t_prev: float | None = None
        self._boot_prev: float = 0.0
        self._uss_next: float = 0.0
        self.has_schedstat = os.path.exists(f"/proc/{pid}/schedstat")
        self._proc_csv = self._thr_csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._proc_csv = CsvStream(out / "process.csv", PROCESS_COLUMNS)
            self._thr_csv = CsvStream(out / "threads.csv", THREAD_COLUMNS)

    def retarget(self, pid: int) -> None:
        """Follow a new root pid (the SUT was restarted); rates restart from a baseline."""
        self.pid = pid
        self._threads_prev.clear()
        self._procs_prev.clear()

    def pids(self) -> list[int]:
        if not self.include_children:
            return [self.pid] if psutil.pid_exists(self.pid) else []
        try:
            root = psutil.Process(self.pid)
            return [self.pid] + [c.pid for c in root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return []

    def alive(self) -> bool:
        return (
            psutil.pid_exists(self.pid) and procfs.read_stat(f"/proc/{self.pid}/stat") is not None
        )

    def baseline(self, t: float) -> None:
        """Read counters without emitting a tick (call once at the sampler's start)."""
        self._collect(t, ts=0.0, late_s=0.0, emit=False)

    def sample(self, t: float, ts: float, late_s: float = 0.0) -> ProcessTick | None:
        """Take one tick at monotonic ``t`` (seconds since start); None on the first call."""
        return self._collect(t, ts, late_s, emit=True)

    def _collect(self, t: float, ts: float, late_s: float, emit: bool) -> ProcessTick | None:
        boot_now = self._boottime_ticks()
        dt = (t - self._t_prev) if self._t_prev is not None else None
        pids = self.pids()
        threads_now: dict[tuple[int, int, int], _Raw] = {}
        procs_now: dict[tuple[int, int], tuple[int, int, int]] = {}
        rows: list[ThreadRow] = []
        proc_ticks = [0, 0, 0]  # Δ(utime−guest), Δstime, Δ(utime+stime)
        cs = [0, 0]
        rss = n_threads = n_fds = 0
        take_uss = emit and t >= self._uss_next
        uss = pss = 0 if take_uss else None
        live = 0
        for pid in pids:
            pst = procfs.read_stat(f"/proc/{pid}/stat")
            if pst is None:
                continue
            live += 1
            procs_now[(pid, pst.starttime)] = (pst.utime, pst.stime, pst.guest)
            prev_p = self._procs_prev.get((pid, pst.starttime))
            if prev_p is None and self._t_prev is not None and pst.starttime >= self._boot_prev:
                prev_p = (0, 0, 0)  # born since the last tick
            if prev_p is not None:
                proc_ticks[0] += (pst.utime - pst.guest) - (prev_p[0] - prev_p[2])
                proc_ticks[1] += pst.stime - prev_p[1]
                proc_ticks[2] += (pst.utime + pst.stime) - (prev_p[0] + prev_p[1])
            rss += procfs.read_rss_bytes(pid) or 0
            n_fds += procfs.count_fds(pid) or 0
            if take_uss:
                up = procfs.read_uss_pss_bytes(pid)
                if up is not None:
                    uss += up[0]
                    pss += up[1]
            for tid in procfs.list_tids(pid):
                base = f"/proc/{pid}/task/{tid}/"
                st = procfs.read_stat(base + "stat")
                if st is None:
                    continue
                sched = procfs.read_schedstat(base + "schedstat") if self.has_schedstat else None
                ctx = procfs.read_ctxt(base + "status") or (0, 0)
                n_threads += 1
                key = (pid, tid, st.starttime)
                raw: _Raw = (st.utime, st.stime, st.guest, sched[1] if sched else None, *ctx)
                threads_now[key] = raw
                prev = self._threads_prev.get(key)
                if prev is None and self._t_prev is not None and st.starttime >= self._boot_prev:
                    prev = (0, 0, 0, 0, 0, 0)
                if prev is None or not dt or dt <= 0:
                    continue
                d_cs = (raw[4] - prev[4], raw[5] - prev[5])
                cs[0] += d_cs[0]
                cs[1] += d_cs[1]
                if emit:
                    rows.append(self._thread_row(t, pid, tid, st, raw, prev, dt, d_cs))
        self._threads_prev = threads_now
        self._procs_prev = procs_now
        self._t_prev = t
        self._boot_prev = boot_now
        if not emit or dt is None or dt <= 0:
            return None
        if take_uss:
            self._uss_next = t + self.uss_every_s
        scale = 100.0 / (HZ * dt)
        tick = ProcessTick(
            t=round(t, 4),
            ts=ts,
            late_s=round(late_s, 6),
            pid_count=live,
            rss_bytes=rss,
            uss_bytes=uss,
            pss_bytes=pss,
            threads=n_threads,
            fds=n_fds,
            cpu_pct=round(proc_ticks[2] * scale, 2),
            usr_pct=round(proc_ticks[0] * scale, 2),
            sys_pct=round(proc_ticks[1] * scale, 2),
            cswch_s=round(cs[0] / dt, 2),
            nvcswch_s=round(cs[1] / dt, 2),
        )
        self.recent.append(tick)
        self.last_threads = rows
        if self._proc_csv is not None and self._thr_csv is not None:
            self._thr_csv.write([r.as_row() for r in rows])
            self._proc_csv.write([tick.as_row()])
        return tick

    @staticmethod
    def _thread_row(
        t: float,
        pid: int,
        tid: int,
        st: procfs.TaskStat,
        raw: _Raw,
        prev: _Raw,
        dt: float,
        d_cs: tuple[int, int],
    ) -> ThreadRow:
        scale = 100.0 / (HZ * dt)
        d_u, d_s, d_g = raw[0] - prev[0], raw[1] - prev[1], raw[2] - prev[2]
        wait = None
        if raw[3] is not None and prev[3] is not None:
            wait = round((raw[3] - prev[3]) / 1e9 / dt * 100.0, 2)
        return ThreadRow(
            t=round(t, 4),
            pid=pid,
            tid=tid,
            start_ticks=st.starttime,
            name=st.name,
            usr_pct=round(max(0, d_u - d_g) * scale, 2),
            system_pct=round(d_s * scale, 2),
            guest_pct=round(d_g * scale, 2),
            wait_pct=wait,
            cpu_pct=round((d_u + d_s) * scale, 2),
            cpu=st.processor,
            cswch_s=round(d_cs[0] / dt, 2),
            nvcswch_s=round(d_cs[1] / dt, 2),
        )

    def close(self) -> None:
        for f in (self._proc_csv, self._thr_csv):
            if f is not None:
                f.close()
