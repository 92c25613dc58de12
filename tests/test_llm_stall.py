"""llm.stall: the p99 over streams of each stream's longest gap between token events,
judged from the ``tokens`` section the load side records (streams built event by event)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.checks import REGISTRY, Check, resolve_params
from harness.load.stream_recording import StreamStats
from harness.testing.llm_streams import whole_stream_record
from harness.testing.results import scenario


def _stream(gaps: list[float], *, ttft: float = 0.1, finish: bool = True) -> Any:
    """A stream whose token events are ``ttft`` after the send, then ``gaps`` apart."""
    times = [ttft]
    for g in gaps:
        times.append(times[-1] + g)
    return whole_stream_record(times, finish=finish)


def _judge(streams: list[Any], **params: Any) -> Check:
    stats = StreamStats()
    for rec in streams:
        stats.record("steady", rec)
    tokens = {"by_class": stats.summary(), "by_stage": stats.summary()}
    sc = scenario("llm_shared_prefix", 30.0, tokens=tokens)
    return REGISTRY["llm.stall"].fn(sc, resolve_params("llm.stall", {"stage": "steady", **params}))


def _steady(n: int) -> list[Any]:
    return [_stream([0.05] * 40) for _ in range(n)]


def test_a_freeze_in_a_long_answer_fails_the_stall_check_while_its_tpot_stays_low() -> None:
    healthy = _judge(_steady(150))
    assert healthy.passed is True and healthy.value == pytest.approx(50, rel=0.02)
    # 3 % of the streams pause once for 1.2 s among 40 gaps of 50 ms: their TPOT is
    # (39 x 0.05 + 1.2) / 40 = 79 ms, within a 100 ms TPOT bound, their longest gap 1.2 s
    frozen = _steady(145) + [_stream([0.05] * 20 + [1.2] + [0.05] * 19) for _ in range(5)]
    c = _judge(frozen)
    assert c.passed is False and c.value == pytest.approx(1200, rel=0.02)
    assert "longest gap between tokens p99" in c.detail and "chunked prefill" in c.detail
    assert (
        REGISTRY["llm.tpot_p99"]
        .fn(
            scenario("llm_shared_prefix", 30.0, tokens=_tokens(frozen)),
            resolve_params("llm.tpot_p99", {"stage": "steady"}),
        )
        .passed
    )
    # the same pauses in 1 % of the streams are the p99's tail only: still judged by the
    # threshold (the p99 is the 2nd-longest of 150 here, 50 ms) — a 1 % tail passes
    rare = _steady(149) + [_stream([0.05] * 20 + [1.2] + [0.05] * 19)]
    assert _judge(rare).passed is True
    # a stricter threshold is a parameter
    assert _judge(_steady(150), threshold=40).passed is False


def test_failed_streams_are_over_the_threshold_and_too_few_streams_skip() -> None:
    broken = _steady(140) + [_stream([0.05] * 40, finish=False) for _ in range(10)]
    c = _judge(broken)
    assert c.passed is False and c.value == float("inf")
    assert "10 of 150 requests failed" in c.detail
    few = _judge(_steady(50))
    assert few.passed is None and "too few" in few.detail
    # one-token streams have no gap: they do not count toward the p99's values
    single = _judge([_stream([]) for _ in range(150)])
    assert single.passed is None and "0 longest gap" in single.detail


def test_a_run_without_token_streams_is_skipped() -> None:
    sc = scenario("steady_state", 30.0)
    c = REGISTRY["llm.stall"].fn(sc, resolve_params("llm.stall", {}))
    assert c.passed is None and "--protocol openai" in c.detail


def _tokens(streams: list[Any]) -> dict[str, Any]:
    stats = StreamStats()
    for rec in streams:
        stats.record("steady", rec)
    return {"by_class": stats.summary(), "by_stage": stats.summary()}
