"""The LLM server as a real process (``python -m harness_reference_server --api openai``): the
``openai`` client from PyPI streams chat and completions from it, a client that hangs up
frees its KV blocks, and SIGTERM finishes the running stream before exiting 0."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from harness.testing.server import ServerHandle, http_status, scrape, start_server, wait_until
from harness_reference_server.llm.tokens import expected_completion

pytestmark = pytest.mark.slow

MODEL = "reference-llm"


@contextlib.contextmanager
def llm_server(*args: str) -> Iterator[ServerHandle]:
    with start_server("--api", "openai", *args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        yield srv


def open_stream(
    srv: ServerHandle, doc: dict
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(doc), {"Content-Type": "application/json"}
    )
    return conn, conn.getresponse()


def test_the_openai_client_streams_chat_and_completions() -> None:
    openai = pytest.importorskip("openai")
    with llm_server("--time-scale", "0.2") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Write a haiku about load tests."}]
        want = expected_completion(messages=messages, max_tokens=24, seed=5, temperature=0.7)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            seed=5,
            temperature=0.7,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want.text
        assert chunks[-1].usage.completion_tokens == want.completion_tokens
        assert chunks[-1].usage.prompt_tokens == want.prompt_tokens

        prompt = "The three laws of queueing are"
        want = expected_completion(prompt=prompt, max_tokens=16, ignore_eos=True)
        stream = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=16, stream=True, extra_body={"ignore_eos": True}
        )
        pieces = [c.choices[0].text for c in stream if c.choices]
        assert "".join(pieces) == want.text

        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        assert answer.usage.completion_tokens <= 5
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=messages, n=2)
        assert [m.id for m in client.models.list()] == [MODEL]


def test_a_client_that_hangs_up_frees_its_blocks() -> None:
    with llm_server("--time-scale", "0.2") as srv:
        doc = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True,
               "max_tokens": 3000, "ignore_eos": True}  # fmt: skip
        conn, resp = open_stream(srv, doc)
        for _ in range(4):
            assert resp.readline().startswith(b"data: ") and resp.readline() == b"\n"
        assert scrape(srv.url)['vllm:kv_cache_usage_perc{model_name="reference-llm"}'] > 0
        conn.close()
        wait_until(
            lambda: scrape(srv.url)['vllm:num_requests_running{model_name="reference-llm"}'] == 0,
            timeout=10,
        )
        assert scrape(srv.url)['vllm:kv_cache_usage_perc{model_name="reference-llm"}'] == 0


def test_sigterm_finishes_the_running_stream_then_exits_0() -> None:
    with llm_server("--time-scale", "1") as srv:
        doc = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": True,
               "max_tokens": 200, "ignore_eos": True}  # fmt: skip
        conn, resp = open_stream(srv, doc)
        assert resp.readline().startswith(b"data: ")  # streaming for ~1.2 s (5.75 ms a token)
        t0 = time.monotonic()
        os.kill(srv.pid, signal.SIGTERM)
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) != 200, timeout=5)
        body = resp.read().decode()
        conn.close()
        assert body.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in body
        assert srv.proc.wait(15) == 0
        assert time.monotonic() - t0 < 10
