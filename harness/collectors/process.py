"""pidstat -t for a process tree: per-thread CPU, wait and context switches; per-tree
memory, threads and file descriptors. Records only; never judges.

Formulas (sysstat pidstat.c), with dt from a monotonic clock:
``%usr = Δ(utime−guest)/(HZ·dt)·100``, ``%system = Δstime/(HZ·dt)·100``,
``%guest = Δguest/(HZ·dt)·100``, ``%wait = Δrunq_wait_ns/1e9/dt·100``,
``%CPU = Δ(utime+stime)/(HZ·dt)·100``; ``cswch/s = Δvoluntary/Δt``,
``nvcswch/s = Δnonvoluntary/Δt`` on switch ticks only, Δt since the last switch tick
(``switches_every_s``; threads.py). Threads are keyed by (pid, TID, start time) because TIDs
are reused. A thread born since the last tick is measured from zero (all its time fell in
this interval); one seen for the first time otherwise only gets a baseline.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.collectors import procfs
from harness.collectors.loop import CsvStream
from harness.collectors.threads import THREAD_COLUMNS, Task, ThreadPass, ThreadRow

__all__ = ["PROCESS_COLUMNS", "THREAD_COLUMNS", "ProcessSampler", "ProcessTick", "ThreadRow"]

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
    "socket_fds",
    "client_conns",
]


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
    # on a switch tick (ProcessSampler.switches_every_s): the rate since the previous
    # one, summed over threads; None on every other tick
    cswch_s: float | None
    nvcswch_s: float | None
    socket_fds: int = 0  # of ``fds``
    # of ``socket_fds``: connections whose other end is a ``peer_pids`` process (the
    # harness's own); None when no peers were given
    client_conns: int | None = None

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
            self.socket_fds,
            self.client_conns,
        )


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
        children_every_s: float = 5.0,
        recent: int = 600,
        boottime_ticks: Callable[[], float] = _boottime_ticks,
        peer_pids: Callable[[], Iterable[int]] | None = None,
        switches_every_s: float = 5.0,
    ) -> None:
        self.pid = pid
        # Context switches are read from each thread's status, the dearest of its files:
        # on the first tick at least this long after the last read (0: every tick). The
        # rows of other ticks leave the switch columns empty (see threads.py).
        self.switches_every_s = switches_every_s
        self._switches_t = 0.0  # the last switch tick (or the baseline)
        self._switches_next = 0.0
        # The processes whose connections to the server are the harness's own (the load
        # generator and the sampler): counted every tick so the server's socket count can
        # be judged net of them.
        self.peer_pids = peer_pids
        self.include_children = include_children
        self.uss_every_s = uss_every_s
        # Finding descendants scans every process on the host (~5 ms): do it every few
        # seconds, not every tick. A child born between scans is measured from the scan on.
        self.children_every_s = children_every_s
        self._children: list[int] = []
        self._children_next = 0.0
        self.gone = False  # the watched process tree no longer exists
        self._boottime_ticks = boottime_ticks
        self.recent: deque[ProcessTick] = deque(maxlen=recent)
        # the last tick's rows as ThreadRow fields after ``t`` (made into ThreadRows only
        # when ``last_threads`` is read)
        self._rows: list[tuple] = []
        self._rows_t = 0.0
        self._last_threads: list[ThreadRow] | None = []
        # pid → its threads by TID as /proc/PID/task names them
        self._tasks: dict[int, dict[str, Task]] = {}
        self._procs_prev: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._t_prev: float | None = None
        self._boot_prev: float = 0.0
        self._uss_next: float = 0.0
        self.has_schedstat = os.path.exists(f"/proc/{pid}/schedstat")
        # per-thread files held open between ticks, and the TCP endpoints of the sockets
        # seen so far: re-reading both every tick was most of the sampler's own cost
        self._files = procfs.OpenFiles()
        self._endpoints = procfs.SocketEndpoints()
        self._proc_csv = self._thr_csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._proc_csv = CsvStream(out / "process.csv", PROCESS_COLUMNS)
            self._thr_csv = CsvStream(out / "threads.csv", THREAD_COLUMNS)

    def retarget(self, pid: int) -> None:
        """Follow a new root pid (the SUT was restarted); rates restart from a baseline."""
        self.pid = pid
        self._tasks.clear()
        self._procs_prev.clear()
        self._children_next = 0.0
        self._switches_next = 0.0

    def pids(self, t: float | None = None) -> list[int]:
        """The root pid and (when watched) its descendants, rescanned every few seconds."""
        if not self.include_children:
            return [self.pid] if psutil.pid_exists(self.pid) else []
        if t is None or t >= self._children_next:
            kids = procfs.descendants(self.pid)
            if kids is None:
                return []
            self._children = kids
            if t is not None:
                self._children_next = t + self.children_every_s
        return [self.pid, *self._children]

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

    @property
    def last_threads(self) -> list[ThreadRow]:
        """One row per thread of the last tick taken (pidstat -t's rows for that interval)."""
        if self._last_threads is None:
            t = self._rows_t
            self._last_threads = [ThreadRow(t, *r) for r in self._rows]
        return self._last_threads

    def _collect(self, t: float, ts: float, late_s: float, emit: bool) -> ProcessTick | None:
        boot_now = self._boottime_ticks()
        dt = (t - self._t_prev) if self._t_prev is not None else None
        pids = self.pids(t)
        files = self._files
        read = files.read
        keep = files.keep
        has_schedstat = self.has_schedstat
        first = self._t_prev is None
        # a switch tick: the threads' switch counts are read (always at the first call)
        switches = first or (emit and t >= self._switches_next)
        threads = ThreadPass(
            files, t=t, dt=dt, emit=emit, switches=switches, switches_t=self._switches_t,
            boot_prev=self._boot_prev, first=first, csv=self._thr_csv is not None,
        )  # fmt: skip
        still, moved = threads.idle, threads.read
        quiet = has_schedstat and dt is not None and dt > 0
        tasks_now: dict[int, dict[str, Task]] = {}
        procs_now: dict[tuple[int, int], tuple[int, int, int]] = {}
        proc_ticks = [0, 0, 0]  # Δ(utime−guest), Δstime, Δ(utime+stime)
        rss = n_threads = n_fds = 0
        sockets: list[int] = []
        take_uss = emit and t >= self._uss_next
        uss = pss = 0 if take_uss else None
        live = 0
        for pid in pids:
            pst = procfs.parse_stat_or_none(read(f"/proc/{pid}/stat"))
            if pst is None or pst.state in ("Z", "X"):
                continue  # gone, or a zombie waiting for its parent to reap it
            live += 1
            procs_now[(pid, pst.starttime)] = (pst.utime, pst.stime, pst.guest)
            prev_p = self._procs_prev.get((pid, pst.starttime))
            if prev_p is None and self._t_prev is not None and pst.starttime >= self._boot_prev:
                prev_p = (0, 0, 0)  # born since the last tick
            if prev_p is not None:
                proc_ticks[0] += (pst.utime - pst.guest) - (prev_p[0] - prev_p[2])
                proc_ticks[1] += pst.stime - prev_p[1]
                proc_ticks[2] += (pst.utime + pst.stime) - (prev_p[0] + prev_p[1])
            rss += procfs.parse_rss_bytes(read(f"/proc/{pid}/statm")) or 0
            fds = procfs.scan_fds(pid)
            if fds is not None:
                n_fds += fds[0]
                sockets += fds[1]
            if take_uss:
                up = procfs.read_uss_pss_bytes(pid)
                if up is not None:
                    uss += up[0]
                    pss += up[1]
            tasks_prev = self._tasks.get(pid, {})
            tasks = tasks_now[pid] = {}
            # The last tick's threads are the process's threads when it counts as many
            # and none of them has ended (an ended thread's read fails): /proc/PID/task
            # (~1.5 us a thread) is listed only when a thread may have started or ended.
            # One started after the count was read is found by the next tick's count.
            same = pst.num_threads == len(tasks_prev) and (pid, pst.starttime) in self._procs_prev
            listed = tasks_prev if same else procfs.list_task_names(pid)
            while True:
                ended = False
                for name in listed:
                    if name in tasks:
                        continue
                    task = tasks_prev.get(name)
                    if task is None:
                        task = Task(pid, int(name))
                    opens = files.opens
                    raw = read(task.schedstat) if has_schedstat else None
                    if (
                        quiet
                        and raw is not None
                        and raw == task.sched_raw
                        and (not switches or task.processor is not None)
                    ):
                        # Did not run, and waited for no CPU, since the last tick: nothing
                        # moved (a switch tick reads a CPU number a skipped read left unknown)
                        still(task)
                    elif not moved(task, raw, files.opens == opens):
                        ended = True
                        continue  # gone
                    tasks[name] = task
                    # stat and status may be read on switch ticks only: held from one to the next
                    keep(task.stat)
                    keep(task.status)
                    n_threads += 1
                if not (same and ended):
                    break
                # a thread ended since the last tick: one may have started too
                same = False
                listed = procfs.list_task_names(pid)
        files.sweep()
        switches_since = self._switches_t
        if switches and (emit or first):
            self._switches_t = t
            self._switches_next = t + self.switches_every_s - (dt or 0.0) / 2
        self._tasks = tasks_now
        self._procs_prev = procs_now
        self._t_prev = t
        self._boot_prev = boot_now
        self.gone = live == 0
        if self.gone:
            return None  # no row: zeros would read as a drop in RSS/threads, not an exit
        if not emit or dt is None or dt <= 0:
            return None
        if take_uss:
            self._uss_next = t + self.uss_every_s
        scale = 100.0 / (HZ * dt)
        conns = None
        if self.peer_pids is not None:
            me, own = os.getpid(), files.fd_names()
            peer_sockets = [
                i
                for p in self.peer_pids()
                for i in (procfs.scan_fds(p, own if p == me else ()) or (0, []))[1]
            ]
            conns = self._endpoints.connections_between(self.pid, sockets, peer_sockets, t)
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
            cswch_s=round(threads.vcs / (t - switches_since), 2) if switches else None,
            nvcswch_s=round(threads.nvcs / (t - switches_since), 2) if switches else None,
            socket_fds=len(sockets),
            client_conns=conns,
        )
        self.recent.append(tick)
        self._rows, self._rows_t, self._last_threads = threads.rows, t, None
        if self._proc_csv is not None and self._thr_csv is not None:
            self._thr_csv.write_lines(threads.lines or [])
            self._proc_csv.write([tick.as_row()])
        return tick

    def close(self) -> None:
        self._files.close()
        for f in (self._proc_csv, self._thr_csv):
            if f is not None:
                f.close()
