"""System-wide CPU per core, the load generator's own CPU (to flag a saturated generator),
and the CPU on the server's cores that was not the run's (to flag another tenant).

The generator's CPU is recorded summed (``system.csv``, for the report) and per process
(``loadgen.csv``): each Locust process runs one gevent loop on one core, so one worker
at 100 % beside an idle one is saturated although the sum is only half of two cores.

The run is its processes by ancestry only: the generator's trees (with what they start:
CPU hogs, a fault proxy, a server the master started), the server's tree and the sampler.
A process outside those trees is another tenant whatever it looks like (a ``locust
--worker`` of another job included); the one exception is a process with the server's
command line started after the server the sampler follows has gone (its own supervisor's
restart), until the sampler follows it; and the server's supervisor outside the run is
read for one thing, the server's last moments when it reaps it. Records only: whether the generator was saturated
or the server disturbed is decided by the checks.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.collectors import procfs
from harness.collectors.loop import CsvStream
from harness.collectors.run_processes import (
    RunCounters,
    affinity,
    cmdline,
    cpu_ticks,
    gone,
    off_cores,
    process_tree,
    read_run_stat,
    run_cpu,
    run_pids,
)

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
    # CPU busy on the run's cores that none of the run's processes used (% of one core):
    # another process, the kernel's own work, a hypervisor's steal (None: not measured)
    other_cpu_pct: float | None = None
    # the busiest processes outside the run over this interval, when ``other_cpu_pct``
    # (or ``foreign_cpu_pct``) was high enough to look: (pid, name, %CPU)
    foreign_procs: tuple[tuple[int, str, float], ...] = ()
    # CPU busy on the server's cores (the server tree's affinity; without a server, the
    # run's cores) that no process of the run able to run there used, % of one core: what
    # another tenant took from the server (None: not measured)
    foreign_cpu_pct: float | None = None
    # how many cores ``foreign_cpu_pct`` is over (its capacity: this many x 100 %)
    foreign_cores: int | None = None


LOADGEN_COLUMNS = ["t", "pid", "name", "cpu_pct", "rss_bytes"]
FOREIGN_COLUMNS = ["t", "pid", "name", "cpu_pct"]
# Unattributed CPU on the server's cores above this (% of one core) in a tick, or on the
# run's cores above LOOK_PCT: rescan the run's processes at once (a hog or a restarted
# server started since the last rescan is the run's, not foreign; a pass over /proc is a
# few ms, and a quiet server's cores stay under it).
RESCAN_PCT = 3.0
# ... and if either stays above this, name the busiest processes outside the run.
LOOK_PCT = 15.0
FOREIGN_NAMED = 3  # processes named per tick
FOREIGN_MIN_PCT = 5.0  # ... each using at least this much of a core


def system_columns(cores: Iterable[int]) -> list[str]:
    return [
        "t",
        "ts",
        "late_s",
        "cpu_pct",
        *[f"cpu{c}_pct" for c in cores],
        "loadgen_cpu_pct",
        "other_cpu_pct",
        "foreign_cpu_pct",
        "foreign_cores",
    ]


class SystemSampler:
    """Per-core and total CPU from /proc/stat; the generator's CPU (and RSS) from its processes."""

    def __init__(
        self,
        out_dir: str | Path | None = None,
        *,
        loadgen_pids: Callable[[], list[int]] | None = None,
        run_pids: Callable[[], list[int]] | None = None,
        sut_pid: Callable[[], int | None] | None = None,
        loadgen_every_s: float = 5.0,
        recent: int = 600,
    ) -> None:
        self.loadgen_pids = loadgen_pids
        # every process of the run: what is busy on the run's cores besides them is
        # another tenant's (validity: "foreign CPU")
        self.run_pids = run_pids
        # the server's command line: a process started with the same one (a supervisor's
        # restart, before the sampler follows it) is the server, not another tenant
        self.sut_pid = sut_pid
        self._sut_cmd: bytes | None = None
        self._run: list[int] = []
        self._run_prev: RunCounters = {}
        self._scope: list[int] = []
        # the server's cores (its tree's affinity; kept while a restarted server is not
        # yet followed) and the run's processes that cannot run on them
        self._server_cores: list[int] = []
        self._off_server: set[int] = set()
        self._run_next = 0.0
        self._adopted: set[int] = set()
        # the server's parent when it is not the run's (an attached server's supervisor):
        # it reaps the server when it is killed, with the server's last moments
        self._reapers: list[int] = []
        # when the run's process list was taken (boot-time clock ticks): a process of the
        # run that started after it was never counted, so it counts whole when first seen
        self._listed_boot: float | None = None
        # the host's last pid before the pass the run's list was made from (None: unknown)
        self._listed_last_pid: int | None = None
        # recent passes over /proc (when, rows): the baseline for naming foreign processes
        self._tables: deque[tuple[float, dict[int, procfs.ProcRow]]] = deque(maxlen=4)
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
        self._csv = self._lg_csv = self._foreign_csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._csv = CsvStream(out / "system.csv", system_columns(self.cores))
            self._lg_csv = CsvStream(out / "loadgen.csv", LOADGEN_COLUMNS)
            self._foreign_csv = CsvStream(out / "foreign.csv", FOREIGN_COLUMNS)

    def loadgen_now(self) -> list[int]:
        """The generator's processes as of the last rescan."""
        return list(self._lg_pids)

    def _loadgen_ticks(
        self, t: float
    ) -> tuple[int, dict[tuple[int, int], int], list[tuple[int, str, int]]]:
        """(summed Δticks, counters by (pid, start), per-process (pid, name, Δticks))."""
        if self.loadgen_pids is not None and t >= self._lg_next:
            self._lg_pids = self.loadgen_pids()
            self._lg_next = t + self.loadgen_every_s
        return cpu_ticks(self._lg_pids, self._lg_prev)

    def _rescan_run(self, fresh: bool = False) -> None:
        if self.run_pids is None:
            return
        # fresh: not a pass from before the process we are looking for started
        procfs.process_table(max_age_s=0.0 if fresh else 0.5)
        # the list is made from this pass (or, had it aged meanwhile, a newer one): no
        # process started since while the host's last pid stays the same
        self._listed_last_pid = procfs.pass_last_pid()
        self._adopted = {p for p in self._adopted if os.path.exists(f"/proc/{p}")}
        self._run = sorted({*self.run_pids(), *self._adopted})
        listed, _ = procfs.process_table()  # the pass the list was made from (monotonic)
        self._listed_boot = (
            time.clock_gettime(time.CLOCK_BOOTTIME) - (time.monotonic() - listed)
        ) * HZ
        sut = self.sut_pid() if self.sut_pid is not None else None
        cmd = cmdline(sut) if sut else None
        if cmd:
            self._sut_cmd = cmd
        run = set(self._run)
        parents = {
            st[3] for p in (sut, *self._adopted) if p and (st := read_run_stat(p)) is not None
        }
        # kept while they live: the server may be gone (and reaped) by the next rescan
        self._reapers = sorted(
            p
            for p in {*self._reapers, *parents}
            if p > 1 and p not in run and os.path.exists(f"/proc/{p}")
        )
        me = os.getpid()
        self._scope = sorted(affinity(p for p in self._run if p != me))
        server = affinity([*process_tree(sut), *self._adopted]) if sut else set()
        if server:
            self._server_cores = sorted(server)
        self._off_server = off_cores(self._run, self._server_cores) if self._server_cores else set()
        self._remember(procfs.process_table())

    def _remember(self, table: tuple[float, dict[int, procfs.ProcRow]]) -> None:
        if not self._tables or self._tables[-1][0] != table[0]:
            self._tables.append(table)

    def _run_ticks(
        self, boot_prev: float | None, dt: float | None = None
    ) -> tuple[int, RunCounters, int]:
        """(Δticks of the run's processes since the last tick, counters by (pid, start),
        Δticks of those that can run on the server's cores): ``run_cpu``, with the
        server's supervisor as a reaper and an adopted restart counted from its start."""
        cap = None
        if dt is not None:
            cap = int(HZ * dt * max(1, len(self._server_cores or self.cores))) + 1
        delta, on, now = run_cpu(
            self._run,
            self._run_prev,
            self._off_server,
            boot_prev,
            reapers=self._reapers,
            whole=self._adopted,
            reaped_cap=cap,
        )
        return delta, now, on

    def _foreign(self, run: set[int], since: float) -> tuple[tuple[int, str, float], ...]:
        """The busiest processes outside the run since the last pass over /proc (a pass
        made after monotonic ``since`` — this tick's — is used as it is)."""
        when, rows = procfs.process_table(max_age_s=max(0.0, time.monotonic() - since), cpu=True)
        # the newest earlier pass at least half a second old (a rescan this tick made one)
        before = next((tb for tb in reversed(self._tables) if 0.5 <= when - tb[0] <= 30), None)
        self._remember((when, rows))
        if before is None:
            return ()
        old = before[1]
        span = when - before[0]
        out = []
        for pid, row in rows.items():
            if pid in run:
                continue
            prev = old.get(pid)
            used = row.cpu_ticks - (
                prev.cpu_ticks if prev and prev.starttime == row.starttime else 0
            )
            pct = 100.0 * used / (HZ * span)
            if pct >= FOREIGN_MIN_PCT:
                out.append((pid, row.name, round(pct, 1)))
        out.sort(key=lambda r: -r[2])
        return tuple(out[:FOREIGN_NAMED])

    def baseline(self, t: float) -> None:
        self._cpu_prev = procfs.read_cpu_times()
        _, self._lg_prev, _ = self._loadgen_ticks(t)
        self._rescan_run()
        _, self._run_prev, _ = self._run_ticks(None)
        self._run_next = t + self.loadgen_every_s
        self._t_prev = t

    def _run_may_have_grown(self) -> bool:
        """A process was started on the host since the run's list was made (the host's
        last pid moved): only then can a rescan find a process of the run it missed."""
        return self._listed_last_pid is None or procfs.last_pid() != self._listed_last_pid

    def sample(self, t: float, ts: float, late_s: float = 0.0) -> SystemTick | None:
        started = time.monotonic()
        cpu_now = procfs.read_cpu_times()
        lg_delta, lg_now, lg_per = self._loadgen_ticks(t)
        listed = self._listed_boot  # the list the previous tick counted
        rescanned = self.run_pids is not None and t >= self._run_next
        if rescanned:
            self._rescan_run()
            self._run_next = t + self.loadgen_every_s
        dt = t - self._t_prev if self._t_prev is not None else None
        run_delta, run_now, on_server = self._run_ticks(listed, dt)
        prev = self._cpu_prev
        self._cpu_prev, self._lg_prev, self._t_prev = cpu_now, lg_now, t
        if not dt or dt <= 0:
            self._run_prev = run_now
            return None

        def pct(key: int) -> float | None:
            if key not in cpu_now or key not in prev:
                return None
            total = cpu_now[key][1] - prev[key][1]
            # idle is floored to a tick at both reads: busy can read a hair outside [0, total]
            busy = min(max(0.0, cpu_now[key][0] - prev[key][0]), total)
            return round(100.0 * busy / total, 2) if total > 0 else 0.0

        lg = round(lg_delta * 100.0 / (HZ * dt), 2) if self.loadgen_pids else None
        other: float | None = None
        on_cores: float | None = None
        n_cores: int | None = None
        foreign: tuple[tuple[int, str, float], ...] = ()
        if self.run_pids is not None:

            def unattributed(cores: list[int], delta: int) -> float:
                scope = [c for c in cores if c in cpu_now] or self.cores
                busy = sum(pct(c) or 0.0 for c in scope)
                return max(0.0, busy - delta * 100.0 / (HZ * dt))

            def server_cores() -> list[int]:
                return [c for c in self._server_cores or self._scope if c in cpu_now] or (
                    self.cores
                )

            other = unattributed(self._scope, run_delta)
            on_cores = unattributed(server_cores(), on_server)
            if (
                (on_cores > RESCAN_PCT or other > LOOK_PCT)
                and not rescanned
                and self._run_may_have_grown()
            ):
                # a process of the run started since the last rescan: find it now (when
                # no process started on the host since, the CPU is the kernel's or a
                # tenant's, and a pass over /proc would find nothing new)
                self._rescan_run(fresh=True)
                run_delta, run_now, on_server = self._run_ticks(listed, dt)
                other = unattributed(self._scope, run_delta)
                on_cores = unattributed(server_cores(), on_server)
            if max(other, on_cores) > LOOK_PCT:
                foreign = self._foreign(set(self._run), started)
                sut = self.sut_pid() if self.sut_pid is not None else None
                restarted = [
                    f
                    for f in foreign
                    if self._sut_cmd is not None and gone(sut) and cmdline(f[0]) == self._sut_cmd
                ]
                if restarted:
                    # the run's, in nobody's tree: the server the sampler follows is gone
                    # and a process with its command line runs — its own supervisor's
                    # restart, before the sampler follows it: adopted, counted from its
                    # start. Nothing else outside the run's trees ever is.
                    self._adopted.update(f[0] for f in restarted)
                    self._run = sorted({*self._run, *self._adopted})
                    run_delta, run_now, on_server = self._run_ticks(listed, dt)
                    other = unattributed(self._scope, run_delta)
                    on_cores = unattributed(server_cores(), on_server)
                    foreign = tuple(f for f in foreign if f not in restarted)
            other = round(other, 2)
            on_cores = round(on_cores, 2)
            n_cores = len(server_cores())
        self._run_prev = run_now
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
            other_cpu_pct=other,
            foreign_procs=foreign,
            foreign_cpu_pct=on_cores,
            foreign_cores=n_cores,
        )
        self.recent.append(tick)
        if self._csv is not None:
            self._csv.write(
                [
                    (tick.t, tick.ts, tick.late_s, tick.cpu_pct, *tick.per_core, lg, other)
                    + (on_cores, n_cores)
                ]
            )
        if self._lg_csv is not None:
            self._lg_csv.write([(tick.t, *p) for p in tick.loadgen_procs])
        if self._foreign_csv is not None and foreign:
            self._foreign_csv.write([(tick.t, *p) for p in foreign])
        return tick

    def close(self) -> None:
        for f in (self._csv, self._lg_csv, self._foreign_csv):
            if f is not None:
                f.close()


class ForeignMeter:
    """The CPU on the server's cores that the run's processes did not use, between two
    moments: two reads of /proc/stat and of the run's processes, no ticking — for a
    window the sampler does not see, such as the capacity probe (it runs before the
    sampler starts).

    The run is ``roots`` (default: this process) and their descendants plus the
    server's tree (``sut_pid``), by ancestry only, as the sampler counts it. The server's
    cores are its tree's affinity; a process of the run that cannot run on them is not
    subtracted from their busy time. Without a server pid on this host (a target given
    by URL only, or on an agent's host) only the generator's own CPU is measured.
    """

    def __init__(self, sut_pid: int | None, roots: Iterable[int] | None = None) -> None:
        self.sut_pid = sut_pid
        self.roots = list(roots) if roots is not None else [os.getpid()]
        self._pids = run_pids(self.roots, sut=lambda: [sut_pid] if sut_pid else [])
        self._start: tuple[float, dict[int, tuple[int, int]], RunCounters, int] | None = None
        self._cores: list[int] = []
        self._boot = 0.0  # boot-time clock ticks at start: a process started since is new

    def _own_ticks(self) -> int:
        return sum(
            st.utime + st.stime
            for st in (procfs.read_stat(f"/proc/{p}/stat") for p in self.roots)
            if st is not None
        )

    def start(self) -> None:
        procfs.process_table(max_age_s=0.0)
        if self.sut_pid and not gone(self.sut_pid):
            self._cores = sorted(affinity(process_tree(self.sut_pid)))
        _, _, procs = run_cpu(self._pids(), {})
        self._start = (time.monotonic(), procfs.read_cpu_times(), procs, self._own_ticks())
        self._boot = time.clock_gettime(time.CLOCK_BOOTTIME) * HZ

    def stop(self) -> dict:
        """``measured`` (false with ``why`` when the server's CPU is not on this host),
        ``span_s``, ``server_cores``, ``foreign_core_s`` (busy on the server's cores not
        used by the run), ``resolution_core_s`` (how much of that the tick counters cannot
        tell from the run's own: 2 ticks a process of the run, 1 a core), ``loadgen_cpu_s``
        (the generator's own process, ``roots``)."""
        if self._start is None:
            raise RuntimeError("ForeignMeter.stop() before start()")
        t0, cpu0, procs0, own0 = self._start
        procfs.process_table(max_age_s=0.0)
        pids = self._pids()
        off = off_cores(pids, self._cores) if self._cores else set()
        _, run, procs1 = run_cpu(pids, procs0, off, started_after=self._boot)
        cpu1, own1 = procfs.read_cpu_times(), self._own_ticks()
        span = time.monotonic() - t0
        out: dict = {"span_s": round(span, 3), "loadgen_cpu_s": round((own1 - own0) / HZ, 3)}
        if not self._cores:
            why = (
                "no server process on this host to tell the run's CPU from another tenant's"
                if not self.sut_pid
                else f"the server (pid {self.sut_pid}) was not running"
            )
            return {**out, "measured": False, "why": why}
        busy = sum(cpu1[c][0] - cpu0[c][0] for c in self._cores if c in cpu0 and c in cpu1)
        # what whole-tick counters cannot resolve: each process's utime and stime are read
        # floored to a tick at both ends (its delta up to 2 ticks short), and so is each
        # server core's busy time (up to 1 tick either way)
        resolution = 2 * len(set(procs0) | set(procs1)) + len(self._cores)
        return {
            **out,
            "measured": True,
            "server_cores": self._cores,
            "foreign_core_s": round(max(0, busy - run) / HZ, 3),
            "resolution_core_s": round(resolution / HZ, 3),
        }
