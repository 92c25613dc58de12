"""The LLM server's HTTP API, in-process: the shape of streams and answers (vLLM's), the
oracle's content, 400/404/429/503 answers, deadlines, disconnects, drain and /metrics.

The app is driven at the ASGI level on a real event loop with a small ``time_scale``:
what the app sends is what goes on the wire, with the time each piece was sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness_reference_server.llm.api import LLMState, create_llm_app
from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.faults import parse_llm_faults
from harness_reference_server.llm.tokens import expected_completion, tokenize

MODEL = "reference-llm"


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    chunks: list[tuple[float, bytes]]  # each body write, with the time it was sent

    @property
    def body(self) -> bytes:
        return b"".join(c for _, c in self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The SSE events' lines (``data: ...`` or ``: comment``), framing removed."""
        text = self.body.decode().replace("\r\n", "\n")
        return [e for e in text.split("\n\n") if e]

    def data(self) -> list[Any]:
        """Each ``data:`` payload, parsed (``[DONE]`` kept as the string)."""
        out = []
        for e in self.events():
            if e.startswith("data: "):
                payload = e[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out

    def content(self) -> str:
        return "".join(_delta_text(d) for d in self.data() if isinstance(d, dict))

    def token_times(self) -> list[float]:
        """When each chunk carrying generated text was sent."""
        times = []
        for t, chunk in self.chunks:
            for e in chunk.decode().replace("\r\n", "\n").split("\n\n"):
                if e.startswith("data: {") and _delta_text(json.loads(e[6:])):
                    times.append(t)
        return times


def _delta_text(doc: dict[str, Any]) -> str:
    out = ""
    for c in doc.get("choices") or []:
        out += c.get("text") or (c.get("delta") or {}).get("content") or ""
    return out


async def request(
    app: Any,
    method: str,
    path: str,
    doc: Any = None,
    *,
    raw: bytes | None = None,
    disconnect_after: int | None = None,
) -> Answer:
    """One request through the ASGI app; the client disconnects after
    ``disconnect_after`` body writes when given."""
    body = raw if raw is not None else (b"" if doc is None else json.dumps(doc).encode())
    gone = asyncio.Event()
    sent_body = False
    answer = Answer(0, {}, [])

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            if message.get("body"):
                answer.chunks.append((time.monotonic(), message["body"]))
            if disconnect_after is not None and len(answer.chunks) >= disconnect_after:
                gone.set()
            if not message.get("more_body", False):
                gone.set()

    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "scheme": "http",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return answer


def chat(content: str = "Tell me a story", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def completion(prompt: str = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **fields}


def serve(
    scenario: Callable[[Any, LLMState], Awaitable[None]],
    *faults: str,
    time_scale: float = 0.05,
    **config: Any,
) -> None:
    """Run ``scenario(app, state)`` against a started app, then stop it."""
    cfg = LLMConfig(time_scale=time_scale, faults=parse_llm_faults(faults), **config)

    async def main() -> None:
        app = create_llm_app(cfg)
        state = app.state.llm
        await state.start()
        try:
            await asyncio.wait_for(scenario(app, state), 30)
        finally:
            await state.stop()

    asyncio.run(main())


def scrape(state: LLMState) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(state.metrics.exposition().decode()):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


# -- shapes ---------------------------------------------------------------------------


def test_a_chat_stream_is_role_tokens_finish_usage_done() -> None:
    doc = chat(max_tokens=12, ignore_eos=True, stream=True, stream_options={"include_usage": True})

    async def scenario(app: Any, state: LLMState) -> None:
        a = await request(app, "POST", "/v1/chat/completions", doc)
        assert a.status == 200 and a.headers["content-type"].startswith("text/event-stream")
        data = a.data()
        assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        contents = [d["choices"][0]["delta"]["content"] for d in data[1:13]]
        want = expected_completion(messages=doc["messages"], max_tokens=12, ignore_eos=True)
        assert contents == list(want.tokens)  # one token per event
        assert data[13]["choices"][0]["finish_reason"] == "length"
        assert data[13]["choices"][0]["delta"] == {}
        assert data[14]["choices"] == []
        assert data[14]["usage"] == {
            "prompt_tokens": want.prompt_tokens,
            "completion_tokens": 12,
            "total_tokens": want.prompt_tokens + 12,
        }
        assert data[15] == "[DONE]" and len(data) == 16
        assert all(d["object"] == "chat.completion.chunk" for d in data[:15])
        assert len({d["id"] for d in data[:15]}) == 1

    serve(scenario)


def test_a_completions_stream_has_no_role_chunk_and_ends_with_stop_at_eos() -> None:
    doc = completion("The quick brown fox", max_tokens=2000, stream=True, seed=4, temperature=0.8)
    want = expected_completion(prompt=doc["prompt"], max_tokens=2000, seed=4, temperature=0.8)
    assert want.finish_reason == "stop"  # the oracle ends it before max_tokens

    async def scenario(app: Any, state: LLMState) -> None:
        a = await request(app, "POST", "/v1/completions", doc)
        data = a.data()
        assert all(d["object"] == "text_completion" for d in data[:-1])
        assert a.content() == want.text
        assert data[-2]["choices"][0]["finish_reason"] == "stop" and data[-1] == "[DONE]"
        assert "usage" not in data[-2]  # no include_usage: no usage chunk

    serve(scenario, time_scale=0.001)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_non_streaming_answer_holds_the_oracles_text_and_usage(path: str) -> None:
    is_chat = path.endswith("chat/completions")
    doc = chat(max_tokens=9, seed=2) if is_chat else completion(max_tokens=9, seed=2)

    async def scenario(app: Any, state: LLMState) -> None:
        a = await request(app, "POST", path, doc)
        assert a.status == 200
        got = a.json()
        want = expected_completion(
            messages=doc.get("messages"), prompt=doc.get("prompt"), max_tokens=9, seed=2
        )
        choice = got["choices"][0]
        text = choice["message"]["content"] if is_chat else choice["text"]
        assert text == want.text and choice["finish_reason"] == want.finish_reason
        assert got["object"] == ("chat.completion" if is_chat else "text_completion")
        assert got["usage"]["prompt_tokens"] == want.prompt_tokens
        assert got["usage"]["completion_tokens"] == want.completion_tokens

    serve(scenario)


BAD = [
    (b"{not json", 400, None),
    (json.dumps(chat(n=2)).encode(), 400, "n"),
    (json.dumps(chat(max_tokens=0)).encode(), 400, "max_tokens"),
    (json.dumps(chat(temperature=3)).encode(), 400, "temperature"),
    (json.dumps(chat(stream_options={"include_usage": True})).encode(), 400, "stream_options"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), 400, "messages"),
    (json.dumps({"model": MODEL, "messages": [{"role": "wizard"}]}).encode(), 400, "messages[0]"),
    (json.dumps(chat("word " * 5000)).encode(), 400, "messages"),
    (json.dumps({**chat(), "model": "gpt-9"}).encode(), 404, "model"),
    (json.dumps(chat(priority="high")).encode(), 400, "priority"),
]


@pytest.mark.parametrize(("raw", "status", "param"), BAD, ids=[p or "json" for _, _, p in BAD])
def test_a_bad_request_gets_an_openai_error_before_any_stream(
    raw: bytes, status: int, param: str | None
) -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        a = await request(app, "POST", "/v1/chat/completions", raw=raw)
        assert a.status == status and a.headers["content-type"] == "application/json"
        err = a.json()["error"]
        assert err["code"] == status and err["param"] == param and err["message"]

    serve(scenario)


def test_a_full_waiting_queue_answers_429_with_retry_after() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        long = chat(max_tokens=2000, ignore_eos=True, stream=True)  # ~0.6 s each
        running = asyncio.create_task(request(app, "POST", "/v1/chat/completions", long))
        await asyncio.sleep(0.02)
        waiting = asyncio.create_task(request(app, "POST", "/v1/chat/completions", long))
        await asyncio.sleep(0.01)
        shed = await request(app, "POST", "/v1/chat/completions", chat(max_tokens=1))
        assert shed.status == 429 and shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["code"] == 429
        assert not running.done() and not waiting.done()  # answered at once, not queued
        state.engine.abort_all("shutdown")
        await asyncio.gather(running, waiting)

    serve(scenario, max_num_seqs=1, max_waiting=1)


def test_models_health_and_vllm_metrics() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        models = (await request(app, "GET", "/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == MODEL
        assert (await request(app, "GET", "/health")).status == 200
        await request(app, "POST", "/v1/completions", completion(max_tokens=3))
        m = scrape(state)
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:time_to_first_token_seconds_count",
            "vllm:inter_token_latency_seconds_count",
        ):
            assert name in m, name
        assert m["vllm:time_to_first_token_seconds_count"] == 1
        assert m["vllm:generation_tokens_total"] == 3

    serve(scenario)


def test_a_shared_system_prompt_hits_the_prefix_cache_and_cuts_ttft() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 500}

    def ask(q: str) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [system, {"role": "user", "content": q}],
            "max_tokens": 1,
            "stream": True,
        }

    async def scenario(app: Any, state: LLMState) -> None:
        t0 = time.monotonic()
        cold = await request(app, "POST", "/v1/chat/completions", ask("first"))
        cold_ttft = cold.token_times()[0] - t0
        # the fastest of three warm requests: a tick lost to another process on a busy
        # machine lengthens one of them, never the simulated prefill they all skip
        warm_ttfts = []
        for q in ("second", "third", "fourth"):
            t0 = time.monotonic()
            warm = await request(app, "POST", "/v1/chat/completions", ask(q))
            warm_ttfts.append(warm.token_times()[0] - t0)
        m = scrape(state)
        assert m["vllm:prefix_cache_hits_total"] >= 3 * 2500  # of ~3,000 each (cold: ~62 ms)
        assert min(warm_ttfts) < cold_ttft / 2, (cold_ttft, warm_ttfts)

    serve(scenario, time_scale=1.0)


def test_a_deadline_ends_a_stream_with_an_error_and_a_request_with_503() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        doc = chat(max_tokens=1000, ignore_eos=True, deadline_s=0.05)
        s = await request(app, "POST", "/v1/chat/completions", {**doc, "stream": True})
        data = s.data()
        assert s.status == 200 and "error" in data[-2] and data[-1] == "[DONE]"
        r = await request(app, "POST", "/v1/chat/completions", doc)
        assert r.status == 503 and "deadline" in r.json()["error"]["message"]
        assert state.engine.kv.used_blocks == 0

    serve(scenario)


def test_a_client_disconnect_aborts_the_sequence_and_frees_its_blocks() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        doc = chat(max_tokens=1000, ignore_eos=True, stream=True)
        a = await request(app, "POST", "/v1/chat/completions", doc, disconnect_after=3)
        assert len(a.chunks) < 10
        await asyncio.sleep(0.01)
        assert state.engine.kv.used_blocks == 0 and not state.engine.running
        assert state.in_flight == 0

    serve(scenario)


def test_drain_finishes_running_streams_and_refuses_new_requests() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        doc = chat(max_tokens=300, ignore_eos=True, stream=True)  # ~90 ms
        stream = asyncio.create_task(request(app, "POST", "/v1/chat/completions", doc))
        await asyncio.sleep(0.01)
        drain = asyncio.create_task(state.drain(10))
        await asyncio.sleep(0)
        refused = await request(app, "POST", "/v1/chat/completions", doc)
        assert refused.status == 503
        assert await drain is True
        done = await stream
        assert len(tokenize(done.content())) == 300 and done.data()[-1] == "[DONE]"
        assert (await request(app, "GET", "/health")).status == 503

    serve(scenario)
