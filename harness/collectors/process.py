"""pidstat -t for a process tree: per-thread CPU, wait and context switches; per-tree
memory, threads and file descriptors. Records only; never judges.

Formulas (sysstat pidstat.c), with dt from a monotonic clock:
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

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
    "socket_fds",
    "client_conns",
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


class ThreadRow(NamedTuple):
    """One thread over one interval: the pidstat -t columns (a row of threads.csv)."""

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
        return tuple(self)

    def csv_line(self) -> str:
        """The threads.csv line; one f-string is ~5x cheaper than csv.writer on 200 rows."""
        name = self.name
        if "," in name or '"' in name or "\n" in name or "\r" in name:
            name = '"' + name.replace('"', '""') + '"'
        wait = "" if self.wait_pct is None else f"{self.wait_pct:.2f}"
        return (
            f"{self.t:.4f},{self.pid},{self.tid},{self.start_ticks},{name},"
            f"{self.usr_pct:.2f},{self.system_pct:.2f},{self.guest_pct:.2f},{wait},"
            f"{self.cpu_pct:.2f},{self.cpu},{self.cswch_s:.2f},{self.nvcswch_s:.2f}\n"
        )


class _Thread(NamedTuple):
    """Raw counters of one thread at one tick."""

    starttime: int
    name: str
    processor: int
    utime: int
    stime: int
    guest: int
    run_ns: int | None
    wait_ns: int | None
    pcount: int | None
    vcs: int
    nvcs: int


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


_ZERO = _Thread(0, "", 0, 0, 0, 0, 0, 0, 0, 0, 0)


class _Task:
    """One thread of a watched process: its /proc paths, and what was read of it at the
    last tick (``sched_raw``: the schedstat text, set together with ``counters``)."""

    __slots__ = ("tid", "schedstat", "stat", "status", "sched_raw", "counters", "idle")

    def __init__(self, pid: int, tid: int) -> None:
        base = f"/proc/{pid}/task/{tid}/"
        self.tid = tid
        self.schedstat = base + "schedstat"
        self.stat = base + "stat"
        self.status = base + "status"
        self.sched_raw: bytes | None = None
        self.counters: _Thread | None = None
        # for a tick in which the thread did not run: its ThreadRow fields after ``t``
        # and its threads.csv line after the time field (every rate 0), made on the
        # first such tick and dropped when it runs (its CPU number or name may change)
        self.idle: tuple[tuple, str] | None = None


def _idle_row(pid: int, task: _Task) -> tuple[tuple, str]:
    """``_Task.idle`` of a thread whose counters were read: its row for a tick in which it
    did not run, as ThreadRow fields after ``t`` and as a threads.csv line after the time
    field."""
    c = task.counters
    assert c is not None
    fields = (pid, task.tid, c.starttime, c.name, 0.0, 0.0, 0.0, 0.0, 0.0, c.processor, 0.0, 0.0)
    line = ThreadRow(0.0, *fields).csv_line()
    return fields, line[line.index(",") :]


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
    ) -> None:
        self.pid = pid
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
        # the last tick's rows: a ThreadRow, or an idle thread's fields after ``t``
        # (made into a ThreadRow only when ``last_threads`` is read)
        self._rows: list[ThreadRow | tuple] = []
        self._rows_t = 0.0
        self._last_threads: list[ThreadRow] | None = []
        # pid → its threads by TID as /proc/PID/task names them
        self._tasks: dict[int, dict[str, _Task]] = {}
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
            self._last_threads = [
                r if type(r) is ThreadRow else ThreadRow(t, *r) for r in self._rows
            ]
        return self._last_threads

    def _collect(self, t: float, ts: float, late_s: float, emit: bool) -> ProcessTick | None:
        boot_now = self._boottime_ticks()
        dt = (t - self._t_prev) if self._t_prev is not None else None
        pids = self.pids(t)
        files = self._files
        read = files.read
        has_schedstat = self.has_schedstat
        tasks_now: dict[int, dict[str, _Task]] = {}
        procs_now: dict[tuple[int, int], tuple[int, int, int]] = {}
        rows: list[ThreadRow | tuple] = []
        # threads.csv lines, in step with rows (None: no CSV is written)
        lines: list[str] | None = [] if self._thr_csv is not None else None
        stamp = f"{t:.4f}"  # the time field of this tick's threads.csv lines
        proc_ticks = [0, 0, 0]  # Δ(utime−guest), Δstime, Δ(utime+stime)
        cs = [0, 0]
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
            for name in procfs.list_task_names(pid):
                task = tasks_prev.get(name)
                if task is None:
                    task = _Task(pid, int(name))
                raw = read(task.schedstat) if has_schedstat else None
                if raw is not None and raw == task.sched_raw and dt and dt > 0:
                    # Did not run, and waited for no CPU, since the last tick: nothing moved.
                    tasks[name] = task
                    n_threads += 1
                    if emit:
                        idle = task.idle
                        if idle is None:
                            idle = task.idle = _idle_row(pid, task)
                        rows.append(idle[0])
                        if lines is not None:
                            lines.append(stamp + idle[1])
                    continue
                if self._sample_thread(pid, task, raw, t, dt, emit, rows, lines, cs):
                    tasks[name] = task
                    n_threads += 1
        files.sweep()
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
            cswch_s=round(cs[0] / dt, 2),
            nvcswch_s=round(cs[1] / dt, 2),
            socket_fds=len(sockets),
            client_conns=conns,
        )
        self.recent.append(tick)
        self._rows, self._rows_t, self._last_threads = rows, t, None
        if self._proc_csv is not None and self._thr_csv is not None:
            self._thr_csv.write_lines(lines)
            self._proc_csv.write([tick.as_row()])
        return tick

    def _sample_thread(
        self,
        pid: int,
        task: _Task,
        raw: bytes | None,
        t: float,
        dt: float | None,
        emit: bool,
        rows: list[ThreadRow | tuple],
        lines: list[str] | None,
        cs: list[int],
    ) -> bool:
        """Read a thread that may have run since the last tick (``raw``: its schedstat
        text, None without schedstat) into ``task``; append its row when there is a
        baseline. False when the thread is gone."""
        task.idle = None  # it ran: its CPU number or name may change
        sched = procfs.parse_schedstat(raw)
        old = task.counters
        files = self._files
        if (
            sched is not None
            and old is not None
            and old.run_ns == sched[0]
            and old.pcount == sched[2]
        ):
            # Not scheduled in since the last tick: utime, stime and the switch counts
            # cannot have moved, so skip the stat and status reads (most threads of an
            # idle pool). Run-queue wait is only accounted when a thread is picked.
            cur = _Thread(*old[:7], sched[1], *old[8:])
        else:
            st = procfs.parse_stat_or_none(files.read(task.stat))
            if st is None:
                return False
            ctx = procfs.parse_ctxt(files.read(task.status)) or (0, 0)
            cur = _Thread(
                st.starttime, st.name, st.processor, st.utime, st.stime, st.guest,
                sched[0] if sched else None, sched[1] if sched else None,
                sched[2] if sched else None, ctx[0], ctx[1],
            )  # fmt: skip
            if old is not None and old.starttime != cur.starttime:
                old = None  # the TID was reused by a new thread
        task.counters = cur
        task.sched_raw = raw if sched is not None else None
        if old is None:
            if self._t_prev is None or cur.starttime < self._boot_prev:
                return True  # first sight of an older thread: baseline only
            old = _ZERO  # born since the last tick: all its counters fell in this interval
        if not dt or dt <= 0:
            return True
        d_vcs, d_nvcs = cur.vcs - old.vcs, cur.nvcs - old.nvcs
        cs[0] += d_vcs
        cs[1] += d_nvcs
        if emit:
            scale = 100.0 / (HZ * dt)
            d_u, d_s, d_g = cur.utime - old.utime, cur.stime - old.stime, cur.guest - old.guest
            wait = None
            if cur.wait_ns is not None and old.wait_ns is not None:
                wait = (cur.wait_ns - old.wait_ns) / 1e7 / dt
            row = ThreadRow(
                t, pid, task.tid, cur.starttime, cur.name, max(0, d_u - d_g) * scale,
                d_s * scale, d_g * scale, wait, (d_u + d_s) * scale, cur.processor,
                d_vcs / dt, d_nvcs / dt,
            )  # fmt: skip
            rows.append(row)
            if lines is not None:
                lines.append(row.csv_line())
        return True

    def close(self) -> None:
        self._files.close()
        for f in (self._proc_csv, self._thr_csv):
            if f is not None:
                f.close()
