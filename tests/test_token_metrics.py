"""Token metrics (harness/analysis/token_metrics.py) on streams with known answers: TPOT
from usage, inter-token latency per event and per token, the longest gap, tokens per
second (mean and 1-s peak), SLO attainment and goodput with failures non-conforming."""

from __future__ import annotations

import pytest

from harness.analysis import token_metrics as tm
from harness.protocols.openai import Generation, chat_body
from harness.protocols.openai_stream import StreamRecord
from harness.testing.llm_streams import (
    DONE_EVENT,
    MODEL,
    chunk_event,
    record_streams,
    synthetic_record,
)


def stream(
    tokens: list[tuple[float, str]],
    *,
    usage: int | None = None,
    prompt: int = 5,
    sent_at: float = 0.0,
    error: bool = False,
) -> StreamRecord:
    """A chat stream: a role chunk with the first token, each (time, text) an event, then
    finish, usage (when given) and [DONE] 1 ms after the last; or an error object there."""
    events = [(tokens[0][0], chunk_event("", role="assistant"))] if tokens else []
    events += [(at, chunk_event(text)) for at, text in tokens]
    end = (tokens[-1][0] if tokens else sent_at) + 0.001
    if error:
        tail = b'data: {"error":{"message":"boom","code":500}}\n\n'
    else:
        tail = chunk_event(finish_reason="length")
        tail += chunk_event(usage=(prompt, usage)) if usage is not None else b""
    return synthetic_record(
        [*events, (end, tail + DONE_EVENT)],
        sent_at=sent_at,
        prompt_tokens=prompt,
        usage_requested=usage is not None,
    )


THREE = [(0.1, " ba be"), (0.2, " bi"), (0.4, " bo bu")]  # 2 + 1 + 2 tokens


def test_tpot_is_the_first_to_last_token_span_over_the_tokens_after_the_first() -> None:
    assert tm.tpot_s(stream(THREE)) == pytest.approx(0.3 / 4)  # 5 tokens by the tokenizer
    assert tm.tpot_s(stream(THREE, usage=7)) == pytest.approx(0.3 / 6)  # usage wins
    assert tm.tpot_s(stream([(0.1, " ba")], usage=1)) is None
    assert tm.tpot_s(stream([(0.1, " ba be")])) == 0.0  # 2 tokens in one event: no span


def test_inter_token_latency_per_event_and_per_token() -> None:
    record = stream(THREE)
    assert tm.event_gaps_s(record) == pytest.approx([0.1, 0.2])
    assert tm.token_gaps_s(record) == pytest.approx([0.1, 0.1, 0.1])  # 0.2 over 2 tokens
    assert sum(tm.token_gaps_s(record)) == pytest.approx(0.4 - 0.1)
    assert tm.max_gap_s(record) == pytest.approx(0.2)
    assert tm.max_gap_s(stream([(0.1, " ba")])) is None


def test_one_token_per_event_makes_the_mean_token_gap_the_tpot() -> None:
    record = stream([(0.1 + 0.013 * i, " ba") for i in range(10)], usage=10)
    gaps = tm.token_gaps_s(record)
    assert sum(gaps) / len(gaps) == pytest.approx(tm.tpot_s(record))


def test_distributions_leave_out_failed_requests() -> None:
    ok, failed = stream(THREE, usage=5), stream(THREE, error=True)
    assert failed.failed and not ok.failed
    assert tm.ttfts_s([ok, failed]) == pytest.approx([0.1])
    assert tm.tpots_s([ok, failed]) == pytest.approx([0.3 / 4])
    assert tm.pooled_event_gaps_s([ok, failed]) == pytest.approx([0.1, 0.2])
    assert tm.pooled_token_gaps_s([ok, failed]) == pytest.approx([0.1, 0.1, 0.1])
    assert tm.max_gaps_s([ok, failed]) == pytest.approx([0.2])


def test_tokens_per_second_mean_and_peak_over_one_second_windows() -> None:
    a = stream([(0.5, " ba be"), (1.5, " bi bo")], usage=4, prompt=10)  # ends at 1.501
    b = stream([(1.2, " ba be bi")], usage=3, prompt=6, sent_at=1.0)
    rate = tm.token_throughput([a, b], start=0.0, end=2.0)
    assert rate.output_tokens == pytest.approx(7) and rate.input_tokens == 16
    assert rate.output_mean == pytest.approx(3.5) and rate.output_peak == pytest.approx(5)
    # prompt tokens count when their prefill was done: at the first token
    assert rate.input_mean == pytest.approx(8) and rate.input_peak == pytest.approx(10)
    half = tm.token_throughput([a, b], start=0.0, end=2.0, window_s=0.5)
    assert half.output_peak == pytest.approx(3 / 0.5)  # b's 3 tokens in [1.0, 1.5)


def test_event_counts_are_scaled_to_usage_and_tokens_outside_the_span_left_out() -> None:
    record = stream([(0.2, " ba"), (0.7, " be")], usage=6)  # 2 counted, usage says 6
    rate = tm.token_throughput([record], start=0.0, end=1.0)
    assert rate.output_tokens == pytest.approx(6)
    assert tm.token_throughput([record], start=0.5, end=1.0).output_tokens == pytest.approx(3)
    # a token at the very end of the span counts, in the last window
    assert tm.token_throughput([record], start=0.0, end=0.7).output_tokens == pytest.approx(6)
    default = tm.token_throughput([record])  # the span: the send to the last end
    assert (default.start, default.duration_s) == (0.0, pytest.approx(0.701))
    with pytest.raises(ValueError, match="window_s"):
        tm.token_throughput([record], window_s=0)


def test_slo_attainment_counts_failures_as_non_conforming_and_bounds_as_inclusive() -> None:
    slo = tm.SLO(ttft_s=0.5, tpot_s=0.0625)  # binary fractions: exact equality
    on_the_bound = stream([(0.5, " ba"), (0.5625, " be")], usage=2)
    late = stream([(0.6, " ba"), (0.61, " be")], usage=2)
    slow_tokens = stream([(0.1, " ba"), (0.2, " be")], usage=2)  # TPOT 100 ms
    errored = stream([(0.1, " ba")], error=True)
    one_token = stream([(0.1, " ba")], usage=1)  # no TPOT: nothing to be late
    no_token = stream([], usage=0)
    records = [on_the_bound, late, slow_tokens, errored, one_token, no_token]
    assert [tm.conforms(r, slo) for r in records] == [True, False, False, False, True, False]
    result = tm.slo_attainment(records, slo, duration_s=4.0)
    assert (result.requests, result.conforming, result.failed) == (6, 2, 2)
    assert result.attainment == pytest.approx(2 / 6) and result.goodput_rps == pytest.approx(0.5)
    assert tm.slo_attainment([], slo).attainment is None


def test_a_stall_bound_judges_the_longest_gap() -> None:
    stalled = stream([(0.1, " ba"), (0.2, " be"), (1.4, " bi"), (1.5, " bo")], usage=4)
    assert tm.conforms(stalled, tm.SLO(ttft_s=1.0, tpot_s=1.0))
    assert not tm.conforms(stalled, tm.SLO(max_gap_s=1.0))
    assert tm.conforms(stalled, tm.SLO(max_gap_s=1.2))
    assert not tm.conforms(stalled, tm.SLO(e2e_s=1.5))  # it ended at 1.501


def test_reference_server_streams_agree_with_their_usage() -> None:
    body = chat_body(
        MODEL, [{"role": "user", "content": "Tell me"}], Generation(max_tokens=16, ignore_eos=True)
    )
    records = [s.replay() for s in record_streams([body] * 4, "coalesce:2")]
    assert all(r.problems == () for r in records)
    rate = tm.token_throughput(records)
    assert rate.output_tokens == pytest.approx(64)
    assert rate.input_tokens == sum(r.prompt_tokens or 0 for r in records)
    assert len(tm.pooled_token_gaps_s(records)) == 4 * 14  # all but each first event's 2
    assert len(tm.pooled_event_gaps_s(records)) == 4 * 7
    attained = tm.slo_attainment(records, tm.SLO(ttft_s=10.0, tpot_s=10.0))
    assert attained.attainment == 1.0
