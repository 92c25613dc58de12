"""The OpenAI-compatible chat API as a scenario protocol (``--protocol openai``): request
bodies built from the token workload with the id spliced into ``user``, a model the server
does not list refused before load, each stream's outcome for the run's counters, and the
token checks (``llm.*``) judged from the per-stage token statistics."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness import protocols
from harness.checks import REGISTRY, Check, resolve_params
from harness.errors import ConfigError
from harness.load.llm_workload import (
    Conversation,
    build_plan,
    config_from_table,
    play_with_reference,
)
from harness.load.scenario import load_scenario
from harness.load.stream_exchange import outcome_of
from harness.load.stream_recording import StreamStats
from harness.protocols import ClassParams
from harness.protocols.openai import reference_expectation
from harness.protocols.openai_stream import Expectation
from harness.protocols.openai_wire import is_reference_server
from harness.testing.llm_streams import DONE_EVENT, chunk_event, synthetic_record
from harness.testing.results import scenario
from harness_reference_server.llm.tokens import chat_prompt, count_tokens

META = {
    "object": "list",
    "data": [{"id": "m", "object": "model", "owned_by": "harness_reference_server"}],
}
PROTO = protocols.get("openai")


def _pool(count: int = 8, seed: int = 1, **table: Any) -> list[dict[str, Any]]:
    template = PROTO.resolve_inputs(META, "m", tuple(f"{k}={v}" for k, v in table.items()), None)
    return PROTO.generate_inputs(template, count, seed)


def test_the_pool_is_the_seeded_workload_with_exact_prompt_lengths() -> None:
    pool = _pool(16, seed=3, input="uniform:min=20,max=40", output=12)
    assert pool == _pool(16, seed=3, input="uniform:min=20,max=40", output=12)
    assert pool != _pool(16, seed=4, input="uniform:min=20,max=40", output=12)
    for item in pool:
        body = item["body"]
        assert body["max_tokens"] == item["max_tokens"] == 12 and body["ignore_eos"] is True
        assert 20 <= item["prompt_tokens"] <= 40
        assert count_tokens(chat_prompt(body["messages"])) == item["prompt_tokens"]
        json.dumps(item)  # the plan carries it to every worker


def test_a_request_is_a_streamed_chat_body_with_its_id_in_user() -> None:
    item = _pool(1)[0]
    before, after = PROTO.request_parts(item, ClassParams("default"))
    body = json.loads(before + b"00ab00000000002a" + after)
    assert body["user"] == "00ab00000000002a"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "priority" not in body  # vLLM refuses one unless it schedules by priority
    hi = json.loads(b"X".join(PROTO.request_parts(item, ClassParams("high", priority=1))))
    assert hi["priority"] == 1
    # the oracle reads what decides the answer, not the id
    assert reference_expectation(body) == reference_expectation(item["body"])


def test_a_multi_turn_pool_is_each_conversations_first_turn_and_what_builds_the_rest() -> None:
    """The pool holds one conversation per input (as many as the pool unless the table
    says): its first turn's request, and the plan header, index and turn lengths from which
    the load engine builds every later turn from the answers, on any process."""
    table = {"workload": "multi_turn", "turns": "uniform:min=2,max=4", "input": 20, "output": 5}
    pool = _pool(6, seed=2, **table)
    assert len(pool) == 6
    plan = build_plan(config_from_table({**table, "conversations": 6, "seed": 2}, "t"))
    for i, item in enumerate(json.loads(json.dumps(pool))):  # as a worker receives it
        spec = item["conversation"]
        assert spec["index"] == i and spec["turns"] == plan["conversations"][i]
        assert "conversations" not in spec["plan"]
        played = play_with_reference(plan, i, "m")
        conv = Conversation(spec["plan"], spec["index"], "m", turns=spec["turns"])
        answer = None
        for k, (request, reference) in enumerate(played):
            again = PROTO.turn_input(conv.next_request(answer))
            if k == 0:
                assert {key: item[key] for key in again} == again
            assert again["body"] == {
                key: v for key, v in request.body.items() if key not in ("stream", "stream_options")
            }
            assert again["prompt_tokens"] == request.prompt_tokens
            answer = reference
        assert conv.done
    # the table's count wins over the pool's
    assert len(_pool(6, seed=2, conversations=3, **table)) == 3


def test_bad_workload_input_and_models_are_refused_before_load() -> None:
    with pytest.raises(ConfigError, match="does not list"):
        PROTO.resolve_inputs(META, "other", (), None)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        PROTO.resolve_inputs(META, "m", ("input:FP32:1,256",), None)
    with pytest.raises(ConfigError, match="workload"):
        PROTO.resolve_inputs(META, "m", ("api=completions",), None)
    with pytest.raises(ConfigError, match="sample-request"):
        PROTO.resolve_inputs(META, "m", (), "req.json")
    assert PROTO.default_model(META) == "m"
    assert is_reference_server(META)
    # a server that gives its context length refuses, before load, a workload that
    # cannot fit it (llm_shared_prefix's ~4,100 tokens against vLLM's 1,024)
    shared = load_scenario("llm_shared_prefix", "quick").llm
    short = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 1024}]}
    with pytest.raises(ConfigError, match=r"reach 4084 tokens .* max_model_len of 1024: start"):
        PROTO.resolve_inputs(short, "m", (), None, workload=shared)
    long = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]}
    assert PROTO.resolve_inputs(long, "m", (), None, workload=shared)
    assert not is_reference_server({"data": [{"id": "m", "owned_by": "vllm"}]})


def _stream(
    ttft: float, gap: float, n: int, *, finish: bool = True, usage: int | None = None
) -> Any:
    events = [(ttft + i * gap, chunk_event(f" w{i}")) for i in range(n)]
    end = events[-1][0]
    if finish:
        events.append((end, chunk_event(finish_reason="length")))
        events.append((end, chunk_event(usage=(5, n if usage is None else usage))))
    events.append((end, DONE_EVENT))
    # one token per event (a server that is not the reference server is read so)
    return synthetic_record(events, usage_requested=True, count_tokens=None)


def test_a_streams_outcome_names_what_ended_it() -> None:
    assert outcome_of(_stream(0.05, 0.01, 8)) == "ok"
    # usage that disagrees is a stream-integrity problem, not a failed request
    assert outcome_of(_stream(0.05, 0.01, 8, usage=7)) == "ok"
    assert outcome_of(_stream(0.05, 0.01, 8, finish=False)) == "truncated"
    assert outcome_of(synthetic_record([], status=429)) == "http_429"
    right = _stream(0.05, 0.01, 3)
    wrong = Expectation(text="something else entirely", finish_reason="length")
    events = [(0.05 + i * 0.01, chunk_event(f" w{i}")) for i in range(3)]
    events += [(0.08, chunk_event(finish_reason="length")), (0.08, DONE_EVENT)]
    assert outcome_of(synthetic_record(events, expected=wrong)) == "cross_wired"
    assert outcome_of(right) == "ok"


def _tokens(streams: list[Any], dropped: int = 0) -> dict[str, Any]:
    by_stage = StreamStats()
    for rec in streams:
        by_stage.record("steady", rec)
    for _ in range(dropped):
        by_stage.dropped("steady")
    return {"by_class": by_stage.summary(), "by_stage": by_stage.summary()}


def _judge(check_id: str, streams: list[Any], dropped: int = 0, **params: Any) -> Check:
    sc = scenario("llm_steady", 30.0, tokens=_tokens(streams, dropped))
    return REGISTRY[check_id].fn(sc, resolve_params(check_id, {"stage": "steady", **params}))


def test_ttft_and_tpot_p99_judge_the_stage_and_count_failures_as_over() -> None:
    healthy = [_stream(0.08, 0.02, 16) for _ in range(150)]
    slow_start = healthy[:140] + [_stream(3.0, 0.02, 16) for _ in range(10)]
    assert _judge("llm.ttft_p99", healthy).passed is True
    ttft = _judge("llm.ttft_p99", slow_start)
    assert ttft.passed is False and ttft.value == pytest.approx(3000, rel=0.01)
    stalled = healthy[:140] + [_stream(0.08, 0.5, 16) for _ in range(10)]
    assert _judge("llm.tpot_p99", healthy).passed is True
    assert _judge("llm.tpot_p99", stalled).passed is False
    broken = healthy[:140] + [_stream(0.08, 0.02, 16, finish=False) for _ in range(10)]
    c = _judge("llm.ttft_p99", broken)
    assert c.passed is False and "10 of 150 requests failed" in c.detail
    few = _judge("llm.ttft_p99", healthy[:50])
    assert few.passed is None and "too few" in few.detail
    # nearly every stream cut short: too few successes for a p99 of their own, but the
    # failures are the p99 (a failure, not a skip)
    cut = healthy[:2] + [_stream(0.08, 0.02, 16, finish=False) for _ in range(148)]
    for check_id in ("llm.ttft_p99", "llm.tpot_p99"):
        c = _judge(check_id, cut)
        assert c.passed is False and "148 of 150 requests failed" in c.detail, c


def test_stream_integrity_counts_wrong_usage_and_goodput_counts_whole_answers() -> None:
    healthy = [_stream(0.08, 0.02, 16) for _ in range(100)]
    assert _judge("llm.stream_integrity", healthy).passed is True
    lying = healthy[:97] + [_stream(0.08, 0.02, 16, usage=15) for _ in range(3)]
    c = _judge("llm.stream_integrity", lying)
    assert c.passed is False and c.value == 3 and "usage_mismatch 3" in c.detail
    assert _judge("llm.goodput", lying).passed is True  # whole answers, wrong usage
    cut = healthy[:95] + [_stream(0.08, 0.02, 16, finish=False) for _ in range(5)]
    g = _judge("llm.goodput", cut)
    assert g.passed is False and g.value == pytest.approx(0.95)
    assert _judge("llm.goodput", healthy, dropped=2).value == pytest.approx(100 / 102, abs=1e-4)
    none = REGISTRY["llm.goodput"].fn(
        scenario("steady_state", 30.0), resolve_params("llm.goodput", {})
    )
    assert none.passed is None and "--protocol openai" in none.detail


def test_a_failed_token_check_quotes_what_the_server_said_the_first_time() -> None:
    """A 400 for a prompt past the model's context (as vLLM answers it): goodput's and
    the p99s' counts say http_error; the detail quotes the server's body, so the fix is
    in the report, not in the server's log."""
    said = b'{"error": {"message": "maximum context length is 1024 tokens", "code": 400}}'
    refused = [synthetic_record([(0.01, said)], status=400) for _ in range(20)]
    healthy = [_stream(0.08, 0.02, 16) for _ in range(100)]
    g = _judge("llm.goodput", healthy + refused)
    assert g.passed is False and "http_error 20" in g.detail
    assert "the first http_error said: HTTP 400: " in g.detail
    assert "maximum context length is 1024 tokens" in g.detail
    # kept for the first few streams only, in each worker's cells and their merge
    a, b = StreamStats(), StreamStats()
    for rec in refused[:10]:
        a.record("steady", rec)
    for rec in refused[10:]:
        b.record("steady", rec)
    merged = StreamStats()
    for part in (a, b):
        merged.merge(part.drain())
    summary = merged.summary()
    assert summary["classes"]["steady"]["goodput"]["by_problem"] == {"http_error": 20}
    for cell in (summary["classes"]["steady"], summary["total"]):
        kept = cell["goodput"]["examples"]["http_error"]
        assert len(kept) == 2 and all("maximum context length" in k for k in kept)
    # a passing check says nothing more
    assert "said" not in _judge("llm.goodput", healthy).detail


def test_the_report_shows_the_token_figures_per_stage_in_stage_order() -> None:
    from harness.report.tokens import COLUMNS, token_rows, tokens_html, tokens_markdown

    by_stage, by_class = StreamStats(), StreamStats()
    for rec in [_stream(0.08, 0.02, 16) for _ in range(10)]:
        by_stage.record("steady", rec)
        by_class.record("default", rec)
    by_stage.record("warmup", _stream(0.1, 0.02, 16, finish=False))
    tokens = {"by_class": by_class.summary(), "by_stage": by_stage.summary()}
    stages = [
        {"name": "warmup", "start_s": 0.0, "end_s": 2.0},
        {"name": "steady", "start_s": 2.0, "end_s": 12.0},
    ]
    sc = scenario("llm_steady", 12.0, tokens=tokens, stages=stages)
    rows = token_rows(sc)
    assert rows is not None and [r[0] for r in rows] == ["warmup", "steady"]
    steady = dict(zip(COLUMNS, rows[1], strict=True))
    assert steady["streams"] == "10" and steady["failed"] == "0"
    assert steady["TTFT p99 ms"] == "80.1" and steady["tokens out/s"] == "16"
    assert "no_finish_reason 1" in rows[0][-1]
    assert "Token streams" in tokens_html(sc) and tokens_markdown(sc)[0] == "Token streams:"
    assert token_rows(scenario("steady_state", 12.0)) is None


def test_a_stream_the_in_flight_cap_kept_from_being_sent_counts_against_goodput() -> None:
    from harness.load.recording import Recording
    from harness.load.stream_exchange import StreamExchange

    rec = Recording()
    streams = StreamExchange(_pool(2), rec, timeout_s=5.0, verify=False)
    for _ in range(100):
        rec.tokens["class"].record("default", _stream(0.08, 0.02, 16))
        rec.tokens["stage"].record("steady", _stream(0.08, 0.02, 16))
    for _ in range(3):
        streams.dropped("default", "steady")
    tokens = {k: rec.tokens[k].summary() for k in ("class", "stage")}
    assert tokens["class"]["classes"]["default"]["dropped"] == 3
    sc = scenario(
        "llm_steady", 30.0, tokens={"by_class": tokens["class"], "by_stage": tokens["stage"]}
    )
    c = REGISTRY["llm.goodput"].fn(sc, resolve_params("llm.goodput", {"stage": "steady"}))
    assert c.passed is False and "dropped 3" in c.detail


def test_a_workload_that_does_not_ask_for_usage_holds_no_missing_usage_against_a_stream() -> None:
    """``include_usage = false`` (``--input include_usage=false``), for a server that never
    sends a usage chunk (llama-cpp-python ignores ``stream_options``): the requests do not
    ask for one, first turns and later turns alike, and a whole stream without it is
    whole, its tokens counted one per token-bearing event. Asked, as by default, the same
    stream is ``no_usage``."""
    import time

    from gevent.server import StreamServer

    from harness.load import http
    from harness.load.llm_workload import Conversation
    from harness.load.recording import Recording
    from harness.load.stream_exchange import StreamExchange
    from harness.testing.raw_http import requests_on

    asked = _pool(2, output=3)
    quiet = _pool(2, output=3, include_usage="false")
    assert all("include_usage" not in i for i in asked)
    assert all(i["include_usage"] is False for i in quiet)
    head, tail = PROTO.request_parts(quiet[0], ClassParams("default"))
    assert b"stream_options" not in head + tail and b'"stream":true' in head + tail
    head, tail = PROTO.request_parts(asked[0], ClassParams("default"))
    assert b'"stream_options":{"include_usage":true}' in head + tail
    turns = _pool(1, workload="multi_turn", turns=3, output=3, include_usage="false")
    spec = turns[0]["conversation"]
    conv = Conversation(spec["plan"], spec["index"], "m", turns=spec["turns"])
    conv.next_request(None)
    later = PROTO.turn_input(conv.next_request("an answer"))
    assert later["include_usage"] is False

    body = b"".join(
        [chunk_event(role="assistant", content=""), chunk_event(" a"), chunk_event(" b c"),
         chunk_event(" d"), chunk_event("", finish_reason="length"), DONE_EVENT]
    )  # fmt: skip

    def handle(sock: Any, _addr: Any) -> None:
        for _head, _body in requests_on(sock):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    got = {}
    try:
        raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        for name, pool in (("asked", asked), ("quiet", quiet)):
            recording = Recording()
            streams = StreamExchange(pool, recording, timeout_s=5.0, verify=False)
            conn = http.Connection("127.0.0.1", server.server_port)
            outcome, rec = streams.exchange_pool(
                conn, raw, 0, "default", "steady", time.perf_counter(), 0.0
            )
            conn.close()
            total = recording.tokens["class"].summary()["total"]
            got[name] = (outcome, rec.output_tokens, total["goodput"]["by_problem"])
    finally:
        server.stop(timeout=1)
    assert got["quiet"] == ("ok", 3, {}), got
    assert got["asked"][2] == {"no_usage": 1}, got
