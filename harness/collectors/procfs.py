"""Cheap readers of /proc for the samplers (Linux). Each returns None when the task is gone.

Field positions follow proc(5) and sysstat's pidstat.c: in
``/proc/PID/task/TID/stat`` utime is field 14, stime 15, starttime 22, processor 39,
guest_time 43 — all in clock ticks. The command name is the parenthesised field 2, so we
need not read ``comm`` separately (pidstat does the same).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class TaskStat(NamedTuple):
    name: str
    state: str
    utime: int
    stime: int
    starttime: int
    processor: int
    guest: int


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
    f = data[rpar + 2 :].split()
    # f[0] is field 3 (state): field n is f[n - 3].
    guest = int(f[40]) if len(f) > 40 else 0
    return TaskStat(name, f[0].decode(), int(f[11]), int(f[12]), int(f[19]), int(f[36]), guest)


def read_stat(path: str) -> TaskStat | None:
    data = _read(path)
    if not data:
        return None
    try:
        return parse_stat(data)
    except (ValueError, IndexError):
        return None


def read_schedstat(path: str) -> tuple[int, int, int] | None:
    """(on-CPU ns, run-queue wait ns, times scheduled in); None without schedstat."""
    data = _read(path)
    if not data:
        return None
    parts = data.split()
    if len(parts) < 3:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def read_ctxt(path: str) -> tuple[int, int] | None:
    """(voluntary, nonvoluntary) context switches of one task from its status file."""
    data = _read(path)
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
    data = _read(f"/proc/{pid}/statm")
    if not data:
        return None
    return int(data.split()[1]) * PAGE_SIZE


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


def scan_fds(pid: int) -> tuple[int, list[int]] | None:
    """(open fds, the inode of each socket among them)."""
    total = 0
    sockets: list[int] = []
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                total += 1
                try:
                    link = os.readlink(entry.path)
                except OSError:
                    continue  # closed between the listing and the readlink
                if link.startswith("socket:["):
                    sockets.append(int(link[8:-1]))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
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


def list_tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return []


def read_cpu_times() -> dict[int, tuple[int, int]]:
    """/proc/stat as ``{-1: (busy, total), 0: (busy, total), 1: …}`` in jiffies (-1 = all).

    total excludes guest/guest_nice (already inside user/nice); idle = idle + iowait.
    """
    data = _read("/proc/stat") or b""
    out: dict[int, tuple[int, int]] = {}
    for line in data.split(b"\n"):
        if not line.startswith(b"cpu"):
            break
        parts = line.split()
        label = parts[0][3:]
        v = [int(x) for x in parts[1:9]]
        total = sum(v)
        out[int(label) if label else -1] = (total - v[3] - v[4], total)
    return out
