"""Prometheus metrics, prefix ``refserver_``, base units (seconds, rows, requests).

Request accounting balances by construction: every inference request increments
``refserver_requests_received_total`` once and ``refserver_requests_total{outcome,reason}``
exactly once, with outcome ``success``, ``rejected`` or ``failed``:

    received = success + sum(rejected by reason) + sum(failed by reason)

Average batch size = ``refserver_inference_count_total`` ÷ ``refserver_execution_count_total``
(Triton's ``nv_inference_count`` / ``nv_inference_exec_count``).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "refserver"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Outcome and reason label values; the app maps each HTTP answer to one pair.
REASONS = {
    "success": ("ok",),
    "rejected": (
        "queue_full",
        "deadline_expired",
        "not_ready",
        "draining",
        "invalid",
        "not_found",
        "too_large",
        "disconnected",
        "breaker_open",
    ),
    "failed": ("model_error",),
}

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
)


class Metrics:
    """All server metrics in one private registry (several apps can live in one process)."""

    def __init__(self, levels: int, max_batch_size: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        p = PREFIX
        self.received = Counter(f"{p}_requests_received", "Inference requests received", registry=r)
        self.requests = Counter(
            f"{p}_requests",
            "Inference requests answered, by outcome (success/rejected/failed) and reason",
            ["outcome", "reason"],
            registry=r,
        )
        # Label children are looked up once: labels() costs a lock and a dict per call.
        self._by_reason = {
            (outcome, reason): self.requests.labels(outcome, reason)
            for outcome, reasons in REASONS.items()
            for reason in reasons
        }
        self.in_flight = Gauge(
            f"{p}_requests_in_flight",
            "Inference requests accepted and not yet answered",
            registry=r,
        )
        self.queue_depth = Gauge(
            f"{p}_queue_depth",
            "Requests waiting in the queue, by priority (1 = highest)",
            ["priority"],
            registry=r,
        )
        self._depth = [self.queue_depth.labels(str(lv + 1)) for lv in range(levels)]
        for child in self._depth:
            child.set(0)
        size_buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch_size})
        self.batch_size = Histogram(
            f"{p}_batch_size",
            "Rows per executed batch",
            buckets=[float(b) for b in size_buckets],
            registry=r,
        )
        self.batch_requests = Histogram(
            f"{p}_batch_requests",
            "Requests per executed batch",
            buckets=[float(b) for b in size_buckets],
            registry=r,
        )
        self.queue_duration = Histogram(
            f"{p}_queue_duration_seconds",
            "Time from enqueue to batch start, per request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_duration = Histogram(
            f"{p}_compute_duration_seconds",
            "Model execution time, per batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            f"{p}_request_duration_seconds",
            "End-to-end handling time in the server, per inference request, by outcome",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._duration = {o: self.request_duration.labels(o) for o in REASONS}
        self.inference_count = Counter(
            f"{p}_inference_count", "Rows computed (inferences)", registry=r
        )
        self.execution_count = Counter(
            f"{p}_execution_count", "Batches executed (model executions)", registry=r
        )
        self.expired = Counter(
            f"{p}_deadline_expired",
            "Requests whose timeout passed in the queue (never computed)",
            registry=r,
        )
        self.ready = Gauge(f"{p}_ready", "1 when the server is ready to serve", registry=r)
        self.draining = Gauge(f"{p}_draining", "1 after SIGTERM, while draining", registry=r)
        self.faults = Gauge(
            f"{p}_fault_active", "Injected test-only faults (1 = active)", ["fault"], registry=r
        )

    # -- BatchObserver ---------------------------------------------------------------

    def on_queue_depth(self, level: int, depth: int) -> None:
        self._depth[level].set(depth)

    def on_batch(self, n_requests: int, n_rows: int, queue_waits: list[float]) -> None:
        self.batch_size.observe(n_rows)
        self.batch_requests.observe(n_requests)
        for w in queue_waits:
            self.queue_duration.observe(w)

    def on_compute(self, n_rows: int, seconds: float, ok: bool) -> None:
        self.execution_count.inc()
        if ok:
            self.inference_count.inc(n_rows)
            self.compute_duration.observe(seconds)

    def on_expired(self, n: int) -> None:
        self.expired.inc(n)

    # -- accounting ------------------------------------------------------------------

    def answered(self, outcome: str, reason: str, seconds: float) -> None:
        self._by_reason[(outcome, reason)].inc()
        self._duration[outcome].observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
