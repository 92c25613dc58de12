"""The LLM server's ASGI app: OpenAI-compatible routes, shaped as vLLM answers them.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming or not),
``GET /v1/models``, ``/health``, ``/metrics``, and with ``--record-timings``
``GET /debug/timings`` (harness_reference_server/llm/timings.py). A stream is ``text/event-stream``: for chat
a first chunk with the role (sent with the first token), one chunk per token, a chunk
with the ``finish_reason``, with ``stream_options.include_usage`` a usage chunk with
``choices: []``, then ``data: [DONE]``. An error after the headers is sent as
``data: {"error": ...}`` then ``data: [DONE]`` (the status stays 200, as vLLM's). A
request is validated before anything is sent: a bad one is answered 400 with an
OpenAI-style error body; a full waiting queue 429 with ``Retry-After``; a draining
server 503. The head of an admitted request is sent once its sequence first runs: a
request still waiting when a higher-priority arrival displaces it from a full queue is
answered 429 with ``Retry-After`` too. A client that disconnects has its sequence
aborted and its KV blocks freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.engine import Engine, QueueFull
from harness_reference_server.llm.metrics import CONTENT_TYPE, LLMMetrics
from harness_reference_server.llm.requests import BadRequest, LLMRequest, error_doc, parse_request
from harness_reference_server.llm.sequence import Sequence
from harness_reference_server.llm.stream import StreamWriter, fail_point, usage
from harness_reference_server.llm.timings import TimingLog
from harness_reference_server.llm.tokens import stream_key

log = logging.getLogger("harness_reference_server")


def _error(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_doc(status, message, param), status_code=status, headers=headers)


class LLMState:
    """The engine, the metrics and the lifecycle (ready, draining, in flight) of one app."""

    def __init__(self, config: LLMConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.metrics = LLMMetrics(config.model_name, config.faults.names())
        self.engine = Engine(config.engine_config(), clock=clock, observer=self.metrics)
        self.timings = TimingLog(config.timings_keep) if config.record_timings else None
        self.rng = random.Random(config.seed)  # error-in-200's draws
        self.streams = 0  # stream-stall: every tenth stream
        self.leaked: list[bytes] = []  # leak-memory: what every answered stream left
        self.ready = False
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        for name in self.config.faults.names():
            log.warning("FAULT %s is active (test-only defect)", name)
        self.engine.start()
        self.ready = True

    async def stop(self) -> None:
        await self.engine.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting, wait for every accepted request to be answered. True when all
        finished in time; otherwise the rest end with an error (never unanswered)."""
        self.draining = True
        self.ready = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            log.error("drain timeout (%.1fs) with %d requests in flight", timeout_s, self.in_flight)
            self.engine.abort_all("shutdown")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 1.0)
            return False

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()


class _Generation(Response):
    """The answer to an admitted request: a stream or one JSON document, written once its
    sequence finishes; the client's disconnect aborts the sequence."""

    def __init__(self, state: LLMState, req: LLMRequest, seq: Sequence) -> None:
        self.state, self.req, self.seq = state, req, seq
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state, seq = self.state, self.seq
        watcher = asyncio.create_task(self._watch_disconnect(receive))
        try:
            # the head waits for the sequence's admission: until then a higher-priority
            # arrival may displace it from a full queue, and it is answered as refused
            await seq.started.wait()
            if seq.finish_reason == "disconnect":
                return
            if seq.finish_reason == "shed":
                state.metrics.rejected.labels("queue_full").inc()
                refused = _error(
                    429,
                    "waiting queue full: displaced by a higher-priority request; retry later",
                    headers={"Retry-After": str(state.config.retry_after_s)},
                )
                await refused(scope, receive, send)
                return
            if self.req.stream:
                writer = StreamWriter(state, self.req, seq, send)
                await writer.run()
            else:
                await self._answer_once(send)
        except OSError:  # the client went away while we wrote
            state.engine.abort(seq, "disconnect")
        finally:
            watcher.cancel()
            if not seq.finished:
                state.engine.abort(seq, "disconnect")
            if seq.timings is not None:
                seq.timings.finished(seq.finish_reason, len(seq.output), seq.preemptions)
            state.leave()

    async def _watch_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.state.engine.abort(self.seq, "disconnect")

    async def _answer_once(self, send: Send) -> None:
        state, req, seq = self.state, self.req, self.seq
        fail_at = fail_point(state, req)
        while not seq.finished:
            if fail_at is not None and len(seq.output) >= fail_at:
                state.engine.abort(seq, "error")
                break
            await seq.event.wait()
            seq.event.clear()
        reason = seq.finish_reason
        if reason == "disconnect":
            return
        if reason == "error":
            status, doc = 200, error_doc(500, "internal error while generating")  # error-in-200
        elif reason in ("stop", "length", "interrupted"):
            status, doc = 200, completion_doc(state, req, seq)
        else:
            status, doc = 503, error_doc(503, _ABORT_MESSAGES.get(reason or "", str(reason)))
        if seq.timings is not None and "id" in doc:
            seq.timings.id = doc["id"]
        body = json.dumps(doc, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        if seq.timings is not None:
            if seq.output and status == 200 and "id" in doc:
                seq.timings.written([len(seq.output)])
            seq.timings.finished(reason, len(seq.output), seq.preemptions)


_ABORT_MESSAGES = {
    "deadline": "the request's deadline_s passed before it finished",
    "shutdown": "server exiting: drain timeout",
}


def completion_doc(state: LLMState, req: LLMRequest, seq: Sequence) -> dict[str, Any]:
    text = "".join(seq.take())
    reason = "stop" if seq.finish_reason == "interrupted" else seq.finish_reason
    rid = os.urandom(12).hex()
    common = {"created": int(time.time()), "model": state.config.model_name}
    if req.chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }
        return {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            **common,
            "choices": [choice],
            "usage": usage(state, req, seq),
        }
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        **common,
        "choices": [choice],
        "usage": usage(state, req, seq),
    }


def create_llm_app(config: LLMConfig, clock: Callable[[], float] = time.monotonic) -> Starlette:
    """The app; its ``LLMState`` is ``app.state.llm``."""
    state = LLMState(config, clock)
    retry_after = {"Retry-After": str(config.retry_after_s)}

    async def generate(request: Request, chat: bool) -> Response:
        if state.draining or not state.ready:
            state.metrics.rejected.labels("draining").inc()
            return _error(
                503, "server exiting: draining after SIGTERM" if state.draining else "not ready"
            )
        try:
            req = parse_request(
                await request.body(),
                chat=chat,
                model=config.model_name,
                max_model_len=config.max_model_len,
            )
        except BadRequest as exc:
            state.metrics.rejected.labels("invalid").inc()
            return _error(exc.status, exc.message, exc.param)
        arrival_ns = time.monotonic_ns() if state.timings is not None else 0
        seq = Sequence(
            req.prompt_ids,
            stream_key(req.prompt_ids, req.seed),
            req.max_tokens,
            ignore_eos=req.ignore_eos,
            priority=req.priority,
            deadline=None if req.deadline_s is None else clock() + req.deadline_s,
            interruptible=req.stream,
        )
        try:
            state.engine.submit(seq)
        except QueueFull as exc:
            state.metrics.rejected.labels("queue_full").inc()
            return _error(429, f"{exc}; retry later", headers=retry_after)
        if state.timings is not None:  # before the engine's next step can schedule it
            seq.timings = state.timings.start(
                "chat" if chat else "completions",
                req.stream,
                req.priority,
                len(req.prompt_ids),
                arrival_ns,
            )
        state.enter()
        return _Generation(state, req, seq)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def models(request: Request) -> Response:
        card = {
            "id": config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "harness_reference_server",
            "root": config.model_name,
            "max_model_len": config.max_model_len,
            "config": config.describe(),
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return Response(status_code=200 if state.ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    async def debug_timings(request: Request) -> Response:
        if state.timings is None:
            return _error(404, "timings are not recorded: start the server with --record-timings")
        clear = request.query_params.get("clear") in ("1", "true")
        return JSONResponse(state.timings.snapshot(clear=clear))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/debug/timings", debug_timings),
        ],
        lifespan=lifespan,
    )
    app.state.llm = state
    return app
