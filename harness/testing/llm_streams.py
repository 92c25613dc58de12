"""Streams recorded from the reference LLM server's app, in this process, byte for byte.

``record_streams(bodies, *faults)`` starts the app (``harness_reference_server.llm.api``) on an
event loop, sends every body at once (ASGI, no socket), and returns each answer as the
server wrote it: the status, and every body write with the ``time.perf_counter()`` at
which it was written. ``RecordedStream.replay`` feeds those writes, at those times, to a
``StreamRecorder`` (``harness.protocols.openai_stream``), as a client reading the socket
would see them when nothing in between re-splits or delays them.

With the default ``time_scale`` of 0.05 a step of the modelled engine takes about 0.3 ms,
so a 64-token stream is recorded in tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from harness.protocols.openai import CHAT_PATH, COMPLETIONS_PATH
from harness.protocols.openai_stream import StreamRecord, StreamRecorder
from harness_reference_server.llm.api import create_llm_app
from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.faults import parse_llm_faults

MODEL = LLMConfig().model_name


@dataclasses.dataclass
class RecordedStream:
    body: dict[str, Any]
    sent_at: float
    status: int = 0
    writes: list[tuple[float, bytes]] = dataclasses.field(default_factory=list)
    headers_at: float | None = None

    @property
    def raw(self) -> bytes:
        """The whole body, as written."""
        return b"".join(data for _, data in self.writes)

    @property
    def end_at(self) -> float:
        return self.writes[-1][0] if self.writes else (self.headers_at or self.sent_at)

    def replay(self, recorder: StreamRecorder | None = None, **options: Any) -> StreamRecord:
        """The record of this stream as a client sees it (a recorder built with
        ``options`` when none is given), each write fed at the time it was written."""
        if recorder is None:
            recorder = StreamRecorder(self.sent_at, **options)
        recorder.headers(self.status, self.headers_at or self.sent_at)
        for at, data in self.writes:
            recorder.feed(data, at)
        return recorder.finish(self.end_at)


async def _send(app: Any, stream: RecordedStream, delay_s: float) -> None:
    if delay_s:
        await asyncio.sleep(delay_s)
    body = json.dumps(stream.body).encode()
    path = CHAT_PATH if "messages" in stream.body else COMPLETIONS_PATH
    done = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if message["type"] == "http.response.start":
            stream.status, stream.headers_at = message["status"], now
        elif message["type"] == "http.response.body":
            if message.get("body"):
                stream.writes.append((now, message["body"]))
            if not message.get("more_body", False):
                done.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    stream.sent_at = time.perf_counter()
    await app(scope, receive, send)


def record_streams(
    bodies: Sequence[Mapping[str, Any]],
    *faults: str,
    time_scale: float = 0.05,
    delays_s: Sequence[float] | None = None,
    timeout_s: float = 30.0,
    **config: Any,
) -> list[RecordedStream]:
    """Each of ``bodies`` sent to a fresh reference LLM app with ``faults`` (``--fault``
    values such as ``"coalesce:4"``) and ``config`` (``LLMConfig`` fields): all at once,
    or body i ``delays_s[i]`` seconds after the start; the answers, in the order of
    ``bodies``."""
    delays = list(delays_s) if delays_s is not None else [0.0] * len(bodies)
    if len(delays) != len(bodies):
        raise ValueError(f"delays_s has {len(delays)} values for {len(bodies)} bodies")
    cfg = LLMConfig(time_scale=time_scale, faults=parse_llm_faults(faults), **config)
    streams = [RecordedStream(dict(b), 0.0) for b in bodies]

    async def main() -> None:
        app = create_llm_app(cfg)
        state = app.state.llm
        await state.start()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(_send(app, s, d) for s, d in zip(streams, delays, strict=True))),
                timeout_s,
            )
        finally:
            await state.stop()

    asyncio.run(main())
    return streams


def chunk_event(
    content: str | None = None,
    *,
    role: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = None,
    sep: bytes = b"\n\n",
) -> bytes:
    """One chat chunk as an SSE event, shaped as vLLM sends it: a delta with ``role``,
    ``content`` and ``reasoning_content`` as given (none: an empty delta) and
    ``finish_reason``; with ``usage`` = (prompt, completion) a usage chunk
    (``choices: []``) instead."""
    head: dict[str, Any] = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "model": MODEL}
    if usage is not None:
        prompt, completion = usage
        doc = {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    else:
        delta = {
            k: v
            for k, v in (("role", role), ("content", content), ("reasoning_content", reasoning))
            if v is not None
        }
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        doc = {**head, "choices": [choice]}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + sep


DONE_EVENT = b"data: [DONE]\n\n"


def record_stream(body: Mapping[str, Any], *faults: str, **options: Any) -> RecordedStream:
    """One body's answer (``record_streams`` with one body)."""
    return record_streams([body], *faults, **options)[0]


def synthetic_record(
    events: Sequence[tuple[float, bytes]],
    *,
    sent_at: float = 0.0,
    end_at: float | None = None,
    status: int = 200,
    **options: Any,
) -> StreamRecord:
    """The record of a stream whose body pieces (``chunk_event`` bytes, or any bytes)
    arrive at the given times; headers at ``sent_at``, the end at ``end_at`` (default:
    the last piece's time). ``options`` go to ``StreamRecorder``."""
    recorder = StreamRecorder(sent_at, **options)
    recorder.headers(status, sent_at)
    for at, data in events:
        recorder.feed(data, at)
    return recorder.finish(end_at if end_at is not None else (events[-1][0] if events else sent_at))


def whole_stream_record(token_times: Sequence[float], *, finish: bool = True) -> StreamRecord:
    """The record of a whole chat stream (not the reference server's: its text is not
    checked) whose token events (one token each) arrive at ``token_times`` after the send;
    then, at the last one's time, the finish chunk and the usage chunk (unless ``finish``
    is false: the stream ends without them) and ``[DONE]``."""
    events = [(t, chunk_event(f" w{i}")) for i, t in enumerate(token_times)]
    end = token_times[-1]
    if finish:
        events.append((end, chunk_event(finish_reason="length")))
        events.append((end, chunk_event(usage=(5, len(token_times)))))
    events.append((end, DONE_EVENT))
    return synthetic_record(events, usage_requested=True, count_tokens=None)
