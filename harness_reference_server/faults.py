"""What the test-only defect switches (``--fault NAME[:PARAM]``) do while the server runs.

Which faults exist, how each is spelled and parsed, its help and where its behaviour hooks
in: ``harness_reference_server/fault_catalog.py`` (each declared once, with what each defect is
for). ``FaultRuntime`` here is their stateful side: leaks per request, the stall thread,
per-batch output rewrites, the model-execution wrapper, the stall watchdog, the leaking
HTTP protocol and the reset breaker.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness_reference_server.fault_catalog import FaultSet

# reset-breaker: this many client resets within BREAKER_SPAN_S open the breaker
BREAKER_RESETS = 20
BREAKER_SPAN_S = 5.0

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("harness_reference_server.faults")


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
            print(
                f"!!! harness_reference_server: FAULT INJECTED: {name} !!!",
                file=sys.stderr,
                flush=True,
            )

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
