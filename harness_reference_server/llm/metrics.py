"""The LLM server's Prometheus metrics, named as vLLM names them (``vllm:``, label
``model_name``) so the same dashboards and scrapers read ours and vLLM's alike; what vLLM
has no name for is ``refserver_llm_``.

TTFT and inter-token latency are measured in the engine, at the end of the step that
produced the token (as vLLM measures them), not on the wire.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from harness_reference_server.llm.sequence import Sequence

CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's buckets for these histograms (vllm/v1/metrics/loggers.py)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
# step timing error |actual end - modelled end|: fine below the 2 ms the step loop must keep
_STEP_ERROR_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.05)


class LLMMetrics:
    """All metrics of one LLM app, in a private registry; an ``EngineObserver``."""

    def __init__(self, model_name: str, fault_names: list[str]) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        m = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch", m, registry=r
        ).labels(model_name)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", m, registry=r).labels(
            model_name
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV cache usage (1 = full)", m, registry=r
        ).labels(model_name)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Preemptions (recompute)", m, registry=r
        ).labels(model_name)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            m,
            registry=r,
        ).labels(model_name)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", m, registry=r
        ).labels(model_name)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests", m, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens", m, registry=r
        ).labels(model_name)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            m,
            buckets=_TTFT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between tokens of a request",
            m,
            buckets=_ITL_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last token",
            m,
            buckets=_E2E_BUCKETS,
            registry=r,
        ).labels(model_name)
        success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason",
            [*m, "finished_reason"],
            registry=r,
        )
        self._success = {
            reason: success.labels(model_name, reason) for reason in ("stop", "length", "abort")
        }
        self.rejected = Counter(
            "refserver_llm_requests_rejected",
            "Requests answered before admission, by reason",
            ["reason"],
            registry=r,
        )
        self.step_error = Histogram(
            "refserver_llm_step_error_seconds",
            "|actual - modelled end| of each step with running sequences",
            buckets=_STEP_ERROR_BUCKETS,
            registry=r,
        )
        faults = Gauge(
            "refserver_fault_active",
            "Injected test-only faults (1 = active)",
            ["fault"],
            registry=r,
        )
        for name in fault_names:
            faults.labels(name.split(":")[0]).set(1)

    # -- EngineObserver ---------------------------------------------------------------

    def on_step(self, running: int, waiting: int, kv_usage: float, error_s: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if running:
            self.step_error.observe(abs(error_s))

    def on_preemption(self) -> None:
        self.preemptions.inc()

    def on_prefix_lookup(self, queried: int, hit: int) -> None:
        self.prefix_queries.inc(queried)
        self.prefix_hits.inc(hit)

    def on_token(self, seq: Sequence, now: float, first: bool) -> None:
        self.generation_tokens.inc()
        if first:
            self.ttft.observe(now - seq.arrival)
        elif seq.last_token_at is not None:
            self.itl.observe(now - seq.last_token_at)

    def on_finish(self, seq: Sequence, now: float) -> None:
        self._success.get(seq.finish_reason or "", self._success["abort"]).inc()
        self.prompt_tokens.inc(len(seq.prompt_ids))
        self.e2e.observe(now - seq.arrival)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
