"""Cheap readers of /proc for the samplers (Linux). Each returns None when the task is gone.

Field positions follow proc(5) and sysstat's pidstat.c (see REFERENCE §C): in
``/proc/PID/task/TID/stat`` utime is field 14, stime 15, starttime 22, processor 39,
guest_time 43 — all in clock ticks. The command name is the parenthesised field 2, so we
need not read ``comm`` separately (pidstat does the same).
"""

from __future__ import annotations

import os
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
    total = sockets = 0
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                total += 1
                try:
                    if os.readlink(entry.path).startswith("socket:"):
                        sockets += 1
                except OSError:
                    pass  # closed between the listing and the readlink
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return total, sockets


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
