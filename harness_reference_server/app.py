"""The ASGI application: KServe V2 REST routes, lifecycle state, error mapping.

``POST .../infer`` is served on a lean ASGI path; the other routes are Starlette's.

Every error body is ``{"error": "<message>"}``. Status mapping follows Triton: unknown
model 404; malformed request 400; body over ``--max-body-bytes`` 413; model exception
500; queue full (with ``Retry-After``), deadline expired, not ready and draining 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from harness_reference_server import __version__
from harness_reference_server.batch_queue import DeadlineExpired, QueueFull, ServerExiting
from harness_reference_server.batcher import Batcher, BatcherConfig
from harness_reference_server.config import ServerConfig
from harness_reference_server.faults import FaultRuntime
from harness_reference_server.metrics import CONTENT_TYPE, Metrics
from harness_reference_server.models import Model, build_model
from harness_reference_server.protocol import ProtocolError, infer_response, parse_infer_request
from harness_reference_server.stats import ModelStats

log = logging.getLogger("harness_reference_server")


class BodyTooLarge(Exception):
    pass


class ServerState:
    """Lifecycle flags and the pieces the routes share. One per app."""

    def __init__(self, config: ServerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.model: Model = build_model(config)
        self.metrics = Metrics(config.priority_levels, config.max_batch_size)
        self.faults = FaultRuntime(config.faults, now=clock, seed=config.seed)
        f = config.faults
        self.stats = ModelStats(self.model.name)
        self.batcher = Batcher(
            self.faults.wrap_run(self.model.predict),  # the model itself unless a fault wraps it
            BatcherConfig(
                max_batch_size=config.max_batch_size,
                max_delay_s=config.max_delay_ms / 1000.0,
                levels=config.priority_levels,
                capacity=config.queue_capacity,
                workers=config.workers,
                bounded=not f.unbounded_queue,
                one_request_per_batch=f.no_batching,
                single_level=f.ignore_priority,
                cross_wire_p=f.cross_wire_p or 0.0,
                fifo_dispatch=f.fifo_dispatch,
                backoff_grow_s=f.backoff_batching_grow_s,
                seed=config.seed,
            ),
            clock=clock,
            observer=self.metrics,
            after_batch=self.faults.after_batch if self.faults.rewrites_outputs else None,
            stats=self.stats,
        )
        self.ready = False
        self.draining = False
        self.warmed_up = threading.Event()
        self._stop = threading.Event()
        self.in_flight = 0
        self._idle: asyncio.Event | None = None
        self._stall_watch: asyncio.Task[None] | None = None  # faults stall-trip/-abandon

    # -- lifecycle -------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self.ready = ready and not self.draining
        self.metrics.ready.set(1 if self.ready else 0)
        if self.ready:
            self.faults.mark_ready()  # late-leak and slowdown count from here

    def warmup(self) -> None:
        """Run the model at batch 1 and at max batch, then become ready (worker thread)."""
        width = self.model.input.width
        try:
            self.model.load()
            self.model.predict(np.zeros((1, width), dtype=np.float32))
            self.model.predict(np.zeros((self.config.max_batch_size, width), dtype=np.float32))
            if self.config.warmup_delay_s:
                self._stop.wait(self.config.warmup_delay_s)
        except Exception:
            log.exception("warmup failed; the server stays not ready")
            return
        self.warmed_up.set()
        self.set_ready(True)
        log.info("warmup done; ready")

    async def start(self) -> None:
        self._idle = asyncio.Event()
        self._idle.set()
        for name in self.config.faults.names():
            self.metrics.faults.labels(name.split(":")[0]).set(1)
        self.faults.announce()
        self.faults.start()
        self.faults.start_exit_hang()
        if self.faults.watches_stalls:
            self._stall_watch = asyncio.create_task(
                self.faults.watch_stalls(
                    self.batcher.degrade_to_single,
                    self.batcher.abandon_after_batch,
                    self.batcher.respawn_workers,
                ),
                name="fault-stall-watch",
            )
        await self.batcher.start()
        if self.config.faults.slow_start_s is not None:
            # The defect: ready at once, the heavy init happens on the first request.
            self.set_ready(True)
        else:
            threading.Thread(target=self.warmup, name="warmup", daemon=True).start()

    async def stop(self) -> None:
        self._stop.set()
        if self._stall_watch is not None:
            self._stall_watch.cancel()
        self.faults.stop()
        await self.batcher.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting work, wait for accepted requests to be answered.

        Returns True when everything finished in time; otherwise the rest are answered
        503 "server exiting" so no accepted request goes unanswered.
        """
        self.draining = True
        self.set_ready(False)
        self.metrics.draining.set(1)
        assert self._idle is not None
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            log.error("drain timeout (%.1fs) with %d requests in flight", timeout_s, self.in_flight)
            self.batcher.fail_all(ServerExiting("server exiting: drain timeout"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 1.0)
            return False

    def _enter(self) -> None:
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        assert self._idle is not None
        self._idle.clear()

    def _leave(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


Answer = tuple[str, str, int, dict[str, Any], list[tuple[bytes, bytes]]]
"""(outcome, reason, status, JSON document, extra headers) of one inference request."""


def _fail(
    outcome: str,
    reason: str,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Answer:
    return outcome, reason, status, {"error": message}, headers or []


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request body, BodyTooLarge past ``limit``, None if the client went away."""
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge(
                f"request body has {int(value)} bytes. Expected at most {limit} (--max-body-bytes)."
            )
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(
                f"request body has more than {limit} bytes. Expected at most {limit} (--max-body-bytes)."
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _infer_model_name(path: str) -> str | None:
    """``/v2/models/{m}[/versions/{v}]/infer`` → m, anything else → None."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    middle = path[len("/v2/models/") : -len("/infer")]
    name, sep, version = middle.partition("/versions/")
    if not name or "/" in name or (sep and (not version or "/" in version)):
        return None
    return name


_JSON = (b"content-type", b"application/json")


class ReferenceApp:
    """The ASGI app: inference on a lean path, everything else through Starlette.

    The inference route is the hot path; taking it before Starlette's middleware,
    router and Request/Response objects saves a measurable share of the per-request
    CPU, which on a 2-core box is what bounds served throughput.
    """

    def __init__(self, state: ServerState, starlette: Starlette, infer: Callable[..., Any]) -> None:
        self.state = state
        self.starlette = starlette
        self._infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            name = _infer_model_name(scope["path"])
            if name is not None:
                await self._infer(name, scope, receive, send)
                return
        await self.starlette(scope, receive, send)


def create_app(config: ServerConfig, clock: Callable[[], float] = time.monotonic) -> ReferenceApp:
    state = ServerState(config, clock)
    model = state.model
    metrics = state.metrics
    ascii_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode

    def encode(doc: dict[str, Any]) -> bytes:
        """The answer as compact UTF-8 JSON, the values the standard library's encoder writes.

        orjson writes it when it can (an exponent comes out as ``1e-9`` where the standard
        library writes ``1e-09``: the same number). What orjson refuses goes to the
        standard library with non-ASCII escaped: an id with a lone surrogate (which a
        request can carry as an escape) is echoed as that escape, an integer beyond 64 bits
        as its digits. The documents encoded here hold no float but model outputs
        ``infer_response`` checked finite (orjson would write NaN as null).
        """
        try:
            return orjson.dumps(doc)
        except orjson.JSONEncodeError:
            return ascii_dumps(doc).encode()

    retry_after = [(b"retry-after", str(config.retry_after_s).encode())]

    def unknown_model(name: str) -> JSONResponse:
        return _error(404, f"model {name!r} is not served. Expected {model.name!r}.")

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if state.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(
            {
                "name": "harness_reference_server",
                "version": __version__,
                "extensions": ["statistics"],
                "model": model.name,
                "config": config.describe(),
                "faults": config.faults.names(),
            }
        )

    async def model_metadata(request: Request) -> Response:
        name = request.path_params["model"]
        if name != model.name:
            return unknown_model(name)
        doc = model.metadata()
        doc["parameters"] = {
            "max_batch_size": config.max_batch_size,
            "max_delay_ms": config.max_delay_ms,
            "priority_levels": config.priority_levels,
        }
        return JSONResponse(doc)

    async def model_ready(request: Request) -> Response:
        name = request.path_params["model"]
        if name != model.name:
            return unknown_model(name)
        return Response(status_code=200 if state.ready else 503)

    async def model_stats(request: Request) -> Response:
        """Triton's statistics extension (harness_reference_server.stats); without a model in
        the path, every model's."""
        name = request.path_params.get("model")
        if name is not None and name != model.name:
            return unknown_model(name)
        version = request.path_params.get("version")
        if version is not None and version != state.stats.version:
            return _error(
                404,
                f"model {model.name!r} has no version {version!r}. Expected {state.stats.version!r}.",
            )
        return JSONResponse({"model_stats": [state.stats.doc()]})

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def infer(name: str, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = clock()
        metrics.received.inc()
        try:
            outcome, reason, status, doc, headers = await _infer(name, scope, receive)
            body = encode(doc)
        except Exception as exc:  # never leave a request without an answer
            log.exception("inference request failed")
            outcome, reason, status, doc, headers = _fail(
                "failed", "model_error", 500, f"internal error: {type(exc).__name__}: {exc}"
            )
            body = encode(doc)
        metrics.answered(outcome, reason, clock() - t0)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [_JSON, (b"content-length", str(len(body)).encode()), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _infer(name: str, scope: Scope, receive: Receive) -> Answer:
        if name != model.name:
            return _fail(
                "rejected",
                "not_found",
                404,
                f"model {name!r} is not served. Expected {model.name!r}.",
            )
        if state.draining:
            return _fail("rejected", "draining", 503, "server exiting: draining after SIGTERM")
        if not state.ready:
            return _fail("rejected", "not_ready", 503, f"model {name!r} is not ready (warming up)")
        try:
            io_lock = state.faults.io_lock()
            if io_lock is None:
                body = await _read_body(scope, receive, config.max_body_bytes)
            else:  # io-lock: the decoder's lock held across the wait for the client's bytes
                async with io_lock:
                    body = await _read_body(scope, receive, config.max_body_bytes)
            if body is None:
                return _fail(
                    "rejected", "invalid", 400, "client disconnected before sending the body"
                )
            req = parse_infer_request(body, model, config.priority_levels, config.max_batch_size)
        except BodyTooLarge as exc:
            return _fail("rejected", "too_large", 413, str(exc))
        except ProtocolError as exc:
            return _fail("rejected", "invalid", exc.status, exc.message)
        if state.draining:  # SIGTERM arrived while the body was being read
            return _fail("rejected", "draining", 503, "server exiting: draining after SIGTERM")
        if state.faults.refuse_cold():
            return _fail("rejected", "not_ready", 503, f"model {name!r} is not loaded yet")
        if state.faults.breaker_open():
            return _fail("rejected", "breaker_open", 503, "circuit breaker open; retry later")
        state.faults.on_request()
        try:
            fut = state.batcher.submit(req.rows, req.level, req.timeout_s)
        except QueueFull as exc:
            return _fail("rejected", "queue_full", 503, f"{exc}; retry later", retry_after)
        state._enter()
        try:
            result = await fut
            return "success", "ok", 200, infer_response(model, req, result), []
        except DeadlineExpired:
            timeout_us = int(req.timeout_s * 1e6) if req.timeout_s else 0
            return _fail(
                "rejected",
                "deadline_expired",
                503,
                f"parameters.timeout {timeout_us} us expired before execution; "
                "the request was not computed",
            )
        except ServerExiting as exc:
            return _fail("rejected", "draining", 503, str(exc))
        except ProtocolError as exc:
            return _fail("failed", "model_error", exc.status, exc.message)
        except Exception as exc:  # the model raised: that is a 500, not a crash
            log.exception("model execution failed")
            return _fail(
                "failed", "model_error", 500, f"model execution failed: {type(exc).__name__}: {exc}"
            )
        finally:
            state._leave()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    routes = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", model_stats),  # before {model}: "stats" is not a model
        Route("/v2/models/{model}", model_metadata),
        Route("/v2/models/{model}/versions/{version}", model_metadata),
        Route("/v2/models/{model}/ready", model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", model_ready),
        Route("/v2/models/{model}/stats", model_stats),
        Route("/v2/models/{model}/versions/{version}/stats", model_stats),
        Route("/metrics", metrics_route),
        # POSTs never get here (ReferenceApp takes them); other methods get a 405.
        Route("/v2/models/{model}/infer", live, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", live, methods=["POST"]),
    ]
    starlette = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )
    return ReferenceApp(state, starlette, infer)


def server_state(app: ReferenceApp) -> ServerState:
    return app.state
