"""What this host says about a server's processes: free ports, process trees, who
listens on a port, how long a process has run, whether a readiness URL answers 200.
Everything is looked up by pid, never by name."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from harness.primitives import atomic_write


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on ``host`` right now (there is a small race, as always)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (empty if ``pid`` is gone)."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def poll_ready(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_pid_file(path: Path, pid: int) -> None:
    """Replace ``path`` with ``pid`` atomically (``harness sample --pid-file`` follows it)."""
    atomic_write(path, f"{pid}\n")


def process_age_s(pid: int) -> float | None:
    """Seconds since ``pid`` started, to the clock tick: its start and the uptime are both
    counted from boot (psutil's create_time adds a boot time rounded to the second)."""
    # (harness.collectors.procfs parses stat fully, but this layer imports only errors)
    try:
        with open(f"/proc/{pid}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this host (of a pre-forked server's
    listeners, the one whose parent does not listen there too); None when none does."""
    pids = set()
    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                pids.add(c.pid)
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).ppid() not in pids:
                return pid
    return min(pids) if pids else None
