"""Test-only defect switches (``--fault NAME[:PARAM]``).

They exist so the harness's tests can prove each check catches its defect. Every fault
is logged loudly at start and listed in ``GET /v2`` under ``"faults"``. Rates are
parameters so a defect can be made as small as a real one (a few MB/min of leak, a
cross-wire in a few % of batches).

| fault | param (default) | effect |
|---|---|---|
| leak-memory | BYTES[,EVERY] (4096,1) | BYTES retained every EVERYth request: RSS grows with traffic |
| leak-threads | one parked thread every N requests (100) | thread count grows |
| leak-fds | one open fd every N requests (100) | fd count grows |
| no-batching | — | every batch holds one request |
| unbounded-queue | — | never sheds (no 503 on a full queue) |
| ignore-priority | — | all requests share one FIFO |
| cross-wire | probability per multi-request batch (0.05) | outputs swapped in a batch |
| slow-start | seconds of lazy init on the first request (5) | ready at once, no warmup |
| stall | PERIOD_S,HOLD_S (10,0.5) | a thread holds the GIL HOLD_S every PERIOD_S |
| late-leak | BYTES[,AFTER_S] (4096,30) | leak-memory, but only from AFTER_S after ready |
| stale-output | probability per request (0.02) | answers the previous batch's last output |
| error-rate | probability per request (0.05) | that request's model call fails: 500 |
| serialize | — | one process-wide lock around every model execution |
| slowdown | ms per minute since ready (20) | each batch sleeps uptime_min x MS_PER_MIN ms more |
| fifo-dispatch | — | priority queues admit per level, batches form in arrival order |
| backoff-batching | seconds per regained batch slot (1) | a queue overflow halves the batch cap |
| cold-errors | the first N inference requests (10) | answered 503 "model not loaded yet" |
| stall-trip | GAP_S (1) | an event-loop stall > GAP_S trips a degraded mode (one request per batch) for good |
| stall-abandon | GAP_S (1) | an event-loop stall > GAP_S restarts the batch queue, orphaning what was queued |
| stall-respawn | GAP_S (1) | an event-loop stall > GAP_S starts a new model-worker pool, the old one left running |
| no-drain | — | SIGTERM exits at once: accepted and in-flight requests are dropped |
| exit-hang | — | a non-daemon thread never stops: after SIGTERM's drain the process never exits |
| late-errors | AFTER_S[,P] (30,1) | from AFTER_S after ready, a request's model call fails with probability P: 500 |
| batch-errors | MIN_BATCH (2) | every request of a batch of MIN_BATCH or more requests answered 500 |

The last two differ in *shape* from the others, so the checks can be shown to catch
defects they were not tuned on. ``late-leak`` is a leak that only shows once a cache
fills: nothing is retained until AFTER_S seconds after the server became ready (on the
server's injected monotonic clock), then every request retains BYTES, as leak-memory
does. ``stale-output`` is a response cache keyed wrongly: with probability P a request
is answered with the outputs of the last request of the previously completed batch (a
mix-up *across* batches, where cross-wire mixes requests *within* one), under its own
id. Requests whose slot is empty or holds a different shape are answered normally. Its
RNG is seeded from ``--seed`` and drawn once per request, so a run is reproducible.

The last three give ``steady.error_rate``, ``linearity.efficiency`` and
``soak.latency_drift`` a defect each. ``error-rate`` fails single requests, not batches:
with probability P (its own RNG seeded from ``--seed``, one draw per request in batch
order) a request's output is replaced by a ``ModelFault`` exception, which the app answers
like any model exception (500, counted ``failed``/``model_error``), while the other
requests of the batch are answered normally. ``serialize`` is the classic "the model
object is not thread-safe, wrap it in a lock" fix: ``--workers N`` then buys nothing.
``slowdown`` is per-request work that grows with uptime (an ever-growing list scanned per
request): each batch sleeps (releasing the GIL, like the sim model) an extra
minutes-since-ready x MS_PER_MIN ms on the server's injected clock, so latency drifts up
over a soak while CPU stays flat.

The last two are the overload defects. ``fifo-dispatch`` is priority done halfway: each
level keeps its own bounded queue (so the high class is admitted while the low one is
shed), but batches are formed in arrival order across levels, so a high request waits
behind every queued low one — its latency, not its rejection rate, shows the bug (with a
deep queue, as Triton's unbounded default). ``backoff-batching`` is a batch-size
controller with the sign wrong for overload (AIMD keyed on queue overflow, the way
Clipper keys it on latency): a queue-full rejection halves the batch cap (at most every
100 ms, down to 1) and the cap regains one slot per GROW_S seconds. Smaller batches cost
more per request, so an overload that halves the cap lowers capacity below the load,
which overflows the queue again: a metastable collapse that outlives its trigger (a
spike, a CPU hog) for as long as the load stays above the small-batch capacity.

``cold-errors`` gives ``cold_start.first_error_rate`` its defect: a server whose readiness
endpoint says yes before the model can serve (readiness wired to the process, the model
loaded in the background), so its first N inference requests are refused 503 "model not
loaded yet" instead of being served or waited for. It is counted in requests, not
seconds, so the same requests fail however fast the box is.

The last five are the resilience defects (freeze, rolling shutdown). Both ``stall-*``
faults are an event-loop watchdog meant to protect against a hung model: a task ticks
every 100 ms on the server's clock, and a tick that comes more than GAP_S late (the
process was frozen: SIGSTOP, a VM pause, a long GC) is taken for a hang and "handled".
``stall-trip`` handles it like a circuit breaker that never resets: the batcher drops to
one request per batch for the rest of the process's life, so a server that met its load
by batching falls behind it after any stall. ``stall-abandon`` restarts the batch queue once
the batch running at the stall (taken for hung) returns: the requests queued by then —
the backlog the freeze built — are forgotten (their futures never resolved, their
deadline timers cancelled), so their clients wait until their own timeout and the
server's in-flight count never returns to zero. ``stall-respawn`` restarts the model
workers: a new thread pool replaces the old one, which is never shut down, so every stall
leaves its worker threads behind (idle, holding their stacks). ``no-drain`` is a server that treats
SIGTERM as SIGKILL (``os._exit(0)`` in the handler): the in-flight batch and every
accepted request are dropped with their connections. ``exit-hang`` is a background thread
(a metrics flusher) started non-daemon and never told to stop: the drain completes,
uvicorn returns, and the interpreter waits for the thread forever, so the process
outlives any drain timeout until something SIGKILLs it.

The last two are the network defects (the ``network`` scenario's fault proxy).
``reset-leak`` is per-connection bookkeeping cleaned up on the happy path only: every
client connection's socket is dup()ed when it is accepted (a TCP_INFO sampler for the
connection metrics) and the dup is closed when the connection ends with a FIN; a client
that resets its connection (ECONNRESET: ``connection_lost`` with an exception) takes the
error path, which forgets it, so each reset leaves one socket open for good. ``io-lock``
is a shared request decoder guarded by one process-wide lock that is taken *before* the
body is read instead of after: the lock is held across the wait for the client's bytes,
so one slow client (its body trickling in over a slow link) stalls every other request's
decode behind it, while the server's own queue and compute time stay as they were.
``reset-breaker`` is resilience middleware that counts a client's connection reset
(ECONNRESET) as a backend failure: 20 within 5 s open its circuit breaker, and for OPEN_S
(default 15 s) every inference is answered 503 — long after the network is back.

The last two fail requests in a shape a check meant for something else would miss.
``late-errors`` gives ``soak.error_rate`` its defect: a server that serves well, then stops
(a credential that expires, a pool to a dependency that runs dry, a disk that fills): from
AFTER_S after ready (on the server's injected clock, as ``late-leak``) each request's model
call fails with probability P (default 1: every one), answered 500 like ``error-rate``'s,
one draw per request from its own RNG seeded from ``--seed``. Its latency is the healthy
one, so only counting the failures sees it. ``batch-errors`` gives ``integrity.failures``
its defect: a batched code path that raises (a padding or concatenation bug) while batch 1
works, so every request of a batch of MIN_BATCH or more requests is answered 500 and the
golden outputs (fetched one request at a time) come back fine. The few answers that come,
from batches of one, are all correct: ``integrity.mismatches`` has nothing to see.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from reference_server.errors import ConfigError

# reset-breaker: this many client resets within BREAKER_SPAN_S open the breaker
BREAKER_RESETS = 20
BREAKER_SPAN_S = 5.0

if TYPE_CHECKING:
    import numpy as np

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
    "late-leak",
    "stale-output",
    "error-rate",
    "serialize",
    "slowdown",
    "fifo-dispatch",
    "backoff-batching",
    "cold-errors",
    "stall-trip",
    "stall-abandon",
    "stall-respawn",
    "no-drain",
    "exit-hang",
    "reset-leak",
    "io-lock",
    "reset-breaker",
    "late-errors",
    "batch-errors",
)

FAULT_HELP = (
    "test-only defect switch (repeatable), defaults after '=': leak-memory[:BYTES[,EVERY]=4096,1], "
    "leak-threads[:N=100], leak-fds[:N=100], no-batching, unbounded-queue, "
    "ignore-priority, cross-wire[:P=0.05], slow-start[:SECONDS=5], "
    "stall[:PERIOD_S,HOLD_S=10,0.5], late-leak[:BYTES[,AFTER_S]=4096,30] (leak only from "
    "AFTER_S after ready), stale-output[:P=0.02] (answer with the previous batch's "
    "output), error-rate[:P=0.05] (500 for that request), serialize (one lock around every "
    "model execution), slowdown[:MS_PER_MIN=20] (each batch slower by MS_PER_MIN ms per minute "
    "since ready), fifo-dispatch (priority at admission only), backoff-batching[:GROW_S=1] (a "
    "queue overflow halves the batch cap, regained one slot per GROW_S), cold-errors[:N=10] "
    "(the first N inference requests answered 503), stall-trip[:GAP_S=1] (a stall trips one "
    "request per batch for good), stall-abandon[:GAP_S=1] (a stall orphans the queued "
    "requests), stall-respawn[:GAP_S=1] (a stall starts a new worker pool, the old one "
    "left running), no-drain (SIGTERM exits at once), exit-hang (a non-daemon thread keeps the "
    "process alive after the drain), reset-leak (a socket leaked per client reset), io-lock "
    "(a global lock held across reading the request body), reset-breaker[:OPEN_S=15] (a circuit "
    "breaker tripped by client connection resets, answering 503 for OPEN_S), "
    "late-errors[:AFTER_S[,P]=30,1] (from AFTER_S after ready, 500 with probability P), "
    "batch-errors[:MIN_BATCH=2] (500 for every request of a batch of MIN_BATCH or more); "
    "details in "
    "reference_server/faults.py"
)


@dataclasses.dataclass(frozen=True)
class FaultSet:
    leak_memory_bytes: int | None = None
    leak_memory_every: int = 1  # retain once every N requests (a slow, realistic leak)
    leak_threads_every: int | None = None
    leak_fds_every: int | None = None
    no_batching: bool = False
    unbounded_queue: bool = False
    ignore_priority: bool = False
    cross_wire_p: float | None = None
    slow_start_s: float | None = None
    stall: tuple[float, float] | None = None  # (period_s, hold_s)
    late_leak: tuple[int, float] | None = None  # (bytes_per_request, after_s)
    stale_output_p: float | None = None
    error_rate_p: float | None = None
    serialize: bool = False
    slowdown_ms_per_min: float | None = None
    fifo_dispatch: bool = False
    backoff_batching_grow_s: float | None = None
    cold_errors: int | None = None  # the first N inference requests are refused 503
    stall_trip_gap_s: float | None = None  # a loop stall > GAP_S: one request per batch
    stall_abandon_gap_s: float | None = None  # a loop stall > GAP_S: queued requests orphaned
    stall_respawn_gap_s: float | None = None  # a loop stall > GAP_S: a new worker pool
    no_drain: bool = False  # SIGTERM exits at once
    exit_hang: bool = False  # a non-daemon thread keeps the process alive after the drain
    reset_leak: bool = False  # one socket leaked per client connection reset
    io_lock: bool = False  # one lock held across reading every request body
    reset_breaker_open_s: float | None = None  # resets trip a breaker open for OPEN_S
    late_errors: tuple[float, float] | None = None  # (after_s, p): 500s from AFTER_S on
    batch_errors_min: int | None = None  # batches of this many requests or more: 500

    def names(self) -> list[str]:
        """Canonical ``NAME[:PARAM]`` strings of the active faults (in field order)."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None or v is False or f.name == "leak_memory_every":
                continue
            name = _FAULT_OF_FIELD.get(f.name, f.name.replace("_", "-"))
            if v is True:
                out.append(name)
                continue
            values = list(v) if isinstance(v, tuple) else [v]
            if f.name == "leak_memory_bytes" and self.leak_memory_every != 1:
                values.append(self.leak_memory_every)
            out.append(
                f"{name}:" + ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in values)
            )
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
    # NaN passes every comparison and inf is no rate or duration: reject both.
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        raise _bad(spec, what)
    return value


# Faults with one number: name → (FaultSet field, default, type, min, max, what is valid).
_ONE_NUMBER: dict[str, tuple[str, str, type, float, float | None, str]] = {
    "leak-threads": ("leak_threads_every", "100", int, 1, None, "EVERY_N_REQUESTS, N >= 1"),
    "leak-fds": ("leak_fds_every", "100", int, 1, None, "EVERY_N_REQUESTS, N >= 1"),
    "cross-wire": ("cross_wire_p", "0.05", float, 0.0, 1.0, "P with 0 <= P <= 1"),
    "slow-start": ("slow_start_s", "5", float, 0.0, None, "SECONDS >= 0"),
    "stale-output": ("stale_output_p", "0.02", float, 0.0, 1.0, "P with 0 <= P <= 1"),
    "error-rate": ("error_rate_p", "0.05", float, 0.0, 1.0, "P with 0 <= P <= 1"),
    "slowdown": ("slowdown_ms_per_min", "20", float, 0.0, None, "MS_PER_MIN with MS_PER_MIN >= 0"),
    "cold-errors": ("cold_errors", "10", int, 1, None, "N_REQUESTS, N >= 1"),
    "stall-trip": ("stall_trip_gap_s", "1", float, 0.2, None, "GAP_S with GAP_S >= 0.2"),
    "reset-breaker": ("reset_breaker_open_s", "15", float, 0.1, None, "OPEN_S with OPEN_S >= 0.1"),
    "batch-errors": ("batch_errors_min", "2", int, 2, None, "MIN_BATCH, MIN_BATCH >= 2"),
    "stall-abandon": ("stall_abandon_gap_s", "1", float, 0.2, None, "GAP_S with GAP_S >= 0.2"),
    "stall-respawn": ("stall_respawn_gap_s", "1", float, 0.2, None, "GAP_S with GAP_S >= 0.2"),
    "backoff-batching": (
        "backoff_batching_grow_s",
        "1",
        float,
        0.001,
        None,
        "GROW_S with GROW_S > 0",
    ),
}


# FaultSet field → fault name where they differ by more than "_" → "-".
_FAULT_OF_FIELD = {
    **{field: name for name, (field, *_) in _ONE_NUMBER.items()},
    "leak_memory_bytes": "leak-memory",
}


def _pair(
    spec: str, param: str, defaults: tuple[str, str | None], kinds: tuple[type, type], what: str
) -> tuple[float, float]:
    """``A[,B]`` (``A,B`` when B has no default) → two numbers ≥ the first's minimum."""
    parts = param.split(",") if param else [defaults[0]]
    if len(parts) == 1 and defaults[1] is not None:
        parts.append(defaults[1])
    if len(parts) != 2:
        raise _bad(spec, what)
    lo = 1 if kinds[0] is int else 0.0
    return _num(spec, parts[0], kinds[0], lo, None, what), _num(
        spec, parts[1], kinds[1], 1 if kinds[1] is int else 0.0, None, what
    )


def parse_faults(specs: Iterable[str]) -> FaultSet:
    """Parse repeated ``--fault NAME[:PARAM]`` values into a FaultSet."""
    kw: dict[str, object] = {}
    for spec in specs:
        name, _, param = spec.partition(":")
        if name not in FAULT_NAMES:
            raise _bad(spec, f"NAME[:PARAM] with NAME one of {', '.join(FAULT_NAMES)}")
        if name in _ONE_NUMBER:
            field, default, kind, lo, hi, what = _ONE_NUMBER[name]
            value = _num(spec, param or default, kind, lo, hi, f"{name}:{what}")
            kw[field] = int(value) if kind is int else value
        elif name == "leak-memory":
            what = "leak-memory:BYTES_PER_REQUEST[,EVERY_N_REQUESTS] with BYTES >= 1, N >= 1"
            nbytes, every = _pair(spec, param, ("4096", "1"), (int, int), what)
            kw["leak_memory_bytes"], kw["leak_memory_every"] = int(nbytes), int(every)
        elif name == "late-leak":
            what = "late-leak:BYTES_PER_REQUEST[,AFTER_S] with BYTES >= 1 and AFTER_S >= 0"
            nbytes, after = _pair(spec, param, ("4096", "30"), (int, float), what)
            kw["late_leak"] = (int(nbytes), after)
        elif name == "late-errors":
            what = "late-errors:AFTER_S[,P] with AFTER_S >= 0 and 0 <= P <= 1"
            after, p = _pair(spec, param, ("30", "1"), (float, float), what)
            if p > 1:
                raise _bad(spec, what)
            kw["late_errors"] = (after, p)
        elif name == "stall":
            what = "stall:PERIOD_S,HOLD_S with 0 < HOLD_S < PERIOD_S"
            period, hold = _pair(spec, param or "10,0.5", ("10", None), (float, float), what)
            if not 0 < hold < period:
                raise _bad(spec, what)
            kw["stall"] = (period, hold)
        else:
            if param:
                raise _bad(spec, f"{name} without a parameter")
            kw[name.replace("-", "_")] = True
    return FaultSet(**kw)  # type: ignore[arg-type]


class ModelFault(Exception):
    """error-rate, late-errors, batch-errors: the model failed for this request (a planted
    defect)."""


class FaultRuntime:
    """The stateful side of the faults: leaks per request, the stall thread, per-request
    output rewrites (stale-output, error-rate) and the model-execution wrapper
    (serialize, slowdown).

    ``clock`` times the stall's spin; ``now`` is the server's own clock, on which
    ``late-leak`` and ``slowdown`` measure the time since ready; ``sleep`` spends the
    slowdown. ``seed`` is ``--seed``.
    """

    def __init__(
        self,
        faults: FaultSet,
        clock: Callable[[], float] = time.perf_counter,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        seed: int = 0,
    ) -> None:
        self.faults = faults
        self._clock = clock
        self._now = now
        self._sleep = sleep
        self._ready_at: float | None = None
        self._late_leaking = False
        # A string seed is hashed deterministically (not by PYTHONHASHSEED) and keeps
        # this stream independent of the batcher's cross-wire RNG seeded with the int.
        self._stale_rng = random.Random(f"stale-output:{seed}")
        self._last_output: np.ndarray | None = None
        self.stale_answers = 0
        self._error_rng = random.Random(f"error-rate:{seed}")
        self._late_error_rng = random.Random(f"late-errors:{seed}")
        self._late_erring = False
        self.failed_answers = 0
        # serialize: one lock for every model worker of the process (the defect).
        self._model_lock = threading.Lock()
        self.cold_refused = 0  # cold-errors: requests refused so far
        self.slowdown_s = 0.0  # total extra time slept by slowdown
        self.retained_bytes = 0  # by leak-memory and late-leak
        self._lock = threading.Lock()
        self._requests = 0
        # Deliberately retained forever: that is the defect.
        self._leaked_blocks: list[bytes] = []
        self._leaked_fds: list[int] = []
        self._leaked_threads: list[threading.Thread] = []
        self._park = threading.Event()  # never set: parked threads wait forever
        self._stop = threading.Event()
        self.reset_leaked = 0  # reset-leak: sockets forgotten so far
        self._resets: collections.deque[float] = collections.deque()  # reset-breaker
        self.breaker_until = 0.0  # reset-breaker: open (503) until this time (self.now)
        self.breaker_trips = 0
        self._io_lock: asyncio.Lock | None = None
        self._stall_thread: threading.Thread | None = None
        self.tripped = False  # stall-trip: the degraded mode is on
        self.abandoned = 0  # stall-abandon: queue restarts asked for
        self.respawns = 0  # stall-respawn: worker pools started (and left running)
        self._hang_thread: threading.Thread | None = None  # exit-hang
        self.stalls = 0

    def announce(self) -> None:
        for name in self.faults.names():
            log.warning(
                "FAULT INJECTED: --fault %s (test-only defect, do not use in production)", name
            )
            print(f"!!! reference_server: FAULT INJECTED: {name} !!!", file=sys.stderr, flush=True)

    def mark_ready(self) -> None:
        """The server became ready; late-leak counts from the first time only."""
        if self._ready_at is None:
            self._ready_at = self._now()

    def _late_leak_due(self, after_s: float) -> bool:
        if self._late_leaking:
            return True
        if self._ready_at is None or self._now() - self._ready_at < after_s:
            return False
        self._late_leaking = True
        log.warning("FAULT late-leak: retaining memory from now on (%.1f s after ready)", after_s)
        return True

    def refuse_cold(self) -> bool:
        """cold-errors: True for each of the first N inference requests (refuse it)."""
        n = self.faults.cold_errors
        if n is None or self.cold_refused >= n:
            return False
        with self._lock:
            if self.cold_refused >= n:
                return False
            self.cold_refused += 1
            return True

    def on_request(self) -> None:
        """Called once per accepted inference request (on the event loop)."""
        f = self.faults
        if f.late_leak is not None and self._late_leak_due(f.late_leak[1]):
            # Same retention as leak-memory: non-zero bytes so the pages count in RSS.
            self._leaked_blocks.append(b"\x5a" * f.late_leak[0])
            self.retained_bytes += f.late_leak[0]
        if (
            f.leak_memory_bytes is None
            and f.leak_threads_every is None
            and f.leak_fds_every is None
        ):
            return
        with self._lock:
            self._requests += 1
            n = self._requests
        if f.leak_memory_bytes is not None and n % f.leak_memory_every == 0:
            # Non-zero bytes so the pages are really touched and count in RSS.
            self._leaked_blocks.append(b"\x5a" * f.leak_memory_bytes)
            self.retained_bytes += f.leak_memory_bytes
        if f.leak_threads_every is not None and n % f.leak_threads_every == 0:
            t = threading.Thread(target=self._park.wait, name=f"leaked-{n}", daemon=True)
            t.start()
            self._leaked_threads.append(t)
        if f.leak_fds_every is not None and n % f.leak_fds_every == 0:
            self._leaked_fds.append(os.open(os.devnull, os.O_RDONLY))

    def _late_errors_due(self, after_s: float) -> bool:
        if self._late_erring:
            return True
        if self._ready_at is None or self._now() - self._ready_at < after_s:
            return False
        self._late_erring = True
        log.warning("FAULT late-errors: failing requests from now on (%.1f s after ready)", after_s)
        return True

    @property
    def rewrites_outputs(self) -> bool:
        """Whether ``after_batch`` has anything to do (the batcher skips it otherwise)."""
        f = self.faults
        return any(
            x is not None
            for x in (f.stale_output_p, f.error_rate_p, f.late_errors, f.batch_errors_min)
        )

    def after_batch(self, outputs: list[np.ndarray | Exception]) -> None:
        """Called with each completed batch's per-request outputs (in order, on the event
        loop); replaces some of them in place before they are answered: with an earlier
        batch's output (stale-output) or with a ModelFault to answer instead (error-rate,
        late-errors, batch-errors)."""
        if not outputs:
            return
        if self.faults.stale_output_p is not None:
            self._stale(self.faults.stale_output_p, outputs)
        p = self.faults.error_rate_p
        if p is not None:
            for i in range(len(outputs)):
                # One draw per request: the pattern depends only on the seed and the order.
                if self._error_rng.random() < p:
                    outputs[i] = ModelFault(
                        f"injected fault error-rate:{p:g} failed request {i + 1} "
                        f"of a batch of {len(outputs)}"
                    )
                    self.failed_answers += 1
        late = self.faults.late_errors
        if late is not None and self._late_errors_due(late[0]):
            for i in range(len(outputs)):
                # one draw per request (none at P = 1): reproducible from the seed
                if late[1] >= 1.0 or self._late_error_rng.random() < late[1]:
                    outputs[i] = ModelFault(
                        f"injected fault late-errors:{late[0]:g},{late[1]:g} failed request "
                        f"{i + 1} of a batch of {len(outputs)}"
                    )
                    self.failed_answers += 1
        least = self.faults.batch_errors_min
        if least is not None and len(outputs) >= least:
            for i in range(len(outputs)):
                outputs[i] = ModelFault(
                    f"injected fault batch-errors:{least} failed a batch of {len(outputs)} requests"
                )
                self.failed_answers += 1

    def _stale(self, p: float, outputs: list[np.ndarray | Exception]) -> None:
        # The slot is refreshed only once a whole batch is done, so it always holds a
        # request of another (earlier) batch, never one of this batch.
        previous = self._last_output
        last = outputs[-1]
        assert not isinstance(last, Exception)  # stale-output runs before error-rate
        self._last_output = last.copy()
        for i, out in enumerate(outputs):
            # One draw per request whatever the slot holds: the pattern depends only on
            # the seed and the request order, so a run is reproducible.
            if (
                self._stale_rng.random() < p
                and previous is not None
                and not isinstance(out, Exception)
                and previous.shape == out.shape
            ):
                outputs[i] = previous
                self.stale_answers += 1

    def wrap_run(
        self, run: Callable[[np.ndarray], np.ndarray]
    ) -> Callable[[np.ndarray], np.ndarray]:
        """The model's batch call as the batcher's workers should make it: ``run`` itself
        unless serialize or slowdown is on."""
        f = self.faults
        if not f.serialize and f.slowdown_ms_per_min is None:
            return run

        def execute(x: np.ndarray) -> np.ndarray:
            if f.slowdown_ms_per_min is not None:
                extra = self.slowdown_delay_s()
                if extra > 0:
                    self._sleep(extra)  # sleeping releases the GIL: latency, not CPU
                    self.slowdown_s += extra
            return run(x)

        if not f.serialize:
            return execute

        def serialized(x: np.ndarray) -> np.ndarray:
            with self._model_lock:
                return execute(x)

        return serialized

    def slowdown_delay_s(self) -> float:
        """slowdown's extra time for a batch starting now: minutes since ready x MS_PER_MIN."""
        per_min = self.faults.slowdown_ms_per_min
        if per_min is None or self._ready_at is None:
            return 0.0
        uptime_min = max(0.0, self._now() - self._ready_at) / 60.0
        return uptime_min * per_min / 1000.0

    def start(self) -> None:
        if self.faults.stall is not None and self._stall_thread is None:
            self._stall_thread = threading.Thread(
                target=self._stall_loop, name="fault-stall", daemon=True
            )
            self._stall_thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def watches_stalls(self) -> bool:
        """Whether a stall-* fault wants the event-loop watchdog (``watch_stalls``)."""
        f = self.faults
        return any(
            g is not None
            for g in (f.stall_trip_gap_s, f.stall_abandon_gap_s, f.stall_respawn_gap_s)
        )

    async def watch_stalls(
        self,
        trip: Callable[[], None],
        abandon: Callable[[], None],
        respawn: Callable[[], None],
        tick_s: float = 0.1,
    ) -> None:
        """stall-trip / -abandon / -respawn: the watchdog task (on the event loop, until
        cancelled). A tick later than GAP_S is "handled" by ``trip()`` (one request per
        batch from now on), ``abandon()`` (restart the queue once the running batch returns)
        or ``respawn()`` (a new worker pool, the old one left running)."""
        import asyncio

        f = self.faults
        last = self._now()
        while True:
            await asyncio.sleep(tick_s)
            now = self._now()
            gap, last = now - last - tick_s, now
            if f.stall_trip_gap_s is not None and gap > f.stall_trip_gap_s and not self.tripped:
                self.tripped = True
                trip()
                log.warning("FAULT stall-trip: a %.1f s stall tripped one request per batch", gap)
            if f.stall_abandon_gap_s is not None and gap > f.stall_abandon_gap_s:
                abandon()
                self.abandoned += 1
                log.warning("FAULT stall-abandon: a %.1f s stall: the queue will restart", gap)
            if f.stall_respawn_gap_s is not None and gap > f.stall_respawn_gap_s:
                respawn()
                self.respawns += 1
                log.warning("FAULT stall-respawn: a %.1f s stall started a new worker pool", gap)

    def start_exit_hang(self) -> None:
        """exit-hang: a "metrics flusher" started non-daemon and never stopped (the
        interpreter waits for it at exit)."""
        if self.faults.exit_hang and self._hang_thread is None:

            def flush_forever() -> None:
                while True:
                    time.sleep(1.0)

            self._hang_thread = threading.Thread(
                target=flush_forever, name="metrics-flusher", daemon=False
            )
            self._hang_thread.start()

    def http_protocol(self, base: type) -> type:
        """reset-leak, reset-breaker: uvicorn's HTTP protocol class with the leaking
        per-connection bookkeeping / the breaker that counts resets (``base`` unchanged
        without them)."""
        if not (self.faults.reset_leak or self.faults.reset_breaker_open_s):
            return base
        runtime = self
        leak = self.faults.reset_leak

        class ResetLeakProtocol(base):  # type: ignore[valid-type, misc]
            def connection_made(self, transport):  # type: ignore[no-untyped-def]
                sock = transport.get_extra_info("socket")
                self._info_fd = os.dup(sock.fileno()) if sock is not None and leak else None
                super().connection_made(transport)

            def connection_lost(self, exc):  # type: ignore[no-untyped-def]
                if exc is not None:
                    runtime.on_reset()
                fd, self._info_fd = self._info_fd, None
                if fd is not None:
                    if exc is None:
                        os.close(fd)  # the happy path closes it ...
                    else:
                        runtime._leaked_fds.append(fd)  # ... the reset path forgets it
                        runtime.reset_leaked += 1
                super().connection_lost(exc)

        return ResetLeakProtocol

    def on_reset(self) -> None:
        """reset-breaker: a client connection ended in an error (ECONNRESET). The breaker
        takes it for a backend failure: BREAKER_RESETS of them within BREAKER_SPAN_S open it
        for OPEN_S, every inference answered 503 meanwhile."""
        open_s = self.faults.reset_breaker_open_s
        if open_s is None:
            return
        now = self._now()
        self._resets.append(now)
        while self._resets and self._resets[0] < now - BREAKER_SPAN_S:
            self._resets.popleft()
        if len(self._resets) >= BREAKER_RESETS:
            if now >= self.breaker_until:
                self.breaker_trips += 1
            self.breaker_until = now + open_s
            self._resets.clear()

    def breaker_open(self) -> bool:
        """reset-breaker: refuse this request (503) — the breaker is open."""
        return self.faults.reset_breaker_open_s is not None and self._now() < self.breaker_until

    def io_lock(self) -> asyncio.Lock | None:
        """io-lock: the one lock every request holds while its body is read (None
        without the fault). Created on the server's event loop at first use."""
        if not self.faults.io_lock:
            return None
        if self._io_lock is None:
            self._io_lock = asyncio.Lock()
        return self._io_lock

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
