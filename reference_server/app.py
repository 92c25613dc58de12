"""The Starlette application: KServe V2 REST routes, lifecycle state, error mapping.

Every error body is ``{"error": "<message>"}``. Status mapping follows Triton: unknown
model 404; malformed request 400; body over ``--max-body-bytes`` 413; model exception
500; queue full (with ``Retry-After``), deadline expired, not ready and draining 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reference_server import __version__
from reference_server.batcher import (
    Batcher,
    BatcherConfig,
    DeadlineExpired,
    QueueFull,
    ServerExiting,
)
from reference_server.config import ServerConfig
from reference_server.faults import FaultRuntime
from reference_server.metrics import CONTENT_TYPE, Metrics
from reference_server.models import Model, build_model
from reference_server.protocol import ProtocolError, infer_response, parse_infer_request

log = logging.getLogger("reference_server")


class BodyTooLarge(Exception):
    pass


class ServerState:
    """Lifecycle flags and the pieces the routes share. One per app."""

    def __init__(self, config: ServerConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.model: Model = build_model(config)
        self.metrics = Metrics(config.priority_levels, config.max_batch_size)
        self.faults = FaultRuntime(config.faults)
        f = config.faults
        self.batcher = Batcher(
            self.model.predict,
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
                seed=config.seed,
            ),
            clock=clock,
            observer=self.metrics,
        )
        self.ready = False
        self.draining = False
        self.warmed_up = threading.Event()
        self._stop = threading.Event()
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self.ready = ready and not self.draining
        self.metrics.ready.set(1 if self.ready else 0)

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
        await self.batcher.start()
        if self.config.faults.slow_start_s is not None:
            # The defect: ready at once, the heavy init happens on the first request.
            self.set_ready(True)
        else:
            threading.Thread(target=self.warmup, name="warmup", daemon=True).start()

    async def stop(self) -> None:
        self._stop.set()
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


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(
            f"request body has {int(declared)} bytes. Expected at most {limit} (--max-body-bytes)."
        )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(
                f"request body has more than {limit} bytes. Expected at most {limit} (--max-body-bytes)."
            )
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(config: ServerConfig, clock: Callable[[], float] = time.monotonic) -> Starlette:
    state = ServerState(config, clock)
    model = state.model
    metrics = state.metrics

    def unknown_model(name: str) -> JSONResponse:
        return _error(404, f"model {name!r} is not served. Expected {model.name!r}.")

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if state.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(
            {
                "name": "reference_server",
                "version": __version__,
                "extensions": [],
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

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def infer(request: Request) -> Response:
        t0 = clock()
        metrics.received.inc()
        outcome, reason, response = await _infer(request)
        metrics.answered(outcome, reason, clock() - t0)
        return response

    async def _infer(request: Request) -> tuple[str, str, Response]:
        name = request.path_params["model"]
        if name != model.name:
            return "rejected", "not_found", unknown_model(name)
        if state.draining:
            return "rejected", "draining", _error(503, "server exiting: draining after SIGTERM")
        if not state.ready:
            return "rejected", "not_ready", _error(503, f"model {name!r} is not ready (warming up)")
        try:
            body = await _read_body(request, config.max_body_bytes)
            req = parse_infer_request(body, model, config.priority_levels, config.max_batch_size)
        except BodyTooLarge as exc:
            return "rejected", "too_large", _error(413, str(exc))
        except ProtocolError as exc:
            return "rejected", "invalid", _error(exc.status, exc.message)
        if state.draining:  # SIGTERM arrived while the body was being read
            return "rejected", "draining", _error(503, "server exiting: draining after SIGTERM")
        state.faults.on_request()
        try:
            fut = state.batcher.submit(req.rows, req.level, req.timeout_s)
        except QueueFull as exc:
            headers = {"Retry-After": str(config.retry_after_s)}
            return "rejected", "queue_full", _error(503, f"{exc}; retry later", headers)
        state._enter()
        try:
            result = await fut
            return "success", "ok", JSONResponse(infer_response(model, req, result))
        except DeadlineExpired:
            return (
                "rejected",
                "deadline_expired",
                _error(
                    503,
                    f"parameters.timeout {int(req.timeout_s * 1e6) if req.timeout_s else 0} us expired "
                    "before execution; the request was not computed",
                ),
            )
        except ServerExiting as exc:
            return "rejected", "draining", _error(503, str(exc))
        except ProtocolError as exc:
            return "failed", "model_error", _error(exc.status, exc.message)
        except Exception as exc:  # the model raised: that is a 500, not a crash
            log.exception("model execution failed")
            return (
                "failed",
                "model_error",
                _error(500, f"model execution failed: {type(exc).__name__}: {exc}"),
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
        # The hot route first: Starlette matches routes in order.
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/{model}", model_metadata),
        Route("/v2/models/{model}/versions/{version}", model_metadata),
        Route("/v2/models/{model}/ready", model_ready),
        Route("/v2/models/{model}/versions/{version}/ready", model_ready),
        Route("/v2/models/{model}/versions/{version}/infer", infer, methods=["POST"]),
        Route("/metrics", metrics_route),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )
    app.state.server = state
    return app


def server_state(app: Any) -> ServerState:
    return app.state.server
