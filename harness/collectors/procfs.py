"""Cheap readers of /proc for the samplers (Linux). Each returns None when the task is gone.

Field positions follow proc(5) and sysstat's pidstat.c: in
``/proc/PID/task/TID/stat`` utime is field 14, stime 15, num_threads 20, starttime 22,
processor 39, guest_time 43 — all in clock ticks but num_threads. The command name is the
parenthesised field 2, so we need not read ``comm`` separately (pidstat does the same).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Collection, Iterable
from typing import NamedTuple

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class TaskStat(NamedTuple):
    name: str
    state: str
    utime: int
    stime: int
    starttime: int
    processor: int
    guest: int
    num_threads: int = 0  # field 20: the process's threads (a thread's stat: its group's)


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        return os.read(fd, 65536)
    except (ProcessLookupError, OSError):
        return None
    finally:
        os.close(fd)


def parse_stat(data: bytes) -> TaskStat:
    # comm may contain spaces and parentheses: split at the last ')'.
    lpar = data.index(b"(")
    rpar = data.rindex(b")")
    name = data[lpar + 1 : rpar].decode("utf-8", "replace")
    # f[0] is field 3 (state): field n is f[n - 3]; nothing past guest_time (43) is split
    f = data[rpar + 2 :].split(None, 41)
    guest = int(f[40]) if len(f) > 40 else 0
    return TaskStat(
        name, f[0].decode(), int(f[11]), int(f[12]), int(f[19]), int(f[36]), guest, int(f[17])
    )


def read_stat(path: str) -> TaskStat | None:
    return parse_stat_or_none(_read(path))


def parse_stat_or_none(data: bytes | None) -> TaskStat | None:
    if not data:
        return None
    try:
        return parse_stat(data)
    except (ValueError, IndexError):
        return None


def read_schedstat(path: str) -> tuple[int, int, int] | None:
    """(on-CPU ns, run-queue wait ns, times scheduled in); None without schedstat."""
    return parse_schedstat(_read(path))


def parse_schedstat(data: bytes | None) -> tuple[int, int, int] | None:
    if not data:
        return None
    parts = data.split()
    if len(parts) < 3:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def read_ctxt(path: str) -> tuple[int, int] | None:
    """(voluntary, nonvoluntary) context switches of one task from its status file."""
    return parse_ctxt(_read(path))


def parse_ctxt(data: bytes | None) -> tuple[int, int] | None:
    if not data:
        return None
    vol = data.find(b"\nvoluntary_ctxt_switches:")
    nvol = data.find(b"\nnonvoluntary_ctxt_switches:")
    if vol < 0 or nvol < 0:
        return None
    try:
        v = int(data[vol + 25 : data.index(b"\n", vol + 1)])
        n = int(data[nvol + 28 : data.index(b"\n", nvol + 1)])
    except ValueError:
        return None
    return v, n


def read_rss_bytes(pid: int) -> int | None:
    return parse_rss_bytes(_read(f"/proc/{pid}/statm"))


def parse_rss_bytes(data: bytes | None) -> int | None:
    """Resident bytes from the text of /proc/PID/statm."""
    if not data:
        return None
    try:
        return int(data.split(None, 2)[1]) * PAGE_SIZE
    except (ValueError, IndexError):
        return None


def read_uss_pss_bytes(pid: int) -> tuple[int, int] | None:
    """(USS, PSS) from smaps_rollup (~1 ms a call: sample it every ~10 s, not every tick)."""
    data = _read(f"/proc/{pid}/smaps_rollup")
    if not data:
        return None
    uss = pss = 0
    for line in data.split(b"\n"):
        if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
            uss += int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
    return uss, pss


def count_fds_split(pid: int) -> tuple[int, int] | None:
    """(open fds, of which sockets). Sockets come and go with client connections; files,
    pipes and eventfds do not, so a leak of those shows in a quiet series of its own."""
    scan = scan_fds(pid)
    return None if scan is None else (scan[0], len(scan[1]))


def scan_fds(pid: int, skip: Collection[str] = ()) -> tuple[int, list[int]] | None:
    """(open fds, the inode of each socket among them). ``skip``: fd numbers (as text)
    known not to be sockets, counted without a readlink (the sampler's own /proc files)."""
    where = f"/proc/{pid}/fd/"
    try:
        names = os.listdir(where)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = set(names).difference(skip) if skip else names
    total = len(names) - len(rest)
    sockets: list[int] = []
    for name in rest:
        try:
            link = os.readlink(where + name)
        except OSError:
            # closed between the listing and the readlink: not counted at all.
            # Counted in the total, a socket closing as the listing ran (clients
            # reconnect all the time) read as a non-socket fd the server held.
            continue
        total += 1
        if link.startswith("socket:["):
            sockets.append(int(link[8:-1]))
    return total, sockets


def _read_all(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


TCP_LISTEN = "0A"


def tcp_sockets(pid: int) -> dict[int, tuple[str, str]]:
    """inode → (local endpoint, remote endpoint) of the TCP sockets (v4 and v6) in the
    network namespace of ``pid``, listening ones left out. Endpoints are the kernel's hex
    ``ADDR:PORT`` text, compared as is. Orphaned sockets (inode 0) are left out too."""
    out: dict[int, tuple[str, str]] = {}
    for name in ("tcp", "tcp6"):
        data = _read_all(f"/proc/{pid}/net/{name}")
        if not data:
            continue
        for line in data.split(b"\n")[1:]:
            f = line.split()
            if len(f) < 10 or f[3].decode() == TCP_LISTEN:
                continue
            inode = int(f[9])
            if inode:
                out[inode] = (_endpoint(f[1].decode()), _endpoint(f[2].decode()))
    return out


V4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:a.b.c.d in /proc/net/tcp6's hex


def _endpoint(text: str) -> str:
    """A v4-mapped v6 endpoint (a dual-stack server's view of a v4 client) as the v4 one."""
    addr, _, port = text.partition(":")
    if len(addr) == 32 and addr.startswith(V4_MAPPED):
        return f"{addr[24:]}:{port}"
    return text


def connections_between(
    server_pid: int, server_sockets: Iterable[int], peer_sockets: Iterable[int]
) -> int:
    """How many of the server's connected sockets have a peer socket among
    ``peer_sockets`` (socket inodes of other processes on this host): the connections
    those processes hold to the server, as the server sees them."""
    table = tcp_sockets(server_pid)
    peer_ends = {table[i][0] for i in peer_sockets if i in table}
    return sum(1 for i in server_sockets if i in table and table[i][1] in peer_ends)


HELD_FILES_WANTED = 4096  # held files a sampler is given room for: ~1,300 threads' three each


def held_files_limit() -> int:
    """How many /proc files this process's sampler may hold open: half its open-file
    limit less 64 for everything else (``HELD_FILES_WANTED`` when unlimited). A soft limit
    too low for ``HELD_FILES_WANTED`` is first raised toward the hard one, as Locust
    raises its own for sockets: a shell's default soft limit of 1,024 leaves room for 448
    files, two or three a thread, and a larger server's other threads would be opened,
    read and closed again on each tick."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    want = 2 * (HELD_FILES_WANTED + 64)
    if soft != infinity and soft < want:
        raised = want if hard == infinity else min(want, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):
                pass  # keep the soft limit there is
    return HELD_FILES_WANTED if soft == infinity else max(0, soft // 2 - 64)


class OpenFiles:
    """/proc files kept open and re-read with ``pread(fd, n, 0)``.

    Opening ``/proc/PID/task/TID/schedstat`` walks the path and looks the task up on every
    call; re-reading an open file regenerates it without that (the kernel's seq_file
    rewinds at offset 0). On a 200-thread server at 1 Hz that is most of the per-thread
    cost. An open file stays bound to its task: once the task exits, reads fail with
    ESRCH even if the TID is reused, so a failed read is retried once through a fresh
    open (the new task's file). ``sweep()`` closes the files not read since the previous
    sweep (threads that exited). At most ``limit`` files are held; past it, reads fall
    back to open/read/close.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = held_files_limit() if limit is None else limit
        self._fds: dict[str, int] = {}
        self._names: set[str] = set()  # the held fds as /proc/self/fd names them
        self._used: set[str] = set()
        self.opens = 0  # files opened so far (held or not): what the pread saves

    def read(self, path: str) -> bytes | None:
        self._used.add(path)
        fd = self._fds.get(path)
        if fd is not None:
            try:
                data = os.pread(fd, 65536, 0)
            except OSError:
                data = b""
            if data:
                return data
            self._close(path)  # the task behind this fd exited: try the path afresh
        self.opens += 1
        if len(self._fds) >= self.limit:
            return _read(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        try:
            data = os.pread(fd, 65536, 0)
        except OSError:
            os.close(fd)
            return None
        self._fds[path] = fd
        self._names.add(str(fd))
        return data or None

    def keep(self, path: str) -> None:
        """Keep ``path`` open through the next sweep though it was not read (a file read
        only now and then, of a task still there)."""
        self._used.add(path)

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._names.discard(str(fd))
            os.close(fd)

    def sweep(self) -> None:
        for path in [p for p in self._fds if p not in self._used]:
            self._close(path)
        self._used = set()

    def __len__(self) -> int:
        return len(self._fds)

    def fd_names(self) -> set[str]:
        """The held fds as /proc/self/fd names them (the set itself: do not change it)."""
        return self._names

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)


class SocketEndpoints:
    """The endpoints of the server's TCP connections and of the harness's own sockets,
    without reading the kernel's table every tick.

    ``/proc/PID/net/tcp{,6}`` is made by walking the whole socket hash (~5 ms a read on a
    loaded box: most of the sampler's cost when read every tick), and a connected
    socket's endpoints never change. So the table is read only when the *server* holds a
    socket not seen before (a new connection, accepted: its client's socket existed
    before it, so that read finds both ends), or every ``refresh_s`` seconds (a safety
    net: nothing known goes stale between, so it can be rare); between
    reads every endpoint of the last read is remembered. A new socket of the harness's
    alone (its connections to anything else: an agent's HTTP, a metrics scrape) needs no
    read: a connection to the server shows up as a new server socket.
    """

    def __init__(self, refresh_s: float = 60.0) -> None:
        self.refresh_s = refresh_s
        self._table: dict[int, tuple[str, str]] = {}
        self._seen: set[int] = set()  # server sockets looked up (in the table or not)
        self._refresh_at = 0.0
        self.reads = 0

    def connections_between(
        self, pid: int, server_sockets: Iterable[int], peer_sockets: Iterable[int], t: float
    ) -> int:
        """``connections_between`` through the remembered endpoints."""
        server = list(server_sockets)
        if t >= self._refresh_at or any(i not in self._seen for i in server):
            self._table = tcp_sockets(pid)
            self.reads += 1
            self._refresh_at = t + self.refresh_s
        self._seen = set(server)
        table = self._table
        peer_ends = {table[i][0] for i in peer_sockets if i in table}
        return sum(1 for i in server if i in table and table[i][1] in peer_ends)


class ProcRow(NamedTuple):
    ppid: int
    name: str
    starttime: int  # clock ticks after boot
    cpu_ticks: int  # utime + stime


_TABLE: tuple[float, dict[int, ProcRow], dict[int, list[int]]] = (-1e18, {}, {})

# A pass over /proc asked for *who is whose child* is reused, however old, while no
# process or thread has been started on the host since it began (the host's last pid has
# not moved) and it is younger than this: a process joins a tree only by being started,
# and one that exited since is simply not found when it is read. The CPU figures of a pass
# are never reused so (``process_table(cpu=True)``); the bound keeps a pass recent enough
# for them to be compared with (system.py names another tenant from two passes).
REUSE_S = 25.0


def process_table(max_age_s: float = 0.5, *, cpu: bool = False) -> tuple[float, dict[int, ProcRow]]:
    """(when, pid → ProcRow) for every process on the host, from one pass over
    /proc/*/stat (shared with ``children_map`` while younger than ``max_age_s``, or while
    no process started since it, up to ``REUSE_S``). ``cpu``: the rows' ``cpu_ticks``
    are to be read as of now, so a pass is shared only while younger than ``max_age_s``."""
    _pass(max_age_s, cpu=cpu)
    return _TABLE[0], _TABLE[1]


def children_map(max_age_s: float = 0.5) -> dict[int, list[int]]:
    """ppid → pids of every process on the host, from one pass over /proc/*/stat.

    A pass reads every process's stat (~4 ms on a box with 80 processes); the samplers
    ask for several trees (the SUT's, the generator's, the SUT's again to exclude it) at
    each rescan, so a pass younger than ``max_age_s`` is shared between them, and one up
    to ``REUSE_S`` old while no process has started on the host since it.
    """
    _pass(max_age_s)
    return _TABLE[2]


def last_pid() -> int | None:
    """The last process id the kernel handed out (/proc/loadavg's last field): while it
    stays the same, no process or thread was started on the host."""
    data = _read("/proc/loadavg")
    try:
        return int(data.rsplit(None, 1)[1]) if data else None
    except (ValueError, IndexError):
        return None


_PASS_LAST_PID: int | None = None


def pass_last_pid() -> int | None:
    """``last_pid()`` as read just before the newest pass over /proc started: equal to
    ``last_pid()`` now, no process started since that pass (None: no pass yet)."""
    return _PASS_LAST_PID


def _pass(max_age_s: float, cpu: bool = False) -> None:
    global _TABLE, _PASS_LAST_PID
    now = time.monotonic()
    age = now - _TABLE[0]
    if age <= max_age_s:
        return
    started = last_pid()
    if not cpu and age <= REUSE_S and started is not None and started == _PASS_LAST_PID:
        return  # nothing started since the last pass: its trees still hold
    rows: dict[int, ProcRow] = {}
    table: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        data = _read(f"/proc/{name}/stat")
        if not data:
            continue
        try:
            rpar = data.rindex(b")")
            f = data[rpar + 2 :].split(None, 20)  # up to starttime (field 22)
            row = ProcRow(
                int(f[1]),
                data[data.index(b"(") + 1 : rpar].decode("utf-8", "replace"),
                int(f[19]),
                int(f[11]) + int(f[12]),
            )
        except (ValueError, IndexError):
            continue
        rows[int(name)] = row
        table.setdefault(row.ppid, []).append(int(name))
    _TABLE = (now, rows, table)
    _PASS_LAST_PID = started


def descendants(pid: int, max_age_s: float = 0.5) -> list[int] | None:
    """Every descendant of ``pid`` (children first); None when ``pid`` does not exist."""
    if not os.path.exists(f"/proc/{pid}/stat"):
        return None
    table = children_map(max_age_s)
    out: list[int] = []
    todo = list(table.get(pid, ()))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(table.get(child, ()))
    return out


def list_task_names(pid: int) -> list[str]:
    """The TIDs of ``pid``'s threads as /proc/PID/task names them (text)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return []


def read_cpu_times() -> dict[int, tuple[float, float]]:
    """Each core's busy and elapsed time so far, ``{-1: (busy, total), 0: (busy, total),
    1: …}`` in clock ticks (-1 = all cores, their sum); only differences between two
    reads mean anything.

    busy is the clock less the core's idle (idle + iowait in /proc/stat), not the sum of
    its user, system and irq fields: the kernel charges those a whole tick to whatever
    runs when the tick fires, and a core that works in short bursts is over-read by them
    (docs/checks.md, "How busy a core was": a bursty server's core read 2x busier
    than its tasks' own runtime), while a tickless kernel accounts each idle period to the nanosecond. The
    clock is CLOCK_BOOTTIME, which counts what idle counts, read right after the file.
    """
    data = _read("/proc/stat") or b""
    now = time.clock_gettime(time.CLOCK_BOOTTIME) * CLK_TCK
    out: dict[int, tuple[float, float]] = {}
    cores = 0
    for line in data.split(b"\n"):
        if not line.startswith(b"cpu"):
            break
        parts = line.split()
        label = parts[0][3:]
        idle = int(parts[4]) + int(parts[5])
        if label:
            cores += 1
            out[int(label)] = (now - idle, now)
        else:
            out[-1] = (-float(idle), 0.0)  # completed below, once the cores are counted
    if -1 in out:
        out[-1] = (now * cores + out[-1][0], now * cores)
    return out
