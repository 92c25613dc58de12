"""llm.overload on hand-built token sections: a spike's requests handled well are whole
answers whose first token came within the TTFT bound, or 429/503 answered quickly."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from harness.checks import REGISTRY, resolve_params
from harness.checks.model import Check
from harness.checks.tokens_overload import count_at_most
from harness.load.stream_recording import StreamStats
from harness.protocols.openai_stream import StreamRecord
from harness.results import hdr
from harness.testing.llm_streams import chunk_event, synthetic_record, whole_stream_record
from harness.testing.results import scenario
from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.engine import EngineConfig
from harness_reference_server.llm.faults import parse_llm_faults


def _answer(ttft: float, n: int = 8, gap: float = 0.05) -> StreamRecord:
    return whole_stream_record([ttft + i * gap for i in range(n)])


def _shed(after: float, status: int = 429) -> StreamRecord:
    return synthetic_record([], status=status, end_at=after)


def _timed_out(after: float) -> StreamRecord:
    # headers and one token, then nothing until the client's deadline: not whole
    return synthetic_record(
        [(0.1, chunk_event(" w0"))], end_at=after, usage_requested=True, count_tokens=None
    )


def _judge(streams: list[StreamRecord], dropped: int = 0, **params: Any) -> Check:
    stats = StreamStats()
    for rec in streams:
        stats.record("spike", rec)
    for _ in range(dropped):
        stats.dropped("spike")
    tokens = {"by_class": stats.summary(), "by_stage": stats.summary()}
    sc = scenario("llm_spike", 30.0, tokens=tokens)
    return REGISTRY["llm.overload"].fn(sc, resolve_params("llm.overload", params))


def test_a_server_that_sheds_quickly_and_serves_its_admitted_in_time_passes() -> None:
    streams = [_answer(0.3 + 0.005 * i) for i in range(120)] + [_shed(0.004)] * 80
    c = _judge(streams)
    assert c.passed is True and c.value == 1.0 and c.n == 200
    assert "120 whole answers" in c.detail and "80 429/503 answered within" in c.detail
    # 503 is a shed as much as 429
    assert _judge([_answer(0.3)] * 120 + [_shed(0.01, 503)] * 80).value == 1.0


def test_a_queue_that_grows_fails_on_its_late_first_tokens() -> None:
    # an unbounded queue: nothing refused, the wait grows through the spike (0.2 s → 6 s)
    streams = [_answer(0.21 + 0.03 * i) for i in range(200)]
    c = _judge(streams)
    in_time = sum(1 for i in range(200) if 0.21 + 0.03 * i <= 2.0)
    assert c.passed is False and c.value == pytest.approx(in_time / 200, abs=0.01)
    assert f"{200 - in_time} admitted but first token later" in c.detail
    assert "bounded waiting queue" in c.detail
    # against a bound the whole queue stays within, nothing was late or refused: the
    # spike did not exceed what the server serves within the bound (not judged)
    loose = _judge(streams, ttft_ms=7000.0)
    assert loose.passed is None and "did not exceed capacity" in loose.detail


def test_slow_sheds_timeouts_and_drops_are_not_handled_well() -> None:
    good = [_answer(0.3)] * 100
    slow_shed = _judge(good + [_shed(3.0)] * 50)  # a 429 after a 3 s wait in a queue
    assert slow_shed.passed is False and slow_shed.value == pytest.approx(100 / 150, abs=1e-3)
    assert "50 429/503 slower than 1,000 ms" in slow_shed.detail
    timeouts = _judge(good + [_timed_out(60.0)] * 10)
    assert timeouts.passed is False and "10 other failures" in timeouts.detail
    assert "see the failures by kind" in timeouts.detail
    errors = _judge(good + [_shed(0.01, 500)] * 10)
    assert errors.passed is False and "http_error (not 429/503) 10" in errors.detail
    dropped = _judge(good, dropped=10)
    assert dropped.passed is False and dropped.n == 110 and "10 dropped" in dropped.detail


def test_an_early_hang_up_does_not_stand_in_for_a_late_answer() -> None:
    """Aborted streams' first tokens share the TTFT histogram: 100 late whole answers and
    100 hang-ups after an early first token are 0 in time, not 100."""
    hung_up = dataclasses.replace(_answer(0.2, n=3), aborted=True)
    c = _judge([_answer(3.0)] * 100 + [hung_up] * 100)
    assert c.passed is False and c.value == 0.0, c.detail
    assert "100 admitted but first token later than 2,000 ms" in c.detail


def test_a_spike_the_server_absorbed_is_not_judged() -> None:
    c = _judge([_answer(0.2 + 0.001 * i) for i in range(150)])
    assert c.passed is None and "did not exceed capacity" in c.detail
    # one late first token is overload evidence: judged (and passed at 149/150)
    late = _judge([_answer(0.2)] * 149 + [_answer(2.5)])
    assert late.passed is True and late.value == pytest.approx(149 / 150, abs=1e-4)


def test_too_few_requests_or_no_streams_are_skipped() -> None:
    few = _judge([_shed(0.01)] * 50)
    assert few.passed is None and "< 100" in few.detail
    sc = scenario("llm_spike", 30.0)
    none = REGISTRY["llm.overload"].fn(sc, resolve_params("llm.overload", {}))
    assert none.passed is None and "no token streams" in none.detail


def test_count_at_most_counts_to_hdr_precision() -> None:
    h = hdr.new_histogram()
    for v in (1_000, 1_999_000, 2_000_000, 2_003_000, 5_000_000):
        h.record_value(v)
    # a value at the bound is within it; 0.15 % above it is not
    assert count_at_most(h, 2_000_000) == 3 and count_at_most(h, 999) == 0
    assert count_at_most(h, 60_000_000) == 5 and count_at_most(hdr.new_histogram(), 1e9) == 0


def test_the_reference_server_sheds_by_default_and_the_fault_never_does() -> None:
    assert LLMConfig().max_waiting == EngineConfig().max_waiting == 32
    assert LLMConfig().engine_config().max_waiting == 32
    faulty = LLMConfig(faults=parse_llm_faults(["unbounded-queue"]))
    assert faulty.engine_config().max_waiting is None
