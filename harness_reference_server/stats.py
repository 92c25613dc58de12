"""Triton's statistics extension: ``GET /v2/models/{m}/stats`` from the batcher's counters.

The document has Triton's shape (``model_stats`` → ``inference_stats`` / ``batch_stats``)
so a client written for Triton (perf_analyzer, the harness) reads it unchanged. As in
Triton, ``inference_stats`` count requests and ``batch_stats`` / ``execution_count``
count model executions; ``inference_count`` counts inferences (rows: a request of 4 rows
is 4). Durations are cumulative nanoseconds since the server started:

- ``success`` / ``fail``: requests answered / failed (model error, an injected error,
  deadline expired in the queue), with their time from enqueue to answer;
- ``queue``: enqueue → its batch starts, successful requests only;
- ``compute_input`` (concatenating the batch), ``compute_infer`` (the model call) and
  ``compute_output`` (splitting the answer): the batch's time, counted once per request
  of the batch, successful requests only (Triton's convention).

Requests refused at enqueue (queue full, not ready, draining) never reach the model's
queue and are not counted, as in Triton. Recording costs one lock-protected add per
batch (or per expired request); the lock makes a read consistent across counters.
"""

from __future__ import annotations

import threading
from typing import Any


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, count: int, ns: int) -> None:
        self.count += count
        self.ns += ns

    def doc(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class _BatchSize:
    __slots__ = ("compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()


INFERENCE_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


class ModelStats:
    """The counters of one model (the reference server serves one, version "1")."""

    def __init__(self, name: str, version: str = "1") -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self._inference = {k: _Duration() for k in INFERENCE_KEYS}
        self._batches: dict[int, _BatchSize] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def batch_done(
        self,
        *,
        rows: int,
        ok_requests: int,
        failed_requests: int,
        queue_ns: int,
        request_ns_ok: int,
        request_ns_failed: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        now_ms: int,
    ) -> None:
        """One model execution of ``rows`` rows: its requests that succeeded (their summed
        queue and enqueue→answer times) and those that failed after it ran."""
        with self._lock:
            inf = self._inference
            inf["success"].add(ok_requests, request_ns_ok)
            if failed_requests:
                inf["fail"].add(failed_requests, request_ns_failed)
            inf["queue"].add(ok_requests, queue_ns)
            inf["compute_input"].add(ok_requests, input_ns * ok_requests)
            inf["compute_infer"].add(ok_requests, infer_ns * ok_requests)
            inf["compute_output"].add(ok_requests, output_ns * ok_requests)
            b = self._batches.get(rows)
            if b is None:
                b = self._batches[rows] = _BatchSize()
            b.compute_input.add(1, input_ns)
            b.compute_infer.add(1, infer_ns)
            b.compute_output.add(1, output_ns)
            self.inference_count += rows
            self.execution_count += 1
            self.last_inference_ms = now_ms

    def failed(self, requests: int, ns: int) -> None:
        """Requests that failed without a successful execution (model raised, deadline
        expired in the queue)."""
        with self._lock:
            self._inference["fail"].add(requests, ns)

    def doc(self) -> dict[str, Any]:
        """This model's entry of ``model_stats`` (Triton's field names)."""
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {k: d.doc() for k, d in self._inference.items()},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": b.compute_input.doc(),
                        "compute_infer": b.compute_infer.doc(),
                        "compute_output": b.compute_output.doc(),
                    }
                    for size, b in sorted(self._batches.items())
                ],
            }
