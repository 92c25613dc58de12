"""Dynamic batcher: per-priority bounded queues, max batch / max delay, deadlines, workers.

It knows nothing about HTTP. ``BatchQueue`` (batch_queue.py) is the pure part (explicit
``now``, testable with literal times); ``Batcher`` drives it on an asyncio loop with an injected clock and
runs batches on N model-worker threads so the event loop keeps serving while they compute.

When a batch goes (``Batcher._wait_s``), checked on every arrival, every finished batch
and when a wait runs out:

* no model worker free, or nothing queued: nothing goes; queued requests keep joining
  the batch that will go when a worker frees (as Triton's payload grows while it waits
  for a model instance);
* a full batch (``max_batch_size`` rows, or the backoff-batching cap), or one request
  per batch (no-batching, stall-trip): it goes at once;
* **nobody else is expected**: the requests held now, queued plus computing, are at
  least as many as the most the server held at once during the previous dispatch cycle
  (dispatch to dispatch). The partial batch goes at once: a lone request at low load, or
  the last of C closed-loop clients, never waits for company that is not coming;
* otherwise the batch is held open for company, at most ``max_delay_s`` counted from
  when it could first have run (the later of its oldest request's arrival and the moment
  a worker became free), then goes with what it has.

So a batch waits only while the recent load says more requests are on their way: at
low load a request costs what it costs without batching, under load batches fill as
with a fixed delay. The previous cycle's peak follows the load within two dispatches,
up or down. Triton's dynamic batcher holds every partial batch for
``max_queue_delay_microseconds`` when that is set, and never holds one at its default of
0; this rule holds one only while company is expected.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from harness_reference_server.batch_queue import (
    BatchQueue,
    DeadlineExpired,
    Pending,
    QueueFull,
    ServerExiting,
)
from harness_reference_server.stats import ModelStats


class BatchObserver(Protocol):
    def on_queue_depth(self, level: int, depth: int) -> None: ...
    def on_batch(self, n_requests: int, n_rows: int, queue_waits: list[float]) -> None: ...
    def on_compute(self, n_rows: int, seconds: float, ok: bool) -> None: ...
    def on_expired(self, n: int) -> None: ...


class NullObserver:
    def on_queue_depth(self, level: int, depth: int) -> None:
        pass

    def on_batch(self, n_requests: int, n_rows: int, queue_waits: list[float]) -> None:
        pass

    def on_compute(self, n_rows: int, seconds: float, ok: bool) -> None:
        pass

    def on_expired(self, n: int) -> None:
        pass


def _name_os_thread() -> None:
    """Give the OS thread its Python name, so `pidstat -t` and `top -H` show model-worker_N."""
    name = threading.current_thread().name.encode()[:15]  # the kernel keeps 15 bytes
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


@dataclasses.dataclass(frozen=True)
class BatcherConfig:
    max_batch_size: int = 32
    max_delay_s: float = 0.005
    levels: int = 2
    capacity: int = 128
    workers: int = 1
    bounded: bool = True
    one_request_per_batch: bool = False  # fault no-batching
    single_level: bool = False  # fault ignore-priority
    cross_wire_p: float = 0.0  # fault cross-wire
    fifo_dispatch: bool = False  # fault fifo-dispatch
    backoff_grow_s: float | None = None  # fault backoff-batching
    seed: int = 0


class BatchCap:
    """Fault backoff-batching: the batch-size cap of a controller that backs off on
    queue overflow. ``overflow`` halves it (at most once per ``cooldown_s``, never below
    1); it regains one slot per ``grow_s`` seconds since the last cut, up to ``limit``."""

    def __init__(self, limit: int, grow_s: float, cooldown_s: float = 0.1) -> None:
        self.limit = limit
        self.grow_s = grow_s
        self.cooldown_s = cooldown_s
        self._base = limit
        self._anchor = float("-inf")
        self.cuts = 0

    def value(self, now: float) -> int:
        grown = (now - self._anchor) / self.grow_s
        return self.limit if grown >= self.limit else min(self.limit, self._base + int(grown))

    def overflow(self, now: float) -> None:
        if now - self._anchor < self.cooldown_s:
            return
        self._base = max(1, self.value(now) // 2)
        self._anchor = now
        self.cuts += 1


class Batcher:
    """Asyncio driver of a BatchQueue; ``run`` is called on worker threads."""

    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray],
        config: BatcherConfig,
        clock: Callable[[], float] = time.monotonic,
        observer: BatchObserver | None = None,
        after_batch: Callable[[list[np.ndarray | Exception]], None] | None = None,
        stats: ModelStats | None = None,
    ) -> None:
        self._run = run
        self.stats = stats  # the statistics extension's counters (GET .../stats)
        # Fault hook (stale-output, error-rate): may replace per-request outputs, or put
        # an exception to answer instead, before they are answered.
        self._after_batch = after_batch
        self.config = config
        self._clock = clock
        self._obs: BatchObserver = observer or NullObserver()
        self.queue = BatchQueue(config.levels, config.capacity, config.bounded)
        self._rng = random.Random(config.seed)
        self._busy = 0
        self._worker_free_since = float("-inf")
        self.computing = 0  # requests in batches a worker is running
        # Most requests held at once (queued + computing) since the last dispatch, and
        # during the cycle before it: how much company a partial batch may expect.
        self._peak_this_cycle = 0
        self.peak_last_cycle = 0
        self._running: set[tuple[Pending, ...]] = set()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.cross_wired_batches = 0
        self._leaked_executors: list[ThreadPoolExecutor | None] = []  # fault stall-respawn
        self._abandon_pending = False  # fault stall-abandon
        self.abandoned = 0
        self.cap = (
            BatchCap(config.max_batch_size, config.backoff_grow_s)
            if config.backoff_grow_s is not None
            else None
        )

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            self.config.workers, thread_name_prefix="model-worker", initializer=_name_os_thread
        )
        self._task = asyncio.create_task(self._dispatch_loop(), name="batcher-dispatch")

    async def stop(self) -> None:
        self.fail_all(ServerExiting("server exiting"))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def idle(self) -> bool:
        return self.queue.live == 0 and self._busy == 0

    def fail_all(self, exc: Exception) -> None:
        """Answer every queued and running request with ``exc`` (drain timeout, stop)."""
        for item in self.queue.take(max_rows=2**62):
            self._cancel_timer(item)
            self._fail(item, exc)
        for batch in list(self._running):
            for item in batch:
                self._fail(item, exc)
        self._report_depths()

    def degrade_to_single(self) -> None:
        """Fault stall-trip: one request per batch from now on."""
        self.config = dataclasses.replace(self.config, one_request_per_batch=True)

    def respawn_workers(self) -> None:
        """Fault stall-respawn: a new model-worker pool; the old one is never shut down,
        so its threads stay (a running batch still finishes on it)."""
        old = self._executor
        self._executor = ThreadPoolExecutor(
            self.config.workers, thread_name_prefix="model-worker", initializer=_name_os_thread
        )
        self._leaked_executors.append(old)

    def abandon_after_batch(self) -> None:
        """Fault stall-abandon: once the batch now running (the "hung" one) returns,
        restart the queue (``abandon_queue``)."""
        self._abandon_pending = True

    def abandon_queue(self) -> int:
        """Fault stall-abandon: start over with an empty queue, forgetting what was queued
        (futures never resolved, deadline timers cancelled). Returns how many."""
        old = self.queue
        orphaned = old.take(max_rows=2**62)
        for item in orphaned:
            self._cancel_timer(item)
        self.queue = BatchQueue(self.config.levels, self.config.capacity, self.config.bounded)
        self._report_depths()
        return len(orphaned)

    # -- submission ------------------------------------------------------------------

    def submit(
        self, rows: np.ndarray, level: int, timeout_s: float | None
    ) -> asyncio.Future[np.ndarray]:
        """Queue one request; raises QueueFull at once when its level is at capacity."""
        assert self._loop is not None and self._wake is not None, "Batcher.start() not awaited"
        if self.config.single_level:
            level = self.config.levels - 1
        now = self._clock()
        item = Pending(rows, level, now, now + timeout_s if timeout_s is not None else None)
        if not self.queue.offer(item):
            if self.cap is not None:
                self.cap.overflow(now)
            raise QueueFull(
                f"priority level {level + 1} queue is full ({self.queue.capacity} requests)"
            )
        item.future = self._loop.create_future()
        if timeout_s is not None:
            item.timer = self._loop.call_later(timeout_s, self._expire, item)
        held = self.queue.live + self.computing
        if held > self._peak_this_cycle:
            self._peak_this_cycle = held
        self._obs.on_queue_depth(level, self.queue.depth(level))
        self._wake.set()
        return item.future

    def _expire(self, item: Pending) -> None:
        if self.queue.discard(item):
            self._fail(item, DeadlineExpired("request timeout expired before execution"))
            self._obs.on_expired(1)
            self._stat_failed([item])
            self._obs.on_queue_depth(item.level, self.queue.depth(item.level))

    @staticmethod
    def _fail(item: Pending, exc: Exception) -> None:
        if item.future is not None and not item.future.done():
            item.future.set_exception(exc)

    @staticmethod
    def _cancel_timer(item: Pending) -> None:
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None

    def _report_depths(self) -> None:
        for lv in range(self.queue.levels):
            self._obs.on_queue_depth(lv, self.queue.depth(lv))

    # -- dispatch --------------------------------------------------------------------

    def _wait_s(self, now: float) -> float | None:
        """0 = dispatch now; > 0 = wait at most this long for company; None = nothing to do.

        A partial batch goes at once when nobody else is expected: the requests held now
        (queued + computing) are at least the most held at once during the previous
        dispatch cycle. Otherwise it is held open for company at most ``max_delay_s``
        counted from when it could first have run: the later of its oldest request's
        arrival and the moment a worker became free. Time spent waiting for a busy
        worker is not time spent waiting for company; counting it would dispatch every
        partial batch at once under load, and a closed loop of C clients would settle
        into alternating half batches of C/2.
        """
        if self._busy >= self.config.workers or self.queue.live == 0:
            return None
        if self.config.one_request_per_batch or self.queue.live_rows >= self._max_rows(now):
            return 0.0
        if self.queue.live + self.computing >= self.peak_last_cycle:
            return 0.0
        oldest = self.queue.oldest()
        if oldest is None:
            return None
        wait = max(oldest, self._worker_free_since) + self.config.max_delay_s - now
        # Event-loop timers have ~1 ms resolution: closer than half of that is "now".
        return wait if wait > 0.0005 else 0.0

    def _max_rows(self, now: float) -> int:
        return self.cap.value(now) if self.cap is not None else self.config.max_batch_size

    async def _dispatch_loop(self) -> None:
        assert self._wake is not None and self._loop is not None
        wake = self._wake
        while True:
            wake.clear()
            wait = self._wait_s(self._clock())
            if wait == 0.0:
                self._dispatch()
                continue
            if wait is None:
                await wake.wait()
                continue
            # One timer per wait, rounded up to the loop's millisecond resolution so a
            # timer that fires a little early cannot turn into a busy loop.
            timer = self._loop.call_later(max(wait, 0.001), wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()

    def _dispatch(self) -> None:
        assert self._loop is not None and self._executor is not None
        now = self._clock()
        max_requests = 1 if self.config.one_request_per_batch else None
        batch = self.queue.take(
            self._max_rows(now), max_requests, arrival_order=self.config.fifo_dispatch
        )
        live = []
        for item in batch:
            self._cancel_timer(item)
            # A timer can fire late on a busy loop: never compute an expired request.
            if item.deadline is not None and now >= item.deadline:
                self._fail(item, DeadlineExpired("request timeout expired before execution"))
                self._obs.on_expired(1)
                self._stat_failed([item])
            elif item.future is not None and not item.future.done():
                item.started = now
                live.append(item)
        self._report_depths()
        if not live:
            return
        self._obs.on_batch(len(live), sum(p.n for p in live), [now - p.enqueued for p in live])
        self._busy += 1
        self.computing += len(live)
        self.peak_last_cycle = self._peak_this_cycle
        self._peak_this_cycle = self.queue.live + self.computing
        key = tuple(live)
        self._running.add(key)
        cf = self._loop.run_in_executor(self._executor, self._execute, key)
        cf.add_done_callback(lambda f, key=key: self._finished(key, f))

    def _execute(self, batch: tuple[Pending, ...]) -> tuple[np.ndarray, float, float]:
        """(outputs, model seconds, seconds spent assembling the input batch)."""
        t_in = time.perf_counter()
        x = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
        t0 = time.perf_counter()
        y = self._run(x)
        return y, time.perf_counter() - t0, t0 - t_in

    def _finished(self, batch: tuple[Pending, ...], fut: asyncio.Future) -> None:
        if self._abandon_pending:
            self._abandon_pending = False
            self.abandoned += self.abandon_queue()
        self._busy -= 1
        self.computing -= len(batch)
        self._worker_free_since = self._clock()
        self._running.discard(batch)
        assert self._wake is not None
        self._wake.set()
        n_rows = sum(p.n for p in batch)
        if fut.cancelled():
            for item in batch:
                self._fail(item, ServerExiting("server exiting"))
            return
        exc = fut.exception()
        if exc is not None:
            self._obs.on_compute(n_rows, 0.0, False)
            for item in batch:
                self._fail(item, exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            self._stat_failed(batch)
            return
        y, seconds, input_s = fut.result()
        self._obs.on_compute(n_rows, seconds, True)
        t_out = time.perf_counter()
        outputs: list[np.ndarray | Exception] = []
        start = 0
        for item in batch:
            outputs.append(y[start : start + item.n])
            start += item.n
        self._maybe_cross_wire(batch, outputs)
        if self._after_batch is not None:
            self._after_batch(outputs)
        for item, out in zip(batch, outputs, strict=True):
            if item.future is not None and not item.future.done():
                if isinstance(out, Exception):
                    item.future.set_exception(out)
                else:
                    item.future.set_result(out)
        if self.stats is not None:
            self._stat_batch(batch, outputs, n_rows, seconds, input_s, time.perf_counter() - t_out)

    def _stat_batch(
        self,
        batch: tuple[Pending, ...],
        outputs: list[np.ndarray | Exception],
        n_rows: int,
        infer_s: float,
        input_s: float,
        output_s: float,
    ) -> None:
        """One execution into the statistics: queue and enqueue→answer times per request,
        an output a fault replaced by an error counted as a failed request."""
        assert self.stats is not None
        now = self._clock()
        ok = [p for p, out in zip(batch, outputs, strict=True) if not isinstance(out, Exception)]
        bad = [p for p, out in zip(batch, outputs, strict=True) if isinstance(out, Exception)]
        self.stats.batch_done(
            rows=n_rows,
            ok_requests=len(ok),
            failed_requests=len(bad),
            queue_ns=int(sum(p.started - p.enqueued for p in ok) * 1e9),
            request_ns_ok=int(sum(now - p.enqueued for p in ok) * 1e9),
            request_ns_failed=int(sum(now - p.enqueued for p in bad) * 1e9),
            input_ns=int(input_s * 1e9),
            infer_ns=int(infer_s * 1e9),
            output_ns=int(output_s * 1e9),
            now_ms=int(time.time() * 1000),
        )

    def _stat_failed(self, items: Iterable[Pending]) -> None:
        if self.stats is None:
            return
        now = self._clock()
        waited = [now - p.enqueued for p in items]
        self.stats.failed(len(waited), int(sum(waited) * 1e9))

    def _maybe_cross_wire(
        self, batch: tuple[Pending, ...], outputs: list[np.ndarray | Exception]
    ) -> None:
        p = self.config.cross_wire_p
        if p <= 0 or len(batch) < 2 or self._rng.random() >= p:
            return
        # Swap two requests whose outputs have the same shape (a realistic index mix-up).
        by_n: dict[int, list[int]] = collections.defaultdict(list)
        for i, item in enumerate(batch):
            by_n[item.n].append(i)
        pairs = [idx for idx in by_n.values() if len(idx) >= 2]
        if not pairs:
            return
        i, j = self._rng.sample(self._rng.choice(pairs), 2)
        outputs[i], outputs[j] = outputs[j], outputs[i]
        self.cross_wired_batches += 1
