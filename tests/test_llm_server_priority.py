"""Priority preemption of running sequences (vLLM's priority scheduling): a waiting
sequence that cannot start preempts, by recompute, running sequences of a lower priority,
last-ranked first; the preempted ones resume with the same tokens. A full waiting queue
admits an arrival that ranks above its last unstarted sequence by displacing that one. Stepped by hand on a
fake clock, then once through the HTTP API on a real event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness_reference_server.llm.api import LLMState
from harness_reference_server.llm.engine import QueueFull
from harness_reference_server.llm.tokens import expected_completion, generate
from tests.test_llm_server_api import chat, request, scrape, serve
from tests.test_llm_server_engine import make, run_until_idle, seq, step


def oracle(s: Any) -> list[str]:
    return list(generate(s.prompt_ids, 0, s.max_tokens, ignore_eos=True).tokens)


def test_a_higher_priority_sequence_preempts_the_lowest_when_no_slot_is_free() -> None:
    engine, clock = make(max_num_seqs=2)
    low = seq(salt=1, priority=5, max_tokens=20)
    mid = seq(salt=2, priority=3, max_tokens=20)
    engine.submit(low)
    engine.submit(mid)
    for _ in range(3):
        step(engine, clock)
    high = seq(salt=3, priority=0, max_tokens=4)
    engine.submit(high)
    first = step(engine, clock)
    assert [s for s, _ in first.work] == [mid, high]  # low's decode left this step
    assert len(high.output) == 1  # its whole prompt fit: first token at this step's end
    assert low.state == "waiting" and (low.preemptions, mid.preemptions) == (1, 0)
    assert engine.num_preemptions == 1
    run_until_idle(engine, clock)
    for s in (low, mid, high):  # the recomputed sequence loses and repeats nothing
        assert s.output == oracle(s) and s.finish_reason == "length"
    assert engine.kv.used_blocks == 0


def test_a_higher_priority_sequence_preempts_when_the_kv_cache_is_full() -> None:
    engine, clock = make(num_blocks=6, block_size=16)  # 96 tokens in all
    low = seq(prompt_len=60, salt=1, priority=5, max_tokens=30)
    engine.submit(low)
    step(engine, clock)
    high = seq(prompt_len=40, salt=2, priority=0, max_tokens=4)
    engine.submit(high)  # needs 3 blocks, 2 are free; seq slots are plenty
    step(engine, clock)
    assert low.state == "waiting" and low.preemptions == 1 and len(high.output) == 1
    run_until_idle(engine, clock)
    assert low.output == oracle(low) and high.output == oracle(high)


def test_the_same_priority_never_preempts() -> None:
    engine, clock = make(max_num_seqs=1)
    first = seq(salt=1, max_tokens=5)
    engine.submit(first)
    step(engine, clock)
    later = seq(salt=2, max_tokens=5)
    engine.submit(later)
    while not first.finished:
        step(engine, clock)
        assert later.state == "waiting" or first.finished
    assert engine.num_preemptions == 0


def test_a_lower_priority_sequence_never_preempts() -> None:
    engine, clock = make(max_num_seqs=1)
    high = seq(salt=1, priority=0, max_tokens=5)
    engine.submit(high)
    step(engine, clock)
    engine.submit(seq(salt=2, priority=9, max_tokens=5))
    run_until_idle(engine, clock)
    assert engine.num_preemptions == 0 and high.preemptions == 0


def test_fault_priority_inversion_preempts_for_the_higher_value() -> None:
    engine, clock = make(max_num_seqs=1, priority_inverted=True)
    urgent = seq(salt=1, priority=-5, max_tokens=10)
    engine.submit(urgent)
    step(engine, clock)
    engine.submit(seq(salt=2, priority=5, max_tokens=3))
    step(engine, clock)
    assert urgent.state == "waiting" and urgent.preemptions == 1


def test_without_chunked_prefill_a_higher_priority_prompt_preempts_too() -> None:
    engine, clock = make(max_num_seqs=1, chunked_prefill=False)
    low = seq(salt=1, priority=5, max_tokens=10)
    engine.submit(low)
    step(engine, clock)
    high = seq(salt=2, priority=0, max_tokens=2)
    engine.submit(high)
    step(engine, clock)
    assert low.state == "waiting" and len(high.output) == 1
    run_until_idle(engine, clock)
    assert low.output == oracle(low)


def test_over_http_a_high_priority_stream_starts_within_two_steps_of_a_full_batch() -> None:
    low_doc = dict(max_tokens=40, ignore_eos=True, stream=True, priority=10)

    async def scenario(app: Any, state: LLMState) -> None:
        first = asyncio.create_task(
            request(app, "POST", "/v1/chat/completions", chat("one", **low_doc))
        )
        await asyncio.sleep(0.002)  # "one" arrives first: "two" ranks last
        second = asyncio.create_task(
            request(app, "POST", "/v1/chat/completions", chat("two", **low_doc))
        )
        while len(state.engine.running) < 2 or not all(s.output for s in state.engine.running):
            await asyncio.sleep(0.001)
        engine = state.engine
        two_seq = max(engine.running, key=lambda s: s.order)  # "two" arrived last
        # counted in the engine's own steps, not in wall times: on a loaded machine the
        # request's parsing may take several steps, and that is not what this proves
        marks: dict[str, Any] = {"steps": 0}
        real_submit, real_commit = engine.submit, engine.commit

        def submit(seq: Any) -> None:
            real_submit(seq)
            marks.update(high=seq, arrived=marks["steps"])
            marks["two_at_arrival"] = len(two_seq.output)

        def commit(step: Any, now: float) -> None:
            real_commit(step, now)
            marks["steps"] += 1
            high = marks.get("high")
            if high is not None and high.output and "first" not in marks:
                marks["first"] = marks["steps"]
            if high is not None and high.finished and "done" not in marks:
                marks["done"] = marks["steps"]
                marks["two_at_done"] = len(two_seq.output)

        engine.submit, engine.commit = submit, commit  # type: ignore[method-assign]
        high = await request(
            app,
            "POST",
            "/v1/chat/completions",
            chat("urgent", max_tokens=3, ignore_eos=True, stream=True, priority=-10),
        )
        one, two = await first, await second
        # the step running at the arrival, then the one that prefills "urgent" and
        # samples its first token (a whole short prompt fits one step's budget)
        assert marks["first"] - marks["arrived"] <= 2
        # "two" (last in rank) was preempted: nothing from it while "urgent" ran, and
        # "urgent" decoded each step after its first
        assert marks["two_at_done"] - marks["two_at_arrival"] <= 1
        assert marks["done"] - marks["first"] == 2
        for answer, content in ((one, "one"), (two, "two")):
            want = expected_completion(
                messages=[{"role": "user", "content": content}], max_tokens=40, ignore_eos=True
            )
            assert answer.content() == want.text
        assert (
            high.content()
            == expected_completion(
                messages=[{"role": "user", "content": "urgent"}], max_tokens=3, ignore_eos=True
            ).text
        )
        assert scrape(state)["vllm:num_preemptions_total"] == 1

    serve(scenario, time_scale=1.0, max_num_seqs=2)


def test_a_full_queue_admits_a_higher_priority_arrival_by_displacing_the_lowest() -> None:
    engine, clock = make(max_num_seqs=1, max_waiting=2)
    engine.submit(seq(salt=1, priority=0, max_tokens=50))
    step(engine, clock)  # it runs; the queue is empty
    early_low = seq(salt=2, priority=5)
    late_low = seq(salt=3, priority=5)
    engine.submit(early_low)
    engine.submit(late_low)
    high = seq(salt=4, priority=1)
    engine.submit(high)  # full: the last-ranked waiting one (the later low) goes
    assert late_low.finished and late_low.finish_reason == "shed" and late_low.started.is_set()
    assert early_low.state == "waiting" and high.state == "waiting"
    assert engine.num_waiting == 2
    # an arrival of the priority at the queue's tail, or below it, is refused as before
    with pytest.raises(QueueFull):
        engine.submit(seq(salt=5, priority=5))
    with pytest.raises(QueueFull):
        engine.submit(seq(salt=6, priority=9))
    # the displacing request runs before the low one left waiting
    run_until_idle(engine, clock)
    assert high.first_token_at is not None and early_low.first_token_at is not None
    assert high.first_token_at < early_low.first_token_at


def test_a_preempted_sequence_is_never_displaced() -> None:
    engine, clock = make(max_num_seqs=1, max_waiting=1)
    low = seq(salt=1, priority=5, max_tokens=20)
    engine.submit(low)
    step(engine, clock)
    engine.submit(seq(salt=2, priority=0, max_tokens=20))
    step(engine, clock)  # the high one preempts low: low waits again, its answer begun
    assert low.state == "waiting" and low.preemptions == 1 and engine.num_waiting == 1
    with pytest.raises(QueueFull):
        engine.submit(seq(salt=3, priority=-1))
    assert low.state == "waiting"


def test_fault_priority_inversion_displaces_the_lower_value_from_a_full_queue() -> None:
    engine, clock = make(max_num_seqs=1, max_waiting=1, priority_inverted=True)
    engine.submit(seq(salt=1, priority=0, max_tokens=50))
    step(engine, clock)
    urgent = seq(salt=2, priority=-5)
    engine.submit(urgent)
    engine.submit(seq(salt=3, priority=5))  # the inverted ranking puts 5 above -5
    assert urgent.finish_reason == "shed"
    with pytest.raises(QueueFull):
        engine.submit(seq(salt=4, priority=-10))


def test_over_http_a_displaced_request_is_answered_429_with_retry_after() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        long = chat(max_tokens=2000, ignore_eos=True, stream=True, priority=0)
        running = asyncio.create_task(request(app, "POST", "/v1/chat/completions", long))
        while not state.engine.running:
            await asyncio.sleep(0.001)
        low = chat("low", max_tokens=2, ignore_eos=True, stream=True, priority=5)
        waiting = asyncio.create_task(request(app, "POST", "/v1/chat/completions", low))
        while state.engine.num_waiting < 1:
            await asyncio.sleep(0.001)
        high = chat("high", max_tokens=2, ignore_eos=True, stream=True, priority=1)
        admitted = asyncio.create_task(request(app, "POST", "/v1/chat/completions", high))
        shed = await waiting
        assert shed.status == 429 and shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["code"] == 429
        assert not admitted.done()  # it waits in the queue, its head not yet sent
        state.engine.abort_all("shutdown")
        await asyncio.gather(running, admitted)
        assert scrape(state)["refserver_llm_requests_rejected_total"] == 1

    serve(scenario, max_num_seqs=1, max_waiting=1)
