"""The simulated LLM engine's scheduling, KV accounting, prefix cache, preemption,
priorities and deadlines, stepped by hand on a fake clock (no sleeps, no event loop)."""

from __future__ import annotations

import time

import pytest

from harness_reference_server.llm.engine import Engine, EngineConfig, QueueFull
from harness_reference_server.llm.kv_cache import KVCache, block_hashes
from harness_reference_server.llm.sequence import Sequence
from harness_reference_server.llm.timer import DeadlineTimer
from harness_reference_server.llm.tokens import expected_completion, generate, stream_key, token_ids


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(**overrides) -> tuple[Engine, Clock]:
    clock = Clock()
    return Engine(EngineConfig(**overrides), clock=clock), clock


def seq(prompt_len: int = 32, max_tokens: int = 8, salt: int = 0, **kw) -> Sequence:
    ids = [salt * 100_000 + i for i in range(prompt_len)]
    return Sequence(ids, stream_key(ids, 0), max_tokens, ignore_eos=True, **kw)


def step(engine: Engine, clock: Clock):
    """One step: schedule, advance the clock by its modelled time, commit."""
    s = engine.schedule()
    clock.t += s.seconds
    engine.commit(s, clock.t)
    return s


def run_until_idle(engine: Engine, clock: Clock, limit: int = 10_000) -> int:
    for n in range(limit):
        if engine.idle:
            return n
        step(engine, clock)
    raise AssertionError("the engine never went idle")


def test_a_sequence_gets_the_oracles_tokens_and_frees_its_blocks() -> None:
    engine, clock = make()
    ids = token_ids("Tell me a story about a robot")
    s = Sequence(ids, stream_key(ids, 7), 40)
    engine.submit(s)
    run_until_idle(engine, clock)
    want = generate(ids, 7, 40, ignore_eos=False)
    assert "".join(s.take()) == want.text and s.finish_reason == want.finish_reason
    assert engine.kv.used_blocks == 0


def test_step_time_follows_the_cost_model() -> None:
    engine, clock = make(time_scale=2.0)
    engine.submit(seq(prompt_len=100, max_tokens=3))
    first = step(engine, clock)  # the whole prompt: one prefill step
    assert (first.prefill_tokens, first.decode_seqs) == (100, 0)
    assert first.seconds == pytest.approx(2.0 * (5.75e-3 + 100 * 17e-6))
    second = step(engine, clock)
    assert (second.prefill_tokens, second.decode_seqs) == (0, 1)
    assert second.seconds == pytest.approx(2.0 * (5.75e-3 + 6e-6))


def test_decodes_go_first_and_prefill_is_chunked_to_the_token_budget() -> None:
    engine, clock = make(max_num_batched_tokens=64)
    a = seq(prompt_len=10, max_tokens=50, salt=1)
    engine.submit(a)
    step(engine, clock)  # a prefilled, first token out
    engine.submit(seq(prompt_len=200, salt=2))
    s = step(engine, clock)
    assert s.work[0] == (a, 1)  # the decode first
    assert s.prefill_tokens == 63 and s.decode_seqs == 1  # the long prompt chunked
    for _ in range(3):
        assert step(engine, clock).decode_seqs == 1  # a keeps decoding every step


def test_max_num_seqs_bounds_the_running_batch() -> None:
    engine, clock = make(max_num_seqs=3)
    for i in range(5):
        engine.submit(seq(salt=i))
    step(engine, clock)
    assert len(engine.running) == 3 and engine.num_waiting == 2


def test_a_full_waiting_queue_refuses_at_once() -> None:
    engine, _ = make(max_waiting=2)
    engine.submit(seq(salt=1))
    engine.submit(seq(salt=2))
    with pytest.raises(QueueFull):
        engine.submit(seq(salt=3))


def test_a_shared_prefix_is_computed_once() -> None:
    engine, clock = make()
    system = list(range(1000, 1000 + 256))  # 16 full blocks
    a = Sequence(system + [1, 2, 3], stream_key(system, 0), 4, ignore_eos=True)
    engine.submit(a)
    run_until_idle(engine, clock)
    b = Sequence(system + [4, 5, 6], stream_key(system, 1), 4, ignore_eos=True)
    engine.submit(b)
    first = step(engine, clock)
    assert b.prefix_hit_tokens == 256 and first.prefill_tokens == 3


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    engine, clock = make()
    prompt = list(range(32))
    for salt in (1, 2):
        s = Sequence(prompt, stream_key(prompt, salt), 2, ignore_eos=True)
        engine.submit(s)
        first = step(engine, clock)
        run_until_idle(engine, clock)
    assert s.prefix_hit_tokens == 16 and first.prefill_tokens == 16


def test_kv_exhaustion_preempts_the_last_ranked_and_recomputes_it() -> None:
    engine, clock = make(num_blocks=8, block_size=16)  # 128 tokens in all
    old = seq(prompt_len=40, max_tokens=40, salt=1)
    young = seq(prompt_len=40, max_tokens=40, salt=2)
    engine.submit(old)
    clock.t += 1
    engine.submit(young)
    run_until_idle(engine, clock)
    assert young.preemptions >= 1 and old.preemptions == 0
    assert engine.num_preemptions >= 1
    for s in (old, young):  # recompute loses nothing: every stream is the oracle's
        assert s.output == list(generate(s.prompt_ids, 0, 40, ignore_eos=True).tokens)
    assert engine.kv.used_blocks == 0


def test_lower_priority_value_is_admitted_first() -> None:
    engine, clock = make(max_num_seqs=1)
    low = seq(salt=1, priority=5)
    high = seq(salt=2, priority=-1)
    engine.submit(low)
    engine.submit(high)
    step(engine, clock)
    assert engine.running == [high]


def test_a_deadline_aborts_waiting_and_running_sequences_and_frees_blocks() -> None:
    engine, clock = make(max_num_seqs=1)
    running = seq(salt=1, max_tokens=1000, deadline=0.5)
    waiting = seq(salt=2, deadline=0.2)
    engine.submit(running)
    engine.submit(waiting)
    step(engine, clock)
    clock.t = 0.3
    engine.expire(clock.t)
    assert waiting.finish_reason == "deadline" and engine.num_waiting == 0
    clock.t = 0.6
    engine.expire(clock.t)
    assert running.finish_reason == "deadline" and engine.kv.used_blocks == 0


def test_abort_frees_blocks() -> None:
    engine, clock = make()
    s = seq(max_tokens=100)
    engine.submit(s)
    step(engine, clock)
    assert engine.kv.used_blocks > 0
    engine.abort(s, "disconnect")
    assert engine.kv.used_blocks == 0 and engine.running == []


def test_kv_cache_evicts_least_recently_freed_and_forgets_its_hash() -> None:
    kv = KVCache(num_blocks=2, block_size=2)
    hashes = block_hashes([1, 2, 3, 4], 2)
    blocks = kv.allocate(2)
    assert blocks is not None
    for b, h in zip(blocks, hashes, strict=True):
        kv.publish(b, h)
    kv.release(blocks)
    assert kv.lookup(hashes) == blocks and kv.usage() == 0.0
    kv.allocate(1)  # evicts the tail block (freed first: release goes tail first)
    assert kv.lookup(hashes) == blocks[:1]


def test_the_oracle_answers_chat_and_completions_alike_for_the_same_text() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    chat = expected_completion(messages=msgs, max_tokens=30, seed=3, temperature=0.7)
    ids = token_ids("<|user|>\nhi\n<|assistant|>\n")
    assert chat == generate(ids, 3, 30, ignore_eos=False)
    greedy = expected_completion(messages=msgs, max_tokens=30, seed=3, temperature=0)
    assert greedy == generate(ids, 0, 30, ignore_eos=False)


# -- the engine-level faults ----------------------------------------------------------


def test_fault_static_batching_admits_nothing_until_the_batch_drains() -> None:
    engine, clock = make(static_batching=True)
    first = seq(salt=1, max_tokens=20)
    engine.submit(first)
    step(engine, clock)
    late = seq(salt=2, max_tokens=2)
    engine.submit(late)
    while not first.finished:
        step(engine, clock)
        assert late.state == "waiting" or first.finished
    run_until_idle(engine, clock)
    assert late.first_token_at is not None and late.first_token_at > first.last_token_at


def test_fault_no_chunked_prefill_stalls_every_decode_for_a_long_prompt() -> None:
    engine, clock = make(chunked_prefill=False, max_num_batched_tokens=512)
    a = seq(salt=1, max_tokens=100)
    engine.submit(a)
    step(engine, clock)
    engine.submit(seq(salt=2, prompt_len=3000))
    s = step(engine, clock)
    assert s.decode_seqs == 0 and s.prefill_tokens == 3000  # a waits a whole prefill
    assert s.seconds > 8 * 3000 * 17e-6


def test_fault_priority_inversion_admits_the_higher_value_first() -> None:
    engine, clock = make(max_num_seqs=1, priority_inverted=True)
    low = seq(salt=1, priority=5)
    engine.submit(seq(salt=2, priority=-1))
    engine.submit(low)
    step(engine, clock)
    assert engine.running == [low]


def test_fault_kv_leak_on_abort_keeps_the_blocks() -> None:
    engine, clock = make(leak_on_abort=True)
    s = seq(max_tokens=100)
    engine.submit(s)
    step(engine, clock)
    used = engine.kv.used_blocks
    engine.abort(s, "disconnect")
    assert used > 0 and engine.kv.used_blocks == used


def test_fault_truncate_on_arrival_ends_running_streams() -> None:
    engine, clock = make(interrupt_on_arrival=True)
    s = seq(max_tokens=100, interruptible=True)
    engine.submit(s)
    step(engine, clock)
    engine.submit(seq(salt=2))
    assert s.finish_reason == "interrupted"


def test_fault_cross_stream_swaps_tokens_between_streams() -> None:
    engine, clock = make(cross_stream_p=1.0)
    a, b = seq(salt=1, max_tokens=5), seq(salt=2, max_tokens=5)
    engine.submit(a)
    engine.submit(b)
    run_until_idle(engine, clock)
    assert a.take() == b.output and b.take() == a.output


def test_fault_unbounded_queue_never_refuses() -> None:
    engine, _ = make(max_waiting=None)
    for i in range(5000):
        engine.submit(seq(salt=i))
    assert engine.num_waiting == 5000


def test_fault_kv_overcommit_preempts_where_the_healthy_setting_does_not() -> None:
    def preemptions(max_num_seqs: int) -> int:
        engine, clock = make(max_num_seqs=max_num_seqs, num_blocks=64)  # 1024 tokens
        for i in range(16):
            engine.submit(seq(prompt_len=32, max_tokens=48, salt=i))
        run_until_idle(engine, clock)
        return engine.num_preemptions

    assert preemptions(16) > 0 and preemptions(4) == 0


def test_the_deadline_timer_never_wakes_early_under_uvloop() -> None:
    """uvloop's asyncio.sleep rounds to whole milliseconds (and so can wake early); the
    step loop's timer waits for an absolute instant in nanoseconds."""
    uvloop = pytest.importorskip("uvloop")
    timer = DeadlineTimer()
    assert timer.precise  # Linux: a timerfd
    early: list[float] = []

    async def main() -> None:
        for i in range(20):
            deadline = time.monotonic() + 0.0013 + i * 0.0001  # not whole milliseconds
            await timer.wait_until(deadline)
            early.append(deadline - time.monotonic())
        past = time.monotonic() - 1.0
        await timer.wait_until(past)  # a deadline already passed returns at once

    try:
        uvloop.run(main())
    finally:
        timer.close()
    assert len(early) == 20 and max(early) <= 0
    assert not timer.precise  # closed
