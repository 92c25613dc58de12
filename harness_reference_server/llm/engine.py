"""A simulated continuous-batching LLM engine: one step loop, vLLM's scheduling, a KV cache.

Each step the scheduler (``Engine.schedule``) takes the running sequences first, one
token each for those decoding and a chunk for those still in prefill, then admits waiting
sequences (lowest ``priority`` value first, then arrival) while the step's token budget
(``max_num_batched_tokens``), ``max_num_seqs`` and the free KV blocks allow. A sequence
that needs a block when none is free preempts the running sequence that comes last in
priority order: its blocks are freed and it waits to be recomputed from its prompt and
the tokens it already produced (vLLM's RECOMPUTE). A full waiting queue (``max_waiting``)
refuses an arrival unless it ranks above a waiting sequence that has not started: that
one is displaced instead (finished ``shed``). A waiting sequence that cannot start
(no sequence slot, no KV room, no token budget left) preempts, the same way, running
sequences that rank below it, last first (vLLM's priority scheduling), so it starts in
the step that finds it waiting. A step lasts the cost model's time
(``EngineConfig.step_seconds``), slept until its absolute end, never computed; at its
end every sequence whose tokens are all computed samples its next token from
``harness_reference_server.llm.tokens``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from harness_reference_server.llm.kv_cache import KVCache, block_hashes
from harness_reference_server.llm.sequence import Sequence, Step
from harness_reference_server.llm.timer import DeadlineTimer
from harness_reference_server.llm.tokens import token_at

# the step loop's timer correction: each step's error moves the slack by this share of it
SLACK_GAIN = 0.1
SLACK_MAX_S = 0.002


class QueueFull(Exception):
    """The waiting queue holds ``max_waiting`` sequences."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_blocks: int = 2048
    max_waiting: int | None = 32  # None: never shed (the unbounded-queue fault)
    beta0_s: float = 5.75e-3  # per step
    beta1_s: float = 17e-6  # per prefill token in the step
    beta2_s: float = 6e-6  # per decoding sequence in the step
    time_scale: float = 8.0
    prefix_caching: bool = True
    # behaviours the planted faults switch (harness_reference_server/llm/faults.py)
    chunked_prefill: bool = True
    static_batching: bool = False
    priority_inverted: bool = False
    leak_on_abort: bool = False
    interrupt_on_arrival: bool = False
    cross_stream_p: float = 0.0
    seed: int = 0

    def step_seconds(self, prefill_tokens: int, decode_seqs: int) -> float:
        """The cost model: time_scale x (β0 + β1·prefill tokens + β2·decoding sequences)."""
        return self.time_scale * (
            self.beta0_s + self.beta1_s * prefill_tokens + self.beta2_s * decode_seqs
        )


class EngineObserver(Protocol):
    def on_step(self, running: int, waiting: int, kv_usage: float, error_s: float) -> None: ...
    def on_preemption(self) -> None: ...
    def on_prefix_lookup(self, queried: int, hit: int) -> None: ...
    def on_token(self, seq: Sequence, now: float, first: bool) -> None: ...
    def on_finish(self, seq: Sequence, now: float) -> None: ...


class Engine:
    """The step loop. ``submit`` a Sequence, read its ``outbox`` after ``event`` fires."""

    def __init__(
        self,
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
        wait_until: Callable[[float], Awaitable[object]] | None = None,
        observer: EngineObserver | None = None,
    ) -> None:
        """``wait_until(t)`` returns once ``clock()`` reaches ``t``; by default a
        ``DeadlineTimer`` made when the loop starts (``clock`` is then ``time.monotonic``)."""
        self.config = config
        self.clock = clock
        self._timer: DeadlineTimer | None = None
        self.wait_until = wait_until
        self.observer = observer
        self.kv = KVCache(config.num_blocks, config.block_size, config.prefix_caching)
        self.running: list[Sequence] = []
        self._waiting: list[tuple[tuple[int, float, int], Sequence]] = []
        self.num_waiting = 0
        self.num_preemptions = 0
        self._order = itertools.count()
        self._rng = random.Random(config.seed)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- requests ------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue ``seq``. When the waiting queue is at ``max_waiting``, ``seq`` displaces
        the lowest-ranked waiting sequence that has never started if ``seq``'s priority
        ranks above that one's (that one finishes ``shed``: its client is answered as
        refused); otherwise QueueFull. A sequence back in the queue after a preemption is
        never displaced (its answer has begun)."""
        cfg = self.config
        if cfg.max_waiting is not None and self.num_waiting >= cfg.max_waiting:
            victim = self._lowest_unstarted()
            sign = -1 if cfg.priority_inverted else 1
            if victim is None or sign * seq.priority >= sign * victim.priority:
                raise QueueFull(f"waiting queue full ({self.num_waiting} of {cfg.max_waiting})")
            self.abort(victim, "shed")
        if cfg.interrupt_on_arrival:
            for other in [s for s in self.running if s.interruptible] + [
                s for _, s in self._waiting if s.interruptible and s.state == "waiting"
            ]:
                self.abort(other, "interrupted")
        seq.arrival = self.clock()
        seq.order = next(self._order)
        seq.hashes = block_hashes(seq.prompt_ids, cfg.block_size)
        self._enqueue(seq)
        self._wake.set()

    def abort(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` now (client gone, deadline, error): its blocks are freed (unless
        the leak-on-abort fault keeps them) and its consumer is woken."""
        if seq.finished:
            return
        if seq.state == "running":
            self.running.remove(seq)
            if not self.config.leak_on_abort:
                self.kv.release(seq.blocks)
            seq.blocks = []
        elif seq.state == "waiting":
            self.num_waiting -= 1  # its heap entry is skipped when popped
        self._finish(seq, reason, self.clock())

    def _enqueue(self, seq: Sequence) -> None:
        sign = -1 if self.config.priority_inverted else 1
        heapq.heappush(self._waiting, ((sign * seq.priority, seq.arrival, seq.order), seq))
        seq.state = "waiting"
        self.num_waiting += 1

    def _lowest_unstarted(self) -> Sequence | None:
        """The last-ranked waiting sequence that was never admitted, None if none."""
        found: tuple[tuple[int, float, int], Sequence] | None = None
        for key, s in self._waiting:
            if s.state == "waiting" and s.preemptions == 0 and (found is None or key > found[0]):
                found = (key, s)
        return None if found is None else found[1]

    def _peek_waiting(self) -> Sequence | None:
        while self._waiting and self._waiting[0][1].state != "waiting":
            heapq.heappop(self._waiting)
        return self._waiting[0][1] if self._waiting else None

    def _pop_waiting(self) -> None:
        heapq.heappop(self._waiting)
        self.num_waiting -= 1

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.state = "finished"
        seq.finish_reason = reason
        seq.event.set()
        seq.started.set()
        if self.observer is not None:
            self.observer.on_finish(seq, now)

    # -- scheduling ----------------------------------------------------------------

    def _rank(self, seq: Sequence) -> tuple[int, float, int]:
        sign = -1 if self.config.priority_inverted else 1
        return (sign * seq.priority, seq.arrival, seq.order)

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self.kv.release(victim.blocks)
        victim.blocks = []
        victim.num_computed = 0
        victim.preemptions += 1
        self.num_preemptions += 1
        if self.observer is not None:
            self.observer.on_preemption()
        self._enqueue(victim)

    def _grow(self, seq: Sequence, new_tokens: int) -> bool:
        """Give ``seq`` the blocks for ``new_tokens`` more, preempting the last-ranked
        running sequence while none are free; False if ``seq`` itself was preempted."""
        need = self.kv.blocks_for(seq.num_computed + new_tokens) - len(seq.blocks)
        while need > 0:
            got = self.kv.allocate(need)
            if got is not None:
                seq.blocks += got
                return True
            victim = max(self.running, key=self._rank)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _admit(self, seq: Sequence, budget: int, whole: bool) -> int:
        """Start ``seq``'s (re)computation with up to ``budget`` tokens (all of it when
        ``whole``); 0 when its blocks do not fit."""
        hit = self.kv.lookup(seq.hashes[: (seq.num_tokens - 1) // self.config.block_size])
        n = seq.num_tokens - len(hit) * self.config.block_size
        if not whole:
            n = min(n, budget)
        need = self.kv.blocks_for(len(hit) * self.config.block_size + n) - len(hit)
        if need > self.kv.free_blocks - self.kv.free_among(hit):
            return 0
        self.kv.share(hit)
        seq.blocks = hit + (self.kv.allocate(need) or [])
        seq.num_computed = len(hit) * self.config.block_size
        if seq.preemptions == 0 and self.observer is not None:
            self.observer.on_prefix_lookup(len(seq.prompt_ids), seq.num_computed)
        seq.prefix_hit_tokens = max(seq.prefix_hit_tokens, seq.num_computed)
        if seq.timings is not None and seq.timings.scheduled_ns is None:
            seq.timings.scheduled_ns = time.monotonic_ns()
        self._pop_waiting()
        seq.state = "running"
        seq.started.set()
        self.running.append(seq)
        return n

    def schedule(self) -> Step:
        """Choose this step's work (decodes first, then prefill chunks)."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        work: list[tuple[Sequence, int]] = []
        if not cfg.chunked_prefill:
            work = self._admit_whole_prompts(budget)
            if work:  # a prefill step: the running decodes wait for it
                return self._step(work)
        preempted = False
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.state != "running":
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed, budget)
            before = self.num_preemptions
            if not self._grow(seq, n):
                preempted = True
                continue
            preempted |= self.num_preemptions != before
            work.append((seq, n))
            budget -= n
        work = [(s, n) for s, n in work if s.state == "running"]
        if cfg.chunked_prefill and not preempted and not (cfg.static_batching and self.running):
            while (seq := self._peek_waiting()) is not None:
                n = 0
                if budget > 0 and len(self.running) < cfg.max_num_seqs:
                    n = self._admit(seq, budget, whole=False)
                if n == 0:
                    freed = self._preempt_below(seq, work)
                    if freed is None:
                        break
                    budget += freed
                    continue
                work.append((seq, n))
                budget -= n
        return self._step(work)

    def _preempt_below(self, seq: Sequence, work: list[tuple[Sequence, int]]) -> int | None:
        """Preempt the last-ranked running sequence if its priority is lower than
        ``seq``'s (never one of the same priority) and drop its share of ``work``: the
        tokens of budget that frees; None when no running sequence ranks below."""
        if not self.running:
            return None
        victim = max(self.running, key=self._rank)
        if self._rank(victim)[0] <= self._rank(seq)[0]:
            return None
        self._preempt(victim)
        freed = sum(n for s, n in work if s is victim)
        work[:] = [(s, n) for s, n in work if s is not victim]
        return freed

    def _admit_whole_prompts(self, budget: int) -> list[tuple[Sequence, int]]:
        """Without chunked prefill: whole prompts, the first even past the budget."""
        work: list[tuple[Sequence, int]] = []
        while (seq := self._peek_waiting()) is not None:
            if work and seq.num_tokens > budget:
                break
            n = 0
            if len(self.running) < self.config.max_num_seqs:
                n = self._admit(seq, budget, whole=True)
            if n == 0:
                if self._preempt_below(seq, work) is None:
                    break
                continue
            work.append((seq, n))
            budget -= n
        return work

    def _step(self, work: list[tuple[Sequence, int]]) -> Step:
        decode = sum(
            1 for s, n in work if n == 1 and s.output and s.num_computed == s.num_tokens - 1
        )
        prefill = sum(n for _, n in work) - decode
        return Step(work, prefill, decode, self.config.step_seconds(prefill, decode))

    # -- the end of a step -----------------------------------------------------------

    def commit(self, step: Step, now: float) -> None:
        """Account the step's computed tokens and sample the next token of every
        sequence whose tokens are all computed; finish those that are done."""
        sampled: list[tuple[Sequence, str]] = []
        bs = self.config.block_size
        for seq, n in step.work:
            if seq.state != "running":
                continue  # aborted during the step
            before = seq.num_computed // bs
            seq.num_computed += n
            for i in range(before, min(seq.num_computed // bs, len(seq.hashes))):
                self.kv.publish(seq.blocks[i], seq.hashes[i])
            if seq.num_computed < seq.num_tokens:
                continue  # a prefill chunk that is not the last
            text, eos = token_at(seq.key, len(seq.output))
            if eos and not seq.ignore_eos:
                self._end(seq, "stop", now)
                continue
            seq.output.append(text)
            sampled.append((seq, text))
        if (
            self.config.cross_stream_p
            and len(sampled) >= 2
            and self._rng.random() < self.config.cross_stream_p
        ):
            (i, j) = self._rng.sample(range(len(sampled)), 2)
            (a, ta), (b, tb) = sampled[i], sampled[j]
            sampled[i], sampled[j] = (a, tb), (b, ta)
        for seq, text in sampled:
            seq.outbox.append(text)
            first = seq.first_token_at is None
            if first:
                seq.first_token_at = now
            if self.observer is not None:
                self.observer.on_token(seq, now, first)
            seq.last_token_at = now
            seq.event.set()
            if len(seq.output) >= seq.max_tokens:
                self._end(seq, "length", now)

    def _end(self, seq: Sequence, reason: str, now: float) -> None:
        self.running.remove(seq)
        self.kv.release(seq.blocks)
        seq.blocks = []
        self._finish(seq, reason, now)

    def expire(self, now: float) -> None:
        """Abort every sequence whose deadline has passed."""
        late = [s for s in self.running if s.deadline is not None and s.deadline <= now]
        late += [
            s
            for _, s in self._waiting
            if s.state == "waiting" and s.deadline is not None and s.deadline <= now
        ]
        for seq in late:
            self.abort(seq, "deadline")

    # -- the loop ------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.running and self._peek_waiting() is None

    async def run(self) -> None:
        """Step while there is work; wait until each step's modelled end. A step starts
        at the previous step's modelled end (an absolute deadline: the loop's own CPU
        time is absorbed, no drift accumulates), and each wait ends earlier by the
        timer's learned lateness (``slack``), so a step's actual end is centred on its
        modelled end."""
        start: float | None = None
        slack = 0.0
        wait_until = self.wait_until
        if wait_until is None:
            self._timer = DeadlineTimer()
            wait_until = self._timer.wait_until
        while not self._stopping:
            if self.idle:
                self._wake.clear()
                self._report(0.0)  # the gauges read empty while nothing runs
                await self._wake.wait()
                start = None
                continue
            now = self.clock()
            if start is None or now - start > 0.05:
                start = now
            self.expire(now)
            step = self.schedule()
            end = start + step.seconds
            if end - slack > self.clock():
                await wait_until(end - slack)
            else:
                await asyncio.sleep(0)  # let the streams run
            actual = self.clock()
            self.commit(step, actual)
            error = actual - end
            slack = min(SLACK_MAX_S, max(0.0, slack + SLACK_GAIN * error))
            self._report(error)
            start = end
        self._report(0.0)

    def _report(self, error_s: float) -> None:
        if self.observer is not None:
            self.observer.on_step(len(self.running), self.num_waiting, self.kv.usage(), error_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="llm-engine")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._timer is not None:
            self._timer.close()

    def abort_all(self, reason: str) -> None:
        for seq in list(self.running) + [s for _, s in self._waiting if s.state == "waiting"]:
            self.abort(seq, reason)
