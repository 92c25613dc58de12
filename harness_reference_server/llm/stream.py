"""Writing one generation as server-sent events, token by token.

One event per token (``data: {json}`` and a blank line), written as soon as the engine
delivers it; tokens delivered together are written in one send, still one event each.
The planted stream faults and measurement traps (harness_reference_server/llm/faults.py) act
here: stream-stall, usage-lie, error-in-200, role-prelude-early, coalesce, crlf-framing.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Send

from harness_reference_server.llm.requests import LLMRequest, error_doc
from harness_reference_server.llm.sequence import Sequence

if TYPE_CHECKING:
    from harness_reference_server.llm.api import LLMState

STALL_AFTER_TOKENS = 4  # stream-stall: the stalled stream stops after this many tokens
STALL_EVERY = 10  # stream-stall: one stream in this many (the first, the 11th, ...)


def usage(state: LLMState, req: LLMRequest, seq: Sequence) -> dict[str, int]:
    """The request's usage: prompt tokens as the shipped tokenizer counts them,
    completion tokens as generated (one more with usage-lie)."""
    completion = len(seq.output) + (1 if state.config.faults.usage_lie else 0)
    prompt = len(req.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def fail_point(state: LLMState, req: LLMRequest) -> int | None:
    """error-in-200: the token count at which this request fails, or None (seeded draw)."""
    p = state.config.faults.error_in_200_p
    if not p or state.rng.random() >= p:
        return None
    return max(1, req.max_tokens // 2)


class StreamWriter:
    """Writes ``seq`` to ``send`` as SSE until its end; returns when the stream is done."""

    def __init__(self, state: LLMState, req: LLMRequest, seq: Sequence, send: Send) -> None:
        self.state, self.req, self.seq, self.send = state, req, seq, send
        faults = state.config.faults
        self.sep = b"\r\n\r\n" if faults.crlf_framing else b"\n\n"
        self.per_event = faults.coalesce_tokens or 1
        self.fail_at = fail_point(state, req)
        stalled = faults.stream_stall_s and state.streams % STALL_EVERY == 0
        self.stall_s = faults.stream_stall_s if stalled else None
        state.streams += 1
        rid = os.urandom(12).hex()
        head = {"created": int(time.time()), "model": state.config.model_name}
        if req.chat:
            head = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", **head}
        else:
            head = {"id": f"cmpl-{rid}", "object": "text_completion", **head}
        self.head = head
        if seq.timings is not None:
            seq.timings.id = head["id"]
        # a token's event is this prefix, the JSON string of its text, this suffix
        opening = json.dumps(head, separators=(",", ":"))[:-1]
        if req.chat:
            self._pre = (opening + ',"choices":[{"index":0,"delta":{"content":').encode()
            self._post = b'},"logprobs":null,"finish_reason":null}]}'
        else:
            self._pre = (opening + ',"choices":[{"index":0,"text":').encode()
            self._post = b',"logprobs":null,"finish_reason":null}]}'
        self.sent = 0
        self.role_sent = not req.chat

    def _event(self, doc: Any) -> bytes:
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + self.sep

    def _tokens(self, texts: list[str]) -> bytes:
        return b"".join(
            b"data: "
            + self._pre
            + json.dumps("".join(texts[i : i + self.per_event])).encode()
            + self._post
            + self.sep
            for i in range(0, len(texts), self.per_event)
        )

    def _role(self) -> bytes:
        self.role_sent = True
        delta = {"role": "assistant", "content": ""}
        return self._event(
            {
                **self.head,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
            }
        )

    async def _write(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def run(self) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        if self.state.config.faults.role_prelude_early:
            await self._write(self._role())
        seq, held = self.seq, []
        while True:
            if not seq.outbox and not seq.finished:
                await seq.event.wait()
            held += seq.take()
            if (
                self.fail_at is not None
                and self.sent + len(held) >= self.fail_at
                and not seq.finished
            ):
                held = held[: self.fail_at - self.sent]
                self.state.engine.abort(seq, "error")
            if len(held) < self.per_event and not seq.finished:
                continue  # coalesce: wait for N tokens
            if self.stall_s is not None and self.sent + len(held) >= STALL_AFTER_TOKENS:
                cut = STALL_AFTER_TOKENS - self.sent
                await self._flush(held[:cut])
                held = held[cut:]
                await self._stall()
                continue
            whole = len(held) if seq.finished else len(held) - len(held) % self.per_event
            await self._flush(held[:whole])
            held = held[whole:]
            if seq.finished:
                break
        await self._finish()

    async def _flush(self, texts: list[str]) -> None:
        if not texts:
            return
        data = self._tokens(texts)
        if not self.role_sent:
            data = self._role() + data
        self.sent += len(texts)
        await self._write(data)
        if self.seq.timings is not None:  # the write was handed to the transport
            step = self.per_event
            self.seq.timings.written(
                [min(step, len(texts) - i) for i in range(0, len(texts), step)]
            )

    async def _stall(self) -> None:
        stall_s, self.stall_s = self.stall_s or 0.0, None
        interval = min(1.0, stall_s / 3)
        end = time.monotonic() + stall_s
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(interval, left))
            await self._write(b": keep-alive" + self.sep)

    async def _finish(self) -> None:
        reason = self.seq.finish_reason
        if reason == "disconnect":
            return
        out = b""
        if reason in ("stop", "length"):
            if not self.role_sent:
                out += self._role()
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
            if not self.req.chat:
                choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
            out += self._event({**self.head, "choices": [choice]})
            if self.req.include_usage:
                out += self._event(
                    {**self.head, "choices": [], "usage": usage(self.state, self.req, self.seq)}
                )
        elif reason == "error":
            out += self._event(error_doc(500, "internal error while generating"))
        elif reason == "deadline":
            out += self._event(error_doc(503, "the request's deadline_s passed before it finished"))
        elif reason == "shutdown":
            out += self._event(error_doc(503, "server exiting: drain timeout"))
        # "interrupted" (truncate-on-arrival): nothing but [DONE]
        out += b"data: [DONE]" + self.sep
        await self.send({"type": "http.response.body", "body": out, "more_body": False})
        leak = self.state.config.faults.leak_memory_bytes
        if leak is not None:
            # non-zero bytes: pages that are written count in RSS
            self.state.leaked.append(b"\x5a" * leak)
        seq = self.seq
        if seq.timings is not None:
            seq.timings.finished(reason, len(seq.output), seq.preemptions)
