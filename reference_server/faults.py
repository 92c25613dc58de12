"""Test-only defect switches (``--fault NAME[:PARAM]``).

They exist so the harness's tests can prove each check catches its defect. Every fault
is logged loudly at start and listed in ``GET /v2`` under ``"faults"``. Rates are
parameters so a defect can be made as small as a real one (a few MB/min of leak, a
cross-wire in a few % of batches).

| fault | param (default) | effect |
|---|---|---|
| leak-memory | bytes retained per request (4096) | RSS grows with traffic |
| leak-threads | one parked thread every N requests (100) | thread count grows |
| leak-fds | one open fd every N requests (100) | fd count grows |
| no-batching | — | every batch holds one request |
| unbounded-queue | — | never sheds (no 503 on a full queue) |
| ignore-priority | — | all requests share one FIFO |
| cross-wire | probability per multi-request batch (0.05) | outputs swapped in a batch |
| slow-start | seconds of lazy init on the first request (5) | ready at once, no warmup |
| stall | PERIOD_S,HOLD_S (10,0.5) | a thread holds the GIL HOLD_S every PERIOD_S |
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable

from reference_server.errors import ConfigError

log = logging.getLogger("reference_server.faults")

FAULT_NAMES = (
    "leak-memory",
    "leak-threads",
    "leak-fds",
    "no-batching",
    "unbounded-queue",
    "ignore-priority",
    "cross-wire",
    "slow-start",
    "stall",
)


@dataclasses.dataclass(frozen=True)
class FaultSet:
    leak_memory_bytes: int | None = None
    leak_threads_every: int | None = None
    leak_fds_every: int | None = None
    no_batching: bool = False
    unbounded_queue: bool = False
    ignore_priority: bool = False
    cross_wire_p: float | None = None
    slow_start_s: float | None = None
    stall: tuple[float, float] | None = None  # (period_s, hold_s)

    def names(self) -> list[str]:
        """Canonical ``NAME[:PARAM]`` strings of the active faults."""
        out = []
        if self.leak_memory_bytes is not None:
            out.append(f"leak-memory:{self.leak_memory_bytes}")
        if self.leak_threads_every is not None:
            out.append(f"leak-threads:{self.leak_threads_every}")
        if self.leak_fds_every is not None:
            out.append(f"leak-fds:{self.leak_fds_every}")
        if self.no_batching:
            out.append("no-batching")
        if self.unbounded_queue:
            out.append("unbounded-queue")
        if self.ignore_priority:
            out.append("ignore-priority")
        if self.cross_wire_p is not None:
            out.append(f"cross-wire:{self.cross_wire_p:g}")
        if self.slow_start_s is not None:
            out.append(f"slow-start:{self.slow_start_s:g}")
        if self.stall is not None:
            out.append(f"stall:{self.stall[0]:g},{self.stall[1]:g}")
        return out

    def __bool__(self) -> bool:
        return bool(self.names())


def _bad(spec: str, expected: str) -> ConfigError:
    return ConfigError(f"--fault has value {spec!r}. Expected {expected}.")


def _num(spec: str, param: str, kind: type, lo: float, hi: float | None, what: str) -> float:
    try:
        value = kind(param)
    except ValueError:
        raise _bad(spec, what) from None
    if value < lo or (hi is not None and value > hi):
        raise _bad(spec, what)
    return value


def parse_faults(specs: Iterable[str]) -> FaultSet:
    """Parse repeated ``--fault NAME[:PARAM]`` values into a FaultSet."""
    kw: dict[str, object] = {}
    for spec in specs:
        name, _, param = spec.partition(":")
        if name not in FAULT_NAMES:
            raise _bad(spec, f"NAME[:PARAM] with NAME one of {', '.join(FAULT_NAMES)}")
        if name == "leak-memory":
            kw["leak_memory_bytes"] = int(
                _num(
                    spec, param or "4096", int, 1, None, "leak-memory:BYTES_PER_REQUEST, BYTES >= 1"
                )
            )
        elif name == "leak-threads":
            kw["leak_threads_every"] = int(
                _num(spec, param or "100", int, 1, None, "leak-threads:EVERY_N_REQUESTS, N >= 1")
            )
        elif name == "leak-fds":
            kw["leak_fds_every"] = int(
                _num(spec, param or "100", int, 1, None, "leak-fds:EVERY_N_REQUESTS, N >= 1")
            )
        elif name == "cross-wire":
            kw["cross_wire_p"] = _num(
                spec, param or "0.05", float, 0.0, 1.0, "cross-wire:P with 0 <= P <= 1"
            )
        elif name == "slow-start":
            kw["slow_start_s"] = _num(
                spec, param or "5", float, 0.0, None, "slow-start:SECONDS >= 0"
            )
        elif name == "stall":
            parts = (param or "10,0.5").split(",")
            what = "stall:PERIOD_S,HOLD_S with 0 < HOLD_S < PERIOD_S"
            if len(parts) != 2:
                raise _bad(spec, what)
            period = _num(spec, parts[0], float, 0.0, None, what)
            hold = _num(spec, parts[1], float, 0.0, None, what)
            if not 0 < hold < period:
                raise _bad(spec, what)
            kw["stall"] = (period, hold)
        else:
            if param:
                raise _bad(spec, f"{name} without a parameter")
            kw[name.replace("-", "_")] = True
    return FaultSet(**kw)  # type: ignore[arg-type]


class FaultRuntime:
    """The stateful side of the faults: leaks per request and the stall thread."""

    def __init__(self, faults: FaultSet, clock: Callable[[], float] = time.perf_counter) -> None:
        self.faults = faults
        self._clock = clock
        self._lock = threading.Lock()
        self._requests = 0
        # Deliberately retained forever: that is the defect.
        self._leaked_blocks: list[bytes] = []
        self._leaked_fds: list[int] = []
        self._leaked_threads: list[threading.Thread] = []
        self._park = threading.Event()  # never set: parked threads wait forever
        self._stop = threading.Event()
        self._stall_thread: threading.Thread | None = None
        self.stalls = 0

    def announce(self) -> None:
        for name in self.faults.names():
            log.warning(
                "FAULT INJECTED: --fault %s (test-only defect, do not use in production)", name
            )
            print(f"!!! reference_server: FAULT INJECTED: {name} !!!", file=sys.stderr, flush=True)

    def on_request(self) -> None:
        """Called once per accepted inference request (on the event loop)."""
        f = self.faults
        if (
            f.leak_memory_bytes is None
            and f.leak_threads_every is None
            and f.leak_fds_every is None
        ):
            return
        with self._lock:
            self._requests += 1
            n = self._requests
        if f.leak_memory_bytes is not None:
            # Non-zero bytes so the pages are really touched and count in RSS.
            self._leaked_blocks.append(b"\x5a" * f.leak_memory_bytes)
        if f.leak_threads_every is not None and n % f.leak_threads_every == 0:
            t = threading.Thread(target=self._park.wait, name=f"leaked-{n}", daemon=True)
            t.start()
            self._leaked_threads.append(t)
        if f.leak_fds_every is not None and n % f.leak_fds_every == 0:
            self._leaked_fds.append(os.open(os.devnull, os.O_RDONLY))

    def start(self) -> None:
        if self.faults.stall is not None and self._stall_thread is None:
            self._stall_thread = threading.Thread(
                target=self._stall_loop, name="fault-stall", daemon=True
            )
            self._stall_thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _stall_loop(self) -> None:
        assert self.faults.stall is not None
        period, hold = self.faults.stall
        while not self._stop.wait(period - hold):
            self._hold_gil(hold)
            self.stalls += 1

    def _hold_gil(self, hold: float) -> None:
        # A pure-Python spin alone would be preempted every 5 ms (the switch interval);
        # raising the interval for the duration makes the spin keep the GIL, which is
        # what a long C call that never releases the GIL does to a real server.
        old = sys.getswitchinterval()
        sys.setswitchinterval(hold + 0.05)
        try:
            end = self._clock() + hold
            while self._clock() < end:
                pass
        finally:
            sys.setswitchinterval(old)
