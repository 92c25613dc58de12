"""The threads of a watched process, read like ``pidstat -t`` at the least cost a tick:
their /proc files held open (``procfs.OpenFiles``), nothing parsed for a thread that did
not run, its threads.csv line assembled from pieces made once.

Context switches. The voluntary / nonvoluntary counts are only in
``/proc/PID/task/TID/status``, the dearest of a thread's files to make (a 1.4 KB text).
They are read on *switch ticks* only (``ProcessSampler(switches_every_s=…)``), and a
row's ``cswch_s`` / ``nvcswch_s`` are filled on switch ticks only: the rate over the time
since that thread's previous switch read (the counts are cumulative, so the rate over
the longer window is exact); on every other tick they are empty (None), never a carried
value. A thread that was not scheduled in since its last read cannot have switched, so
its status is not read again (its rate is 0). A thread born since the last switch tick is
counted from zero over the whole window; one seen for the first time otherwise starts
from its first read. A status file once read stays held until its thread exits, so a
switch tick re-reads it rather than opening it again.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from harness.collectors import procfs

HZ = os.sysconf("SC_CLK_TCK")
NS_PER_TICK = 1_000_000_000 // HZ


def _exact_ticks() -> bool:
    """Whether a thread's stat utime and stime follow from its schedstat on-CPU time.

    The kernel makes a thread's stat utime and stime (``cputime_adjust``) by splitting its
    on-CPU time, the ``sum_exec_runtime`` that schedstat's first field shows, into two
    parts that never decrease and sum to it, each shown truncated to clock ticks. So from
    a read giving ``u`` and ``s`` ticks, while the on-CPU time stays below
    ``(u + s + 1)`` ticks neither part can reach its next tick: both still read ``u`` and
    ``s``. Not so where the split is made from a fresher on-CPU time than schedstat's
    (``nohz_full`` CPUs: ``task_sched_runtime``), nor for guest time, which is sampled
    at timer ticks and not split: there stat is read whenever a thread ran.
    """
    if 1_000_000_000 % HZ:
        return False
    try:
        with open("/sys/devices/system/cpu/nohz_full") as f:
            nohz = f.read().strip()
    except OSError:
        nohz = ""
    return nohz in ("", "(null)")


EXACT_TICKS = _exact_ticks()

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


def csv_text(name: str) -> str:
    """A thread name as a CSV field (quoted when it holds a comma, quote or newline)."""
    if "," in name or '"' in name or "\n" in name or "\r" in name:
        return '"' + name.replace('"', '""') + '"'
    return name


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


class ThreadRow(NamedTuple):
    """One thread over one interval: the pidstat -t columns (a row of threads.csv).
    ``cswch_s`` / ``nvcswch_s`` are None on a tick that did not read the switch counts;
    ``cpu`` (the CPU it last ran on) is None on a tick between switch ticks when its stat
    was not read although it was woken since the last read: not scheduled in yet, or on
    CPU for less than the rest of a clock tick (its usr / system figures are exact: 0);
    a switch tick reads it for every thread."""

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
    cpu: int | None
    cswch_s: float | None
    nvcswch_s: float | None

    def as_row(self) -> tuple:
        return tuple(self)

    def csv_line(self) -> str:
        """The threads.csv line (an f-string: ~5x cheaper than csv.writer on 200 rows)."""
        return (
            f"{self.t:.4f},{self.pid},{self.tid},{self.start_ticks},{csv_text(self.name)},"
            f"{self.usr_pct:.2f},{self.system_pct:.2f},{self.guest_pct:.2f},"
            f"{_num(self.wait_pct)},{self.cpu_pct:.2f},{'' if self.cpu is None else self.cpu},"
            f"{_num(self.cswch_s)},{_num(self.nvcswch_s)}\n"
        )


class _Formatted(dict):
    """n → ``f"{n * scale:.2f}"``, each made once per tick: most rows of a tick repeat a
    few small tick and switch counts."""

    __slots__ = ("scale",)

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def __missing__(self, n: int) -> str:
        text = self[n] = f"{n * self.scale:.2f}"
        return text


class Task:
    """One thread of a watched process: its /proc paths and what was read of it."""

    __slots__ = (
        "pid", "tid", "schedstat", "stat", "status", "seen", "sched_raw", "name_raw", "name",
        "head", "starttime", "processor", "utime", "stime", "guest", "run_ns", "wait_ns",
        "pcount", "vcs", "nvcs", "cs_at", "cs_fresh", "idle", "idle_cs", "cpu_text",
        "ticks_end",
    )  # fmt: skip

    def __init__(self, pid: int, tid: int) -> None:
        base = f"/proc/{pid}/task/{tid}/"
        self.pid = pid
        self.tid = tid
        self.schedstat = base + "schedstat"
        self.stat = base + "stat"
        self.status = base + "status"
        self.seen = False  # counters below were read at least once
        # the schedstat text of the last read (None: not comparable), set with the counters
        self.sched_raw: bytes | None = None
        self.name_raw: bytes | None = None
        self.name = ""
        self.head = ""  # "pid,tid,start_ticks,name," of its threads.csv lines
        self.starttime = self.utime = self.stime = self.guest = 0
        # the CPU it last ran on as of its last stat read (None: it may have moved since)
        # and that number as a CSV field ("" for None)
        self.processor: int | None = None
        self.cpu_text = ""
        # on-CPU ns below which utime and stime cannot have moved from their last read
        # (0: unknown, read stat whenever it ran)
        self.ticks_end = 0
        self.run_ns = self.wait_ns = self.pcount = 0
        # switch counts as last read, when (tick time), and whether they are still the
        # current counts as of the last tick (not scheduled in since)
        self.vcs = self.nvcs = 0
        self.cs_at = 0.0
        self.cs_fresh = False
        # for a tick in which it did not run: its row fields after ``t`` and its
        # threads.csv line after the time field, without (``idle``) and with
        # (``idle_cs``, all 0) switch rates; dropped when it runs
        self.idle: tuple[tuple, str] | None = None
        self.idle_cs: tuple[tuple, str] | None = None


class ThreadPass:
    """One tick's pass over the threads of the watched processes: each thread read
    (``idle`` or ``read``), its row kept (``rows``: ThreadRow fields after ``t``) with its
    threads.csv line (``lines``, when ``csv``), the switches read summed (``vcs``,
    ``nvcs``: over ``t - switches_t``, on a switch tick)."""

    def __init__(
        self,
        files: procfs.OpenFiles,
        *,
        t: float,
        dt: float | None,
        emit: bool,
        switches: bool,
        switches_t: float,
        boot_prev: float,
        first: bool,
        csv: bool,
    ) -> None:
        self.read_file = files.read
        self.t = t
        self.emit = emit and dt is not None and dt > 0
        self.switches = switches  # read the switch counts of threads that may have moved
        self.switches_t = switches_t  # the previous switch tick
        self.boot_prev = boot_prev  # boot time (ticks) of the last tick: newer threads are born
        self.first = first  # no tick before this one: every thread gets a baseline only
        self.rows: list[tuple] = []
        self.lines: list[str] | None = [] if csv else None
        self.stamp = f"{t:.4f}"
        self.vcs = self.nvcs = 0
        if self.emit:
            assert dt is not None
            self.wait_scale = 1.0 / 1e7 / dt
            self.pct = _Formatted(100.0 / (HZ * dt))
            self.rate_scale = 1.0 / (t - switches_t) if switches and t > switches_t else 0.0

    def idle(self, task: Task) -> None:
        """A thread whose schedstat is the last tick's: it did not run nor wait since."""
        if not self.emit:
            return
        if not self.switches:
            idle = task.idle
            if idle is None:
                idle = task.idle = self._idle_row(task, None)
        elif task.cs_fresh:
            task.cs_at = self.t
            idle = task.idle_cs
            if idle is None:
                idle = task.idle_cs = self._idle_row(task, (0.0, 0.0))
        else:  # it ran after its last switch read: read them now
            self._row(task, 0, 0, 0, 0.0, self._switches(task))
            return
        self.rows.append(idle[0])
        if self.lines is not None:
            self.lines.append(self.stamp + idle[1])

    def _idle_row(self, task: Task, cs: tuple[float, float] | None) -> tuple[tuple, str]:
        v, n = cs if cs is not None else (None, None)
        row = (task.pid, task.tid, task.starttime, task.name, 0.0, 0.0, 0.0, 0.0, 0.0,
               task.processor, v, n)  # fmt: skip
        tail = f",{task.head}0.00,0.00,0.00,0.00,0.00,{task.cpu_text},{_num(v)},{_num(n)}\n"
        return row, tail

    def read(self, task: Task, raw: bytes | None, same_file: bool = True) -> bool:
        """Read a thread that may have run since the last tick (``raw``: its schedstat
        text, None without schedstat; ``same_file``: read from the file held since the
        last read, not one opened afresh, which may be a new thread's under a reused TID)
        and keep its row when it has a baseline. False when the thread is gone."""
        task.idle = task.idle_cs = None  # it ran: its CPU number or name may change
        sched = False
        if raw:
            f = raw.split()
            try:
                run_ns, wait_ns, pcount = int(f[0]), int(f[1]), int(f[2])
                sched = True
            except (ValueError, IndexError):
                pass
        seen = task.seen
        if (
            sched
            and seen
            and task.run_ns == run_ns
            and task.pcount == pcount
            and not (self.switches and (wait_ns != task.wait_ns or task.processor is None))
        ):
            # Not scheduled in since the last tick: utime, stime and the switch counts
            # cannot have moved, so skip the stat read (run-queue wait is accounted only
            # when a thread is picked, so it may have grown; woken, it may be queued on
            # another CPU: its number is not known until a switch tick reads it).
            d_u = d_s = d_g = 0
            wait_prev = task.wait_ns
            if wait_ns != wait_prev:
                task.processor, task.cpu_text = None, ""
            task.wait_ns = wait_ns
            task.sched_raw = raw
            if not self.emit:
                return True
        elif (
            sched
            and seen
            and run_ns < task.ticks_end
            and not self.switches
            and same_file
            and run_ns >= task.run_ns
            and pcount >= task.pcount
        ):
            # Ran, but its on-CPU time is still short of the next clock tick of its last
            # read's utime + stime: neither can have moved (see ``ticks_end``), so the stat
            # read is skipped until a switch tick; its CPU number is not known.
            d_u = d_s = d_g = 0
            wait_prev = task.wait_ns
            task.run_ns, task.wait_ns, task.pcount = run_ns, wait_ns, pcount
            task.sched_raw = raw
            task.processor, task.cpu_text = None, ""
            task.cs_fresh = False  # scheduled in: its switch counts may have moved
            if not self.emit:
                return True
        else:
            st = self._read_stat(task)
            if st is None:
                return False
            if seen and task.starttime != st[0]:
                seen = False  # the TID was reused by a new thread
            prev = (task.utime, task.stime, task.guest, task.wait_ns) if seen else None
            task.starttime, task.utime, task.stime, task.guest = st
            task.ticks_end = (
                0
                if task.guest or not EXACT_TICKS
                else ((task.utime + task.stime + 1) * NS_PER_TICK)
            )
            if sched:
                task.run_ns, task.wait_ns, task.pcount = run_ns, wait_ns, pcount
                task.sched_raw = raw
            else:
                task.sched_raw = None
            task.cs_fresh = False  # scheduled in: its switch counts may have moved
            task.seen = True
            if prev is None:
                if self.first or task.starttime < self.boot_prev:
                    # first sight of an older thread: baseline only
                    self._read_switches(task)
                    return True
                # born since the last tick: every counter fell in this interval, and it
                # had no switches at the last switch tick
                prev = (0, 0, 0, 0)
                task.vcs = task.nvcs = 0
                task.cs_at = self.switches_t
            if not self.emit:
                return True
            d_u, d_s, d_g = task.utime - prev[0], task.stime - prev[1], task.guest - prev[2]
            wait_prev = prev[3]
        cs = self._switches(task) if self.switches else None
        wait = (task.wait_ns - wait_prev) * self.wait_scale if sched else None
        self._row(task, d_u, d_s, d_g, wait, cs)
        return True

    def _read_stat(self, task: Task) -> tuple[int, int, int, int] | None:
        """(starttime, utime, stime, guest) from the thread's stat, its name and CPU
        number set in ``task``; None when it is gone."""
        data = self.read_file(task.stat)
        if not data:
            return None
        try:
            rpar = data.rindex(b")")
            # f[0] is field 3 (state): field n is f[n - 3]; nothing past guest_time (43)
            f = data[rpar + 2 :].split(b" ", 41)
            st = (int(f[19]), int(f[11]), int(f[12]), int(f[40]) if len(f) > 40 else 0)
            task.processor = int(f[36])
            task.cpu_text = f[36].decode()
        except (ValueError, IndexError):
            return None
        name = data[data.index(b"(") + 1 : rpar]
        if name != task.name_raw or st[0] != task.starttime:
            task.name_raw = name
            task.name = name.decode("utf-8", "replace")
            task.head = f"{task.pid},{task.tid},{st[0]},{csv_text(task.name)},"
        return st

    def _read_switches(self, task: Task) -> tuple[int, int] | None:
        """Read the switch counts into ``task``; the change since the last read, or
        None when status could not be read (the last counts are kept)."""
        ctx = procfs.parse_ctxt(self.read_file(task.status))
        if ctx is None:
            return None
        d = (ctx[0] - task.vcs, ctx[1] - task.nvcs)
        task.vcs, task.nvcs = ctx
        task.cs_at = self.t
        task.cs_fresh = True
        return d

    def _switches(self, task: Task) -> tuple[float, float] | None:
        """On a switch tick: the thread's switch rates since its last read (0 without a
        read when it was not scheduled in since), summed into the tick's; None when its
        status could not be read."""
        if task.cs_fresh:
            task.cs_at = self.t
            return 0.0, 0.0
        since = task.cs_at
        d = self._read_switches(task)
        if d is None:
            return None
        self.vcs += d[0]
        self.nvcs += d[1]
        if since == self.switches_t:
            return d[0] * self.rate_scale, d[1] * self.rate_scale
        return d[0] / (self.t - since), d[1] / (self.t - since)

    def _row(
        self,
        task: Task,
        d_u: int,
        d_s: int,
        d_g: int,
        wait: float | None,
        cs: tuple[float, float] | None,
    ) -> None:
        pct = self.pct
        usr = max(0, d_u - d_g)
        scale = pct.scale
        self.rows.append(
            (task.pid, task.tid, task.starttime, task.name, usr * scale, d_s * scale,
             d_g * scale, wait, (d_u + d_s) * scale, task.processor,
             None if cs is None else cs[0], None if cs is None else cs[1])
        )  # fmt: skip
        if self.lines is not None:
            sw = "," if cs is None else f"{cs[0]:.2f},{cs[1]:.2f}"
            self.lines.append(
                f"{self.stamp},{task.head}{pct[usr]},{pct[d_s]},{pct[d_g]},{_num(wait)},"
                f"{pct[d_u + d_s]},{task.cpu_text},{sw}\n"
            )
