"""The CPU of Locust workers the sampler cannot see, from their own heartbeats.

The sampler measures the generator's processes on its host: the master's process tree
(``--processes`` children included). A worker started on its own — on another host, or
beside the master by hand — is in nobody's tree, so a saturated worker would send late
while the run's saturation rule looked only at an idle master: a PASS on load that was
never offered as planned. Every Locust worker reports its own CPU (psutil's
``cpu_percent`` of its process, % of one core) and RSS in the heartbeat it sends the
master each second; the master keeps them on ``runner.clients``. ``WorkerCpu`` reads them
once a second and, when the run ends, adds one ``system.loadgen_processes`` entry per
worker on the sampler's tick grid, so the per-process saturation rule judges remote
workers as it judges local ones.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from typing import Any

# a heartbeat reading stands for a tick within this many seconds of it (heartbeats come
# every second; a worker that stopped sending leaves its ticks empty, never carried on)
ALIGN_S = 1.0


def on_ticks(
    times: Sequence[float],
    values: Sequence[Any],
    started_unix: float | None,
    t: Sequence[float | None],
    within_s: float = ALIGN_S,
) -> list[Any]:
    """``values`` (read at unix ``times``, ascending) on a sampler's ticks ``t`` (seconds
    from ``started_unix``): per tick the reading nearest it, None when none is within
    ``within_s`` (a process that stopped reporting leaves its ticks empty, never carried on)."""
    out: list[Any] = [None] * len(t)
    if started_unix is None or not times:
        return out
    for i, ti in enumerate(t):
        if ti is None:
            continue
        when = float(started_unix) + float(ti)
        j = bisect.bisect_left(times, when)
        near = [k for k in (j - 1, j) if 0 <= k < len(times)]
        k = min(near, key=lambda n: abs(times[n] - when))
        if abs(times[k] - when) <= within_s:
            out[i] = values[k]
    return out


class WorkerCpu:
    """Heartbeat CPU/RSS per worker, read from a ``MasterRunner``'s ``clients``."""

    def __init__(self, runner: Any, clock: Callable[[], float] = time.time) -> None:
        self.runner = runner
        self.clock = clock
        self.readings: dict[str, list[tuple[float, float, int | None]]] = {}

    def poll(self) -> None:
        now = self.clock()
        for wid, node in list(getattr(self.runner, "clients", {}).items()):
            cpu = getattr(node, "cpu_usage", None)
            if cpu is None:
                continue
            mem = getattr(node, "memory_usage", None)
            self.readings.setdefault(str(wid), []).append(
                (now, float(cpu), int(mem) if mem else None)
            )

    def run(self, sleep: Callable[[float], Any], every_s: float = 1.0) -> None:
        """Poll until killed (a greenlet of the run)."""
        while True:
            sleep(every_s)
            self.poll()

    def entries(self, system: dict[str, Any]) -> list[dict[str, Any]]:
        """One ``loadgen_processes`` entry per worker, aligned with ``system``'s ticks by
        wall clock (``started_unix + t``); ticks without a heartbeat near them are None."""
        t = list((system.get("series") or {}).get("t") or [])
        out = []
        for wid, rows in sorted(self.readings.items()):
            at = on_ticks(
                [r[0] for r in rows], list(range(len(rows))), system.get("started_unix"), t
            )
            cpu = [None if k is None else rows[k][1] for k in at]
            rss = [None if k is None else rows[k][2] for k in at]
            if any(v is not None for v in cpu):
                out.append(
                    {
                        "pid": None,
                        "name": f"worker {wid} (its heartbeats)",
                        "worker": wid,
                        "cpu_pct": cpu,
                        "rss_bytes": rss,
                    }
                )
        return out

    def add_to(self, samples: dict[str, Any] | None) -> None:
        """Add the workers' entries to the sampler's record (in place)."""
        system = (samples or {}).get("system")
        if not system:
            return
        system["loadgen_processes"] = [
            *(system.get("loadgen_processes") or []),
            *self.entries(system),
        ]
