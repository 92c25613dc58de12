"""Which processes are the run's, and the CPU they used: the load generator's trees (with
the CPU hogs they start), the server's tree and the sampler, found by ancestry only (see
system.py for why), and their CPU ticks read from /proc, counting a process that exited
between ticks through its reaper.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterable

from harness.collectors import procfs


def process_tree(pid: int) -> list[int]:
    kids = procfs.descendants(pid)
    return [] if kids is None else [pid, *kids]


# The process name CPU hogs give themselves: they are children of the load generator
# (the chaos timeline runs in the Locust master) but their CPU is the chaos, not the load.
HOG_COMM = "harness-hog"


def is_hog(pid: int) -> bool:
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
        family = [p for r in tops for p in process_tree(r)]
        skip = {me, *(p for s in exclude() for p in process_tree(s))}
        return [p for p in family if p not in skip and not is_hog(p)]

    return pids


def run_pids(
    roots: Iterable[int] | None = None, sut: Callable[[], Iterable[int]] = tuple
) -> Callable[[], list[int]]:
    """Every process of the run on this host: the generator's trees (default root: the
    sampler's parent) with everything they started — CPU hogs, a proxy, a server the
    master started — the server's tree (``sut()``), and the sampler itself."""
    tops = list(roots) if roots is not None else [os.getppid()]
    me = os.getpid()

    def pids() -> list[int]:
        seen = {me}
        for top in (*tops, *sut()):
            seen.update(process_tree(top))
        return sorted(seen)

    return pids


def cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read() or None
    except OSError:
        return None


def gone(pid: int | None) -> bool:
    """No such process, or only its zombie (it exited; nobody reaped it yet)."""
    if pid is None:
        return True
    st = procfs.read_stat(f"/proc/{pid}/stat")
    return st is None or st.state in ("Z", "X")


def cpu_ticks(
    pids: Iterable[int],
    prev: dict[tuple[int, int], int],
    started_after: float | None = None,
) -> tuple[int, dict[tuple[int, int], int], list[tuple[int, str, int]]]:
    """CPU clock ticks of ``pids`` since ``prev`` (counters by (pid, start), so a reused
    pid is a new process): (summed Δ, counters now, per process (pid, name, Δ)). A process
    not in ``prev`` counts whole when it started after ``started_after`` (boot-time clock
    ticks; ``starttime`` is whole ticks, truncated), else from the next call on."""
    now: dict[tuple[int, int], int] = {}
    delta = 0
    per: list[tuple[int, str, int]] = []
    for pid in pids:
        st = procfs.read_stat(f"/proc/{pid}/stat")
        if st is None:
            continue
        key = (pid, st.starttime)
        now[key] = st.utime + st.stime
        if key in prev:
            d = now[key] - prev[key]
        elif started_after is not None and st.starttime + 1 > started_after:
            d = now[key]
        else:
            continue
        delta += d
        per.append((pid, st.name, d))
    return delta, now, per


# A run process's CPU counters: (own utime + stime, its reaped children's cutime +
# cstime, its parent's pid), in clock ticks.
RunCounters = dict[tuple[int, int], tuple[int, int, int]]


def read_run_stat(pid: int) -> tuple[int, int, int, int] | None:
    """(starttime, own CPU ticks, reaped children's CPU ticks, ppid) from /proc/PID/stat;
    a zombie still reads (its final figures)."""
    data = procfs._read(f"/proc/{pid}/stat")
    if not data:
        return None
    try:
        # f[0] is field 3 (state): field n is f[n - 3]; split up to starttime (22)
        f = data[data.rindex(b")") + 2 :].split(None, 20)
        return int(f[19]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), int(f[1])
    except (ValueError, IndexError):
        return None


def run_cpu(
    pids: Iterable[int],
    prev: RunCounters,
    off: Container[int] = (),
    started_after: float | None = None,
    *,
    reapers: Iterable[int] = (),
    whole: Container[int] = (),
    reaped_cap: int | None = None,
) -> tuple[int, int, RunCounters]:
    """CPU clock ticks the run's processes used since ``prev``: (all of them, those not in
    ``off`` — the ones that can run on the server's cores —, counters now).

    A process's counter includes its reaped children's CPU (cutime + cstime), so a
    process of the run that exited since the last call still counts: its last moments
    are in its parent's counter once reaped (a killed server reaped by the harness, a
    short-lived child started and reaped between two calls), and what was counted of it
    before is not counted twice. A process not in ``prev`` counts whole when it started
    after ``started_after`` (boot-time clock ticks) or is in ``whole``, else from the
    next call on.

    ``reapers`` are not the run's but reap one of its processes (an attached server's own
    supervisor): only the jump of their reaped children's CPU counts, when a process of
    the run they are the parent of is gone, for its last moments beyond what was counted
    of it — at most ``reaped_cap`` ticks (what the gone process could have used since the
    last call), so another child the reaper reaped at the same time is never the run's.

    A gone process is subtracted only once its parent's counter holds it (a jump of its
    reaped children's CPU at least what was counted of it): reaped between the reads of
    the parent and of the child, it is kept in the counters until the next call, where
    the jump shows, so no call's CPU is negative and none counts it twice."""
    now: RunCounters = {}
    total = on = 0
    reaped_by: dict[int, int] = {}  # pid → Δ of its reaped children's CPU
    outside: set[int] = set()
    for pid in reapers:
        st = read_run_stat(pid)
        if st is None:
            continue
        start, _own, reaped, ppid = st
        key = (pid, start)
        now[key] = (-1, reaped, ppid)  # -1: a reaper, none of its own CPU is the run's
        outside.add(pid)
        if key in prev:
            reaped_by[pid] = reaped - prev[key][1]
    for pid in pids:
        if pid in outside:
            continue
        st = read_run_stat(pid)
        if st is None:
            continue
        start, own, reaped, ppid = st
        key = (pid, start)
        now[key] = (own, reaped, ppid)
        if key in prev:
            d = own + reaped - prev[key][0] - prev[key][1]
            reaped_by[pid] = reaped - prev[key][1]
        elif (started_after is not None and start + 1 > started_after) or pid in whole:
            d = own + reaped
        else:
            continue
        total += d
        if pid not in off:
            on += d
    # per parent, its reaped children's CPU read this call not yet matched to a gone child
    unmatched = {ppid: jump for ppid, jump in reaped_by.items() if ppid not in outside}
    gone_on: dict[int, int] = {}  # reaper off the server's cores → CPU counted of its gone children
    # reaper outside the run → (CPU counted of its gone children, any of them on the server's cores)
    gone_out: dict[int, tuple[int, bool]] = {}
    for (pid, start), (own, reaped, ppid) in prev.items():
        if own < 0 or (pid, start) in now or ppid not in reaped_by:
            continue  # still here; or not reaped by a process of the run or a reaper: lost
        st = read_run_stat(pid)
        if st is not None and st[0] == start:
            continue  # alive, only no longer among the run's (reparented)
        counted = own + reaped
        if ppid in outside:
            was, anyon = gone_out.get(ppid, (0, False))
            gone_out[ppid] = (was + counted, anyon or pid not in off)
            continue
        if unmatched.get(ppid, 0) < counted:
            # gone, but its parent's counter has not taken it in yet: the parent was read
            # before it reaped the child, the child after (between the two reads of this
            # call). Subtracting what was counted of it now would make this call's CPU
            # negative and the next one's count it twice; kept as it was, it is matched
            # with the parent's jump when that is read.
            now[(pid, start)] = (own, reaped, ppid)
            continue
        unmatched[ppid] -= counted
        total -= counted
        if ppid not in off:
            on -= counted  # its reaper's jump was counted on the server's side
        elif pid not in off:
            gone_on[ppid] = gone_on.get(ppid, 0) + counted
    for ppid, counted in gone_on.items():
        # a child that ran on the server's cores, reaped by a process that cannot: what it
        # used since it was last counted is there, not on its reaper's cores
        on += max(0, reaped_by.get(ppid, 0) - counted)
    for ppid, (counted, anyon) in gone_out.items():
        # the supervisor's jump is its gone children's whole lives: what was not counted
        # of them is their last moments
        last = max(0, reaped_by[ppid] - counted)
        if reaped_cap is not None:
            last = min(last, reaped_cap)
        total += last
        if anyon:
            on += last
    return total, on, now


def affinity(pids: Iterable[int]) -> set[int]:
    cores: set[int] = set()
    for pid in pids:
        try:
            cores |= os.sched_getaffinity(pid)
        except OSError:
            continue
    return cores


def off_cores(pids: Iterable[int], cores: Iterable[int]) -> set[int]:
    """The pids whose affinity is known and shares no core with ``cores``: their CPU
    cannot have been spent there. A pid whose affinity cannot be read is not among them
    (its CPU is counted as if it ran there: never a tenant made out of the run's work)."""
    want = set(cores)
    off: set[int] = set()
    for pid in pids:
        try:
            if not (os.sched_getaffinity(pid) & want):
                off.add(pid)
        except OSError:
            continue
    return off
