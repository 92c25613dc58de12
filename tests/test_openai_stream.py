"""The OpenAI-compatible codec and stream recorder (harness/protocols/openai.py,
openai_stream.py): request bodies, chunk reading, and what a record says about the
reference server's real streams — clean, with each measurement trap (N tokens per event,
role chunk at accept, \\r\\n framing), and with each stream defect (error inside a 200,
usage lie, truncation, cross-wired text) — and about synthetic streams with exact times.
"""

from __future__ import annotations

import http.client
import json
import time

import pytest

from harness.analysis.token_metrics import tpot_s
from harness.protocols.openai import (
    CHAT_PATH,
    Generation,
    chat_body,
    completion_body,
    encode_body,
    read_chunk,
    reference_expectation,
)
from harness.protocols.openai_stream import Expectation, StreamRecord, StreamRecorder
from harness.testing.llm_streams import (
    DONE_EVENT,
    MODEL,
    chunk_event,
    record_stream,
    record_streams,
    synthetic_record,
)
from harness.testing.server import http_status, start_server, wait_until
from harness_reference_server.llm.tokens import VOCABULARY, count_tokens

MESSAGES = [{"role": "user", "content": "Tell me a story"}]
GEN = Generation(max_tokens=24, ignore_eos=True, seed=11, temperature=0.7)
BODY = chat_body(MODEL, MESSAGES, GEN)


def expected(body: dict) -> Expectation:
    return Expectation.from_completion(reference_expectation(body))


def codes(record: StreamRecord) -> set[str]:
    return {str(c) for c in record.codes()}


# -- request bodies ------------------------------------------------------------------------


def test_bodies_carry_the_fields_set_and_leave_the_rest_to_the_server() -> None:
    assert BODY == {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 24,
        "temperature": 0.7,
        "seed": 11,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    plain = completion_body(MODEL, "Once", Generation(stream=False), priority=3)
    assert plain == {"model": MODEL, "prompt": "Once", "stream": False, "priority": 3}
    no_usage = chat_body(MODEL, MESSAGES, Generation(include_usage=False, priority=-1))
    assert "stream_options" not in no_usage and no_usage["priority"] == -1


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_the_reference_expectation_is_what_the_server_streams(chat: bool) -> None:
    body = BODY if chat else completion_body(MODEL, "Once upon a time", GEN)
    record = record_stream(body).replay(expected=expected(body))
    want = reference_expectation(body)
    assert record.problems == ()
    assert record.text == want.text and record.output_tokens == want.completion_tokens == 24
    assert record.prompt_tokens == want.prompt_tokens
    assert record.finish_reason == want.finish_reason == "length"


# -- reading chunks ------------------------------------------------------------------------


def _data(event: bytes) -> str:
    return event.decode().removeprefix("data: ").strip()


def test_a_role_chunk_an_empty_delta_and_a_usage_chunk_carry_no_token() -> None:
    role = read_chunk(_data(chunk_event("", role="assistant")))
    assert role.role == "assistant" and not role.token_bearing
    assert not read_chunk(_data(chunk_event())).token_bearing
    finish = read_chunk(_data(chunk_event(finish_reason="stop")))
    assert finish.finish_reason == "stop" and not finish.token_bearing
    usage = read_chunk(_data(chunk_event(usage=(7, 3))))
    assert usage.usage is not None and usage.usage.completion_tokens == 3
    assert not usage.token_bearing


def test_content_reasoning_tool_call_and_completion_text_are_tokens() -> None:
    assert read_chunk(_data(chunk_event(" hi"))).content == " hi"
    thinking = read_chunk(_data(chunk_event(reasoning=" hmm")))
    assert thinking.token_bearing and thinking.content == "" and thinking.reasoning == " hmm"
    tool = read_chunk(
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        '{"name":"get","arguments":"{\\"q\\""}}]},"finish_reason":null}]}'
    )
    assert tool.token_bearing and tool.tool_calls == 'get{"q"'
    # during reasoning some servers send "content": null, others "": neither hides it
    for empty in (None, ""):
        doc = json.dumps({"choices": [{"delta": {"content": empty, "reasoning": " r"}}]})
        assert read_chunk(doc).reasoning == " r" and read_chunk(doc).token_bearing
    text = read_chunk('{"object":"text_completion","choices":[{"index":0,"text":" x"}]}')
    assert text.content == " x" and text.token_bearing


def test_done_errors_and_malformed_events_are_told_apart() -> None:
    assert read_chunk("[DONE]").done
    err = read_chunk('{"error":{"message":"boom","type":"InternalServerError","code":500}}')
    assert err.error == "boom (code 500)"
    assert read_chunk('{"message":"x"}', event="error").error is not None
    assert read_chunk('{"object":"error","message":"old vLLM"}').error == "old vLLM"
    assert read_chunk("{not json").malformed
    assert read_chunk("[1, 2]").malformed
    assert read_chunk('{"choices": 3}').malformed


# -- the reference server's streams ----------------------------------------------------------


def test_a_clean_chat_stream_times_the_first_content_not_the_role_chunk() -> None:
    stream = record_stream(BODY)
    record = stream.replay(expected=expected(BODY))
    assert record.problems == () and not record.failed
    assert record.tokens_from == "usage" and record.event_tokens_from == "tokenizer"
    assert record.token_counts == (1,) * 24 and record.done and record.comments == 0
    # the role chunk goes out with the first token here: the same write, the same time
    first_write_at = stream.writes[0][0]
    assert record.ttft_s == pytest.approx(first_write_at - stream.sent_at)
    assert record.headers_s is not None and record.headers_s <= record.ttft_s
    assert record.end_s >= record.token_times_s[-1]


def test_role_chunk_at_accept_moves_the_first_event_but_not_ttft() -> None:
    stream = record_stream(BODY, "role-prelude-early")
    record = stream.replay(expected=expected(BODY))
    assert record.problems == ()
    role_at, _ = stream.writes[0]
    first_token_at, first_token = stream.writes[1]
    assert b'"role":"assistant"' in stream.writes[0][1] and b'"content":" ' in first_token
    assert record.first_event_s == pytest.approx(role_at - stream.sent_at)
    assert record.ttft_s == pytest.approx(first_token_at - stream.sent_at)
    assert record.first_event_s < record.ttft_s


def test_crlf_framing_records_the_same_stream_as_lf_framing() -> None:
    lf = record_stream(BODY).replay(expected=expected(BODY))
    crlf_stream = record_stream(BODY, "crlf-framing")
    assert b"\r\n\r\n" in crlf_stream.raw
    crlf = crlf_stream.replay(expected=expected(BODY))
    assert crlf.problems == ()
    for field in ("text", "token_counts", "output_tokens", "finish_reason", "usage", "events"):
        assert getattr(crlf, field) == getattr(lf, field), field


def test_n_tokens_per_event_are_counted_from_the_text_and_the_total_from_usage() -> None:
    record = record_stream(BODY, "coalesce:4").replay(expected=expected(BODY))
    assert record.problems == ()
    assert record.token_counts == (4,) * 6 and record.output_tokens == 24
    # without the server's tokenizer an event counts 1, and usage still gives the total
    blind = record_stream(BODY, "coalesce:4").replay(count_tokens=None)
    assert blind.token_counts == (1,) * 6 and blind.output_tokens == 24
    assert (blind.tokens_from, blind.event_tokens_from) == ("usage", "events")
    assert blind.problems == ()


def _token_events(
    times: list[float], per_event: int, usage: int | None
) -> list[tuple[float, bytes]]:
    """Token i generated at times[i], sent per_event to an event at its last token's
    time; a role chunk with the first event; finish, usage and [DONE] after the last."""
    words = [" " + VOCABULARY[i] for i in range(len(times))]
    events = [(times[0], chunk_event("", role="assistant"))]
    for i in range(0, len(times), per_event):
        last = min(i + per_event, len(times)) - 1
        events.append((times[last], chunk_event("".join(words[i : last + 1]))))
    end = times[-1] + 0.001
    tail = chunk_event(finish_reason="length")
    tail += chunk_event(usage=(5, usage)) if usage is not None else b""
    return [*events, (end, tail + DONE_EVENT)]


def test_coalescing_moves_ttft_by_less_than_one_event_and_tpot_from_usage_stays_right() -> None:
    n, per_event = 32, 4
    times = [0.100 + 0.010 * i for i in range(n)]
    plain = synthetic_record(_token_events(times, 1, usage=n))
    lumped = synthetic_record(_token_events(times, per_event, usage=n))
    assert plain.problems == () and lumped.problems == ()
    assert plain.ttft_s == pytest.approx(0.100) and lumped.ttft_s == pytest.approx(0.130)
    one_event = lumped.max_gap_s
    assert one_event == pytest.approx(0.040)
    assert lumped.ttft_s - plain.ttft_s < one_event
    assert tpot_s(plain) == pytest.approx(0.010)
    # (t_last - t_first) over the usage count: short of the true 10 ms by the tokens the
    # first event hid, (N - 1) / (n - 1); counting events as tokens would read 40 ms
    assert tpot_s(lumped) == pytest.approx(0.28 / 31)
    assert tpot_s(lumped) >= tpot_s(plain) * (n - per_event) / (n - 1) - 1e-12


def test_an_error_inside_a_200_fails_the_stream() -> None:
    record = record_stream(BODY, "error-in-200:1").replay(expected=expected(BODY))
    assert record.status == 200 and record.failed
    assert codes(record) == {"error_in_stream"}  # its tokens so far are the oracle's prefix
    assert record.output_tokens == 12 and record.tokens_from == "tokenizer"


def test_a_usage_lie_is_caught_and_the_answer_still_counts_as_whole() -> None:
    record = record_stream(BODY, "usage-lie").replay(expected=expected(BODY))
    assert codes(record) == {"usage_mismatch"} and not record.failed
    assert "25" in record.problems[0].detail and "24" in record.problems[0].detail


def test_a_stream_cut_mid_event_is_truncated_without_finish_or_done() -> None:
    stream = record_stream(BODY)
    raw = stream.raw
    cut = raw.index(b'"content":', len(raw) // 2) + 5
    record = synthetic_record([(0.01, raw[:cut])], expected=expected(BODY))
    assert record.failed
    assert codes(record) == {"truncated_at_close", "no_finish_reason", "no_done"}


@pytest.mark.parametrize("timer", ["deadline", "stall"])
def test_a_stream_the_clients_timer_ends_is_a_failure_but_not_an_untrue_stream(
    timer: str,
) -> None:
    """The same cut as above, made by the client's deadline or stall timer: the request
    failed (its own code), but what the server had no chance to send — the finish reason,
    [DONE], the rest of the event — is not the server's problem; the text is still held to
    the oracle as a prefix."""
    from harness.protocols.openai_stream import Problem, ProblemCode

    raw = record_stream(BODY).raw
    cut = raw.index(b'"content":', len(raw) // 2) + 5
    recorder = StreamRecorder(0.0, expected=expected(BODY))
    recorder.headers(200, 0.0)
    recorder.feed(raw[:cut], 0.01)
    record = recorder.finish(0.5, Problem(ProblemCode(timer), "the client's timer"))
    assert record.failed and codes(record) == {timer}
    assert record.ttft_s is not None and 0 < record.output_tokens < 24

    # a cut text that is not the oracle's prefix is still untrue
    swapped = raw[:cut].replace(b'"content":"', b'"content":"zz', 2)
    recorder = StreamRecorder(0.0, expected=expected(BODY))
    recorder.headers(200, 0.0)
    recorder.feed(swapped, 0.01)
    record = recorder.finish(0.5, Problem(ProblemCode(timer), "the client's timer"))
    assert codes(record) == {timer, "wrong_text"}


def test_a_stream_ended_by_another_request_is_truncated() -> None:
    """truncate-on-arrival: the running stream gets [DONE] without a finish_reason."""
    bodies = [BODY, chat_body(MODEL, [{"role": "user", "content": "Hi"}], GEN)]
    first, second = record_streams(bodies, "truncate-on-arrival", delays_s=[0.0, 0.004])
    cut = first.replay(expected=expected(BODY))
    # what it got (usually some tokens; none if the second request came first) is the
    # oracle's prefix: no wrong_text
    assert cut.failed and codes(cut) - {"no_tokens"} == {"no_finish_reason"} and cut.done
    assert cut.output_tokens < 24
    assert second.replay(expected=expected(bodies[1])).problems == ()


def test_cross_wired_text_differs_from_the_oracle() -> None:
    bodies = [chat_body(MODEL, [{"role": "user", "content": f"Story {i}"}], GEN) for i in range(4)]
    records = [
        s.replay(expected=expected(b))
        for s, b in zip(record_streams(bodies, "cross-stream:1"), bodies, strict=True)
    ]
    assert all(codes(r) == {"wrong_text"} for r in records)
    assert all(not r.failed for r in records)  # whole answers, but not theirs
    assert "differs from the expected completion at character" in records[0].problems[0].detail


def test_a_stream_without_done_or_usage_is_reported_but_whole() -> None:
    events = _token_events([0.1, 0.2], 1, usage=None)
    at, tail = events[-1]
    record = synthetic_record([*events[:-1], (at, tail.replace(DONE_EVENT, b""))])
    assert codes(record) == {"no_done", "no_usage"} and not record.failed
    assert record.tokens_from == "tokenizer" and record.output_tokens == 2
    quiet = synthetic_record(events, usage_requested=False)
    assert quiet.problems == ()


def test_an_error_status_fails_the_request_with_its_body() -> None:
    record = synthetic_record(
        [(0.01, b'{"error":{"message":"queue full"}}')], status=429, expected=expected(BODY)
    )
    assert codes(record) == {"http_error"} and record.failed
    assert "429" in record.problems[0].detail and "queue full" in record.problems[0].detail


def test_keep_alive_comments_are_counted_and_the_stall_is_the_longest_gap() -> None:
    record = record_stream(BODY, "stream-stall:0.03").replay(expected=expected(BODY))
    assert record.problems == () and record.comments >= 2
    assert record.max_gap_s is not None and record.max_gap_s >= 0.03


def test_a_golden_answer_checks_another_servers_stream_without_its_tokenizer() -> None:
    body = chat_body(MODEL, MESSAGES, Generation(max_tokens=16, temperature=0))
    clean = record_stream(body).replay(count_tokens=None)
    golden = Expectation.golden(clean)
    assert golden.completion_tokens == 16 and golden.finish_reason == "length"
    again = record_stream(body).replay(count_tokens=None, expected=golden)
    assert again.problems == ()
    lied = record_stream(body, "usage-lie").replay(count_tokens=None, expected=golden)
    assert codes(lied) == {"usage_mismatch"}
    other = dict(body, messages=[{"role": "user", "content": "Something else"}])
    wrong = record_stream(other).replay(count_tokens=None, expected=golden)
    assert "wrong_text" in codes(wrong)
    with pytest.raises(ValueError, match="clean stream"):
        Expectation.golden(lied)


def test_a_golden_answer_survives_json_and_a_damaged_one_names_its_field() -> None:
    golden = Expectation(" ba be", "length", 2)
    assert Expectation.from_dict(json.loads(json.dumps(golden.as_dict()))) == golden
    assert Expectation.from_dict({"text": " ba"}) == Expectation(" ba")
    for doc, field in (
        ([], "an object"),
        ({"text": 3}, "'text'"),
        ({"text": "", "completion_tokens": True}, "'completion_tokens'"),
        ({"text": "", "finish_reason": 1}, "'finish_reason'"),
    ):
        with pytest.raises(ValueError, match=field):
            Expectation.from_dict(doc)


def test_usage_below_the_token_events_is_a_lie_even_without_a_tokenizer() -> None:
    events = _token_events([0.1, 0.2, 0.3], 1, usage=2)
    record = synthetic_record(events, count_tokens=None)
    assert codes(record) == {"usage_mismatch"}
    assert count_tokens(" ba be") == 2  # the reference tokenizer: one token per word


def test_a_stream_with_no_token_fails_even_with_a_finish_reason() -> None:
    events = [(0.1, chunk_event("", role="assistant") + chunk_event(finish_reason="stop"))]
    record = synthetic_record([*events, (0.2, chunk_event(usage=(5, 0)) + DONE_EVENT)])
    assert codes(record) == {"no_tokens"} and record.failed and record.ttft_s is None


def test_the_send_delay_counts_in_every_latency() -> None:
    events = _token_events([1.1, 1.2], 1, usage=2)
    late = synthetic_record(events, sent_at=1.05, intended_at=1.0)
    assert late.dispatch_delay_s == pytest.approx(0.05)
    assert late.ttft_s == pytest.approx(0.1) and late.end_s == pytest.approx(0.201)


@pytest.mark.slow
def test_a_real_socket_read_line_by_line_times_every_event_apart() -> None:
    """The reference server as a process, \\r\\n framing, read with readline as the
    streaming user will: the record is clean and each token event has its own time."""
    body = chat_body(MODEL, MESSAGES, Generation(max_tokens=32, ignore_eos=True, seed=2))
    args = ("--api", "openai", "--time-scale", "0.5", "--fault", "crlf-framing")
    with start_server(*args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        try:
            recorder = StreamRecorder(time.perf_counter(), expected=expected(body))
            conn.request("POST", CHAT_PATH, encode_body(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            recorder.headers(response.status, time.perf_counter())
            while line := response.readline():
                recorder.feed(line, time.perf_counter())
            record = recorder.finish(time.perf_counter())
        finally:
            conn.close()
    assert record.problems == (), record.problems
    assert record.output_tokens == 32 and record.token_counts == (1,) * 32
    assert len(set(record.token_times_s)) == 32  # no two events lumped into one read
    assert 0 < record.headers_s <= record.ttft_s < record.token_times_s[-1] <= record.end_s
