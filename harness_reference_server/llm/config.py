"""The LLM server's configuration (``python -m harness_reference_server --api openai``): one frozen
dataclass, built from the command line. Errors name the flag, the value and what is valid.

The defaults and why: docs/llm-server.md ("Defaults").
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from harness_reference_server.errors import ConfigError
from harness_reference_server.llm.engine import EngineConfig
from harness_reference_server.llm.faults import LLM_FAULT_HELP, LLMFaultSet, parse_llm_faults
from harness_reference_server.llm.tokens import DEFAULT_MAX_MODEL_LEN

APIS = ("kserve-v2", "openai")


@dataclasses.dataclass(frozen=True)
class LLMConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "reference-llm"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_blocks: int = 2048
    # a bounded waiting queue that sheds before its wait passes a TTFT bound: docs/llm-server.md
    max_waiting: int = 32
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    time_scale: float = 8.0
    beta0_ms: float = 5.75
    beta1_us: float = 17.0
    beta2_us: float = 6.0
    prefix_caching: bool = True
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0
    seed: int = 0
    record_timings: bool = False
    timings_keep: int = 2000
    faults: Any = dataclasses.field(default_factory=LLMFaultSet)
    log_level: str = "warning"
    access_log: bool = False

    def __post_init__(self) -> None:
        for flag, value in (
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--block-size", self.block_size),
            ("--kv-blocks", self.kv_blocks),
            ("--max-waiting", self.max_waiting),
            ("--max-model-len", self.max_model_len),
            ("--retry-after-s", self.retry_after_s),
            ("--timings-keep", self.timings_keep),
        ):
            _check(value >= 1, flag, value, "an integer >= 1")
        for flag, value in (
            ("--time-scale", self.time_scale),
            ("--beta0-ms", self.beta0_ms),
            ("--beta1-us", self.beta1_us),
            ("--beta2-us", self.beta2_us),
            ("--drain-timeout-s", self.drain_timeout_s),
        ):
            _check(value >= 0, flag, value, "a number >= 0")
        _check(
            self.max_model_len <= self.kv_blocks * self.block_size,
            "--max-model-len",
            self.max_model_len,
            f"at most --kv-blocks x --block-size = {self.kv_blocks * self.block_size} "
            "(one sequence must fit in the KV cache)",
        )

    def engine_config(self) -> EngineConfig:
        """The engine's settings, with the planted faults' behaviours applied."""
        f = self.faults
        return EngineConfig(
            max_num_seqs=self.max_num_seqs * (f.kv_overcommit_factor or 1),
            max_num_batched_tokens=self.max_num_batched_tokens,
            block_size=self.block_size,
            num_blocks=self.kv_blocks,
            max_waiting=None if f.unbounded_queue else self.max_waiting,
            beta0_s=self.beta0_ms / 1e3,
            beta1_s=self.beta1_us / 1e6,
            beta2_s=self.beta2_us / 1e6,
            time_scale=self.time_scale,
            prefix_caching=self.prefix_caching,
            chunked_prefill=not f.no_chunked_prefill,
            static_batching=f.static_batching,
            priority_inverted=f.priority_inversion,
            leak_on_abort=f.kv_leak_on_abort,
            interrupt_on_arrival=f.truncate_on_arrival,
            cross_stream_p=f.cross_stream_p or 0.0,
            seed=self.seed,
        )

    def describe(self) -> dict[str, object]:
        """The serving configuration (metadata for results), as ``GET /v1/models`` shows it."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "kv_blocks": self.kv_blocks,
            "max_waiting": self.max_waiting,
            "max_model_len": self.max_model_len,
            "time_scale": self.time_scale,
            "beta": [self.beta0_ms / 1e3, self.beta1_us / 1e6, self.beta2_us / 1e6],
            "prefix_caching": self.prefix_caching,
            "seed": self.seed,
            "record_timings": self.record_timings,
            "faults": self.faults.names(),
        }


def _check(ok: bool, flag: str, value: object, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{flag} has value {value!r}. Expected {valid}.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness_reference_server --api openai",
        description="Reference LLM server: OpenAI-compatible token streaming from a simulated "
        "continuous-batching engine (docs/llm-server.md).",
    )
    d = LLMConfig()
    p.add_argument("--api", choices=APIS, default="openai")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--model-name", default=d.model_name, help="the served model name")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="sequences per step")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help="tokens per step (decodes + prefill chunks)",
    )
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument("--kv-blocks", type=int, default=d.kv_blocks, help="KV cache size in blocks")
    p.add_argument(
        "--max-waiting",
        type=int,
        default=d.max_waiting,
        help="waiting requests before new ones are answered 429 (default 32: half a batch)",
    )
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="every modelled step lasts this many times its cost-model time",
    )
    p.add_argument("--beta0-ms", type=float, default=d.beta0_ms, help="step cost per step")
    p.add_argument("--beta1-us", type=float, default=d.beta1_us, help="step cost per prefill token")
    p.add_argument(
        "--beta2-us", type=float, default=d.beta2_us, help="step cost per decoding sequence"
    )
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--retry-after-s", type=int, default=d.retry_after_s)
    p.add_argument("--drain-timeout-s", type=float, default=d.drain_timeout_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--record-timings",
        action="store_true",
        help="record per-request server timestamps, served at GET /debug/timings",
    )
    p.add_argument(
        "--timings-keep",
        type=int,
        default=d.timings_keep,
        help="with --record-timings: how many of the latest requests are kept",
    )
    p.add_argument(
        "--fault", action="append", default=[], metavar="NAME[:PARAM]", help=LLM_FAULT_HELP
    )
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument("--access-log", action="store_true")
    return p


def parse_llm_config(argv: Sequence[str] | None = None) -> LLMConfig:
    """Parse argv into a validated config; raises ConfigError on invalid values."""
    ns = build_parser().parse_args(argv)
    return LLMConfig(
        host=ns.host,
        port=ns.port,
        model_name=ns.model_name,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size,
        kv_blocks=ns.kv_blocks,
        max_waiting=ns.max_waiting,
        max_model_len=ns.max_model_len,
        time_scale=ns.time_scale,
        beta0_ms=ns.beta0_ms,
        beta1_us=ns.beta1_us,
        beta2_us=ns.beta2_us,
        prefix_caching=not ns.no_prefix_caching,
        retry_after_s=ns.retry_after_s,
        drain_timeout_s=ns.drain_timeout_s,
        seed=ns.seed,
        record_timings=ns.record_timings,
        timings_keep=ns.timings_keep,
        faults=parse_llm_faults(ns.fault),
        log_level=ns.log_level,
        access_log=ns.access_log,
    )
