"""The harness's own connections to the server, counted by the processes that hold them.

The server's socket count includes one socket per connection the harness holds: its
keep-alive pool grows with the concurrency, which rises with latency. The leak checks
judge the server's sockets net of those (``client_conns`` on the server's samples), or a
growing pool would read as the server's leak. The sampler finds them by matching the
server's connections with the sockets of the load generator's processes — on its own host,
in the processes it measures. A Locust worker on another host (or started beside the
master by hand, in nobody's process tree), and every load process when the server is
sampled by ``harness agent`` on its own host, holds connections the sampler cannot see.

So each load process the sampler may not see counts its own: its established TCP
connections to the server's address, every 2 s on a native thread (psutil, as ``ss -tnp``
would list them) — every Locust worker, and the local runner when ``harness agent``
samples the server. A worker sends its readings to the master in Locust's periodic
report; the local runner keeps its own. When
the run ends, every count the sampler did not already make — a process not on the
sampler's host, not in its measured tree, or a sampler on another host — is added to
``client_conns`` on the sampler's ticks, aligned by wall clock.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psutil

from harness.load.http import split_url
from harness.load.workers_cpu import on_ticks

# A count lists the process's sockets (psutil: a readlink per fd and the netns's TCP
# table): ~10-50 ms with a thousand connections open. It runs on a native thread, never on
# the gevent loop that dispatches the load (counted there, every second, it pushed the
# dispatch lag of a 1024-connection mixed_priority run past its limit), every 2 s.
EVERY_S = 2.0
# a reading stands for a sampler tick (1 s apart) this near it: with readings 2 s apart
# the nearest is at most 1 s away, and a loaded loop runs its greenlets late
WITHIN_S = 1.5


def host_id() -> str:
    """This host as the sampler would see it: the kernel's boot id and the network
    namespace (two namespaces on one kernel are two hosts to a socket table)."""
    boot = ""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    netns = ""
    with contextlib.suppress(OSError):
        netns = os.readlink("/proc/self/ns/net")
    return f"{boot}/{netns}"


def _addresses(host: str) -> set[str]:
    try:
        return {str(a[4][0]) for a in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return {host}


class ConnCounter:
    """This process's established TCP connections to ``base_url``'s host and port."""

    def __init__(self, base_url: str, clock: Callable[[], float] = time.time) -> None:
        host, port, _ = split_url(base_url)
        self.ips = _addresses(host)
        self.port = int(port)
        self.clock = clock
        self.pid = os.getpid()
        self.host = host_id()
        self.readings: list[tuple[float, int]] = []
        self._proc = psutil.Process()

    def count(self) -> int:
        n = 0
        for c in self._proc.net_connections(kind="tcp"):
            r = c.raddr
            if (
                c.status == psutil.CONN_ESTABLISHED
                and r
                and r.port == self.port
                and r.ip in self.ips
            ):
                n += 1
        return n

    def poll(self) -> None:
        with contextlib.suppress(psutil.Error, OSError):
            self.readings.append((self.clock(), self.count()))

    def run(
        self,
        sleep: Callable[[float], Any],
        every_s: float = EVERY_S,
        offload: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        """Count until killed (a greenlet of the load process); ``offload(fn)`` runs one
        count elsewhere and waits for it (gevent's native threadpool)."""
        while True:
            if offload is None:
                self.poll()
            else:
                offload(self.poll)
            sleep(every_s)

    def drain(self) -> dict[str, Any]:
        """The readings since the last drain, with who made them and this process's clock
        as it sent them (the receiver's own clock replaces it: hosts' clocks differ)."""
        out, self.readings = self.readings, []
        return {
            "host": self.host,
            "pid": self.pid,
            "sent": self.clock(),
            "readings": [[t, n] for t, n in out],
        }


class OwnConns:
    """On the master / local runner: every load process's counts, by source, on this
    process's clock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.sources: dict[str, dict[str, Any]] = {}

    def add(self, source: str, wire: Mapping[str, Any] | None, final: bool = False) -> None:
        """A source's readings (``ConnCounter.drain``); ``final``: it sent its last, its
        load stopped and its connections closed."""
        if not wire:
            return
        s = self.sources.setdefault(
            source,
            {"host": str(wire["host"]), "pid": int(wire["pid"]), "readings": [], "final": False},
        )
        shift = self.clock() - float(wire["sent"])  # its clock → ours (+ the message's trip)
        s["readings"].extend((float(t) + shift, int(n)) for t, n in wire["readings"])
        s["readings"].sort()
        s["final"] = s["final"] or final

    def uncounted(self, sampler_local: bool, sampled_pids: Iterable[int]) -> list[dict[str, Any]]:
        """The sources whose connections the sampler did not match itself."""
        here, pids = host_id(), set(sampled_pids)
        return [
            s
            for s in self.sources.values()
            if not (sampler_local and s["host"] == here and s["pid"] in pids)
        ]

    def add_to(self, samples: dict[str, Any] | None, sampler_local: bool) -> None:
        """Add the counts the sampler could not make to the server's ``client_conns``
        (in place). Before a process's first reading it held none (no plan yet), after the
        last of one that finished none (its load closed them); a tick inside its readings
        with none near, or after the last of one that never finished, is unknown (None):
        the net socket series leaves that tick out, never pairs it with another's."""
        server = (samples or {}).get("server")
        system = (samples or {}).get("system") or {}
        if not server:
            return
        sampled = [p["pid"] for p in system.get("loadgen_processes") or [] if p.get("pid")]
        extra = [s for s in self.uncounted(sampler_local, sampled) if s["readings"]]
        if not extra:
            return
        series = server.setdefault("series", {})
        t = list(series.get("t") or [])
        started = server.get("started_unix")
        base = list(series.get("client_conns") or [])
        if len(base) != len(t):
            base = [0] * len(t)  # the sampler matched none (no peers given)
        total: list[int | None] = [None if b is None else int(b) for b in base]
        for s in extra:
            times = [r[0] for r in s["readings"]]
            counts = on_ticks(times, [r[1] for r in s["readings"]], started, t, WITHIN_S)
            for i, ti in enumerate(t):
                if counts[i] is None and started is not None and ti is not None:
                    when = float(started) + float(ti)
                    if when < times[0] or (s["final"] and when > times[-1]):
                        counts[i] = 0
                a = total[i]
                total[i] = None if a is None or counts[i] is None else a + int(counts[i])
        series["client_conns"] = total
