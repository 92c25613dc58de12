"""Server configuration: one frozen dataclass, built from the command line.

Errors name the flag, the value received and what is valid, e.g.
``--max-batch-size has value '0'. Expected an integer >= 1.``
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from harness_reference_server.errors import ConfigError
from harness_reference_server.fault_catalog import FAULT_HELP, FaultSet, parse_faults

MODELS = ("mlp", "sim")
# Sized so that, on one core of a small CI machine, the model (not HTTP) dominates and the
# served capacity (~600 req/s batched) stays well inside what one Locust process can
# offer with integrity checks on (~1,500 req/s): overload scenarios at 2x capacity then
# measure the server, not the load generator. Batch 32 costs ~7x batch 1.
DEFAULT_MLP_DIMS = (256, 8192, 4096, 10)
DEFAULT_SIM_DIMS = (16, 4)

# --api openai is the LLM server (harness_reference_server/llm/), with its own flags
APIS = ("kserve-v2", "openai")

__all__ = ["APIS", "ConfigError", "ServerConfig", "build_parser", "parse_config", "selected_api"]


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "mlp"
    model_name: str | None = None
    max_batch_size: int = 32
    max_delay_ms: float = 5.0
    # Requests per priority level; None means 4 x max_batch_size (bounded by default).
    queue_size: int | None = None
    workers: int = 1
    priority_levels: int = 2
    blas_threads: int = 1
    drain_timeout_s: float = 30.0
    max_body_bytes: int = 8 * 1024 * 1024
    warmup_delay_s: float = 0.0
    retry_after_s: int = 1
    mlp_dims: tuple[int, ...] = DEFAULT_MLP_DIMS
    sim_dims: tuple[int, ...] = DEFAULT_SIM_DIMS
    sim_base_ms: float = 15.0
    sim_item_ms: float = 0.3
    seed: int = 0
    faults: FaultSet = dataclasses.field(default_factory=FaultSet)
    log_level: str = "warning"
    access_log: bool = False

    def __post_init__(self) -> None:
        _check(self.model in MODELS, "--model", self.model, f"one of {', '.join(MODELS)}")
        _check(self.max_batch_size >= 1, "--max-batch-size", self.max_batch_size, "an integer >= 1")
        _check(self.max_delay_ms >= 0, "--max-delay-ms", self.max_delay_ms, "a number >= 0")
        _check(
            self.queue_size is None or self.queue_size >= 1,
            "--queue-size",
            self.queue_size,
            "an integer >= 1",
        )
        _check(self.workers >= 1, "--workers", self.workers, "an integer >= 1")
        _check(
            self.priority_levels >= 1, "--priority-levels", self.priority_levels, "an integer >= 1"
        )
        _check(self.blas_threads >= 1, "--blas-threads", self.blas_threads, "an integer >= 1")
        _check(
            self.drain_timeout_s >= 0, "--drain-timeout-s", self.drain_timeout_s, "a number >= 0"
        )
        _check(self.max_body_bytes >= 1, "--max-body-bytes", self.max_body_bytes, "an integer >= 1")
        _check(self.warmup_delay_s >= 0, "--warmup-delay-s", self.warmup_delay_s, "a number >= 0")
        _check(
            len(self.mlp_dims) >= 2 and all(d >= 1 for d in self.mlp_dims),
            "--mlp-dims",
            ",".join(map(str, self.mlp_dims)),
            "at least two comma-separated integers >= 1, e.g. 256,4096,2048,10",
        )
        _check(
            len(self.sim_dims) == 2 and all(d >= 1 for d in self.sim_dims),
            "--sim-dims",
            ",".join(map(str, self.sim_dims)),
            "two comma-separated integers >= 1 (input width, output width)",
        )
        _check(self.sim_base_ms >= 0, "--sim-base-ms", self.sim_base_ms, "a number >= 0")
        _check(self.sim_item_ms >= 0, "--sim-item-ms", self.sim_item_ms, "a number >= 0")

    @property
    def served_name(self) -> str:
        return self.model_name or self.model

    @property
    def queue_capacity(self) -> int:
        return self.queue_size if self.queue_size is not None else 4 * self.max_batch_size

    def describe(self) -> dict[str, object]:
        """The batching configuration as reported in GET /v2 (metadata for results)."""
        return {
            "model": self.model,
            "max_batch_size": self.max_batch_size,
            "max_delay_ms": self.max_delay_ms,
            "queue_size": self.queue_capacity,
            "priority_levels": self.priority_levels,
            "workers": self.workers,
            "blas_threads": self.blas_threads,
            "drain_timeout_s": self.drain_timeout_s,
            "max_body_bytes": self.max_body_bytes,
            "mlp_dims": list(self.mlp_dims),
            "sim_dims": list(self.sim_dims),
            "sim_base_ms": self.sim_base_ms,
            "sim_item_ms": self.sim_item_ms,
            "seed": self.seed,
        }


def _check(ok: bool, flag: str, value: object, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{flag} has value {value!r}. Expected {valid}.")


def _dims(flag: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} has value {text!r}. Expected comma-separated integers, e.g. 256,4096,2048,10."
            ) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness_reference_server",
        description="Reference dynamic-batching KServe V2 inference server.",
    )
    d = ServerConfig()
    p.add_argument(
        "--api",
        choices=APIS,
        default=APIS[0],
        help="openai: the LLM server instead, with its own flags (--api openai --help)",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--model", default=d.model, choices=MODELS)
    p.add_argument("--model-name", default=None, help="served name (default: --model)")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="rows per batch")
    p.add_argument(
        "--max-delay-ms",
        type=float,
        default=d.max_delay_ms,
        help="longest the oldest queued request waits for company",
    )
    p.add_argument(
        "--queue-size",
        type=int,
        default=None,
        help="requests queued per priority level (default 4 x max-batch-size)",
    )
    p.add_argument("--workers", type=int, default=d.workers, help="model-execution threads")
    p.add_argument("--priority-levels", type=int, default=d.priority_levels)
    p.add_argument(
        "--blas-threads", type=int, default=d.blas_threads, help="BLAS threads per worker"
    )
    p.add_argument("--drain-timeout-s", type=float, default=d.drain_timeout_s)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument(
        "--warmup-delay-s",
        type=float,
        default=d.warmup_delay_s,
        help="extra time spent in warmup before ready (to observe readiness gating)",
    )
    p.add_argument("--mlp-dims", type=_dims("--mlp-dims"), default=d.mlp_dims)
    p.add_argument("--sim-dims", type=_dims("--sim-dims"), default=d.sim_dims)
    p.add_argument("--sim-base-ms", type=float, default=d.sim_base_ms)
    p.add_argument("--sim-item-ms", type=float, default=d.sim_item_ms)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[:PARAM]",
        help=FAULT_HELP,
    )
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument("--access-log", action="store_true")
    return p


def selected_api(argv: Sequence[str]) -> str:
    """The ``--api`` in argv (``kserve-v2`` when absent); ConfigError if not one of APIS."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--api", default=APIS[0])
    api = p.parse_known_args(argv)[0].api
    if api not in APIS:
        raise ConfigError(f"--api has value {api!r}. Expected one of {', '.join(APIS)}.")
    return api


def parse_config(argv: Sequence[str] | None = None) -> ServerConfig:
    """Parse argv into a validated config; raises ConfigError on invalid values."""
    ns = build_parser().parse_args(argv)
    if ns.api != APIS[0]:
        raise ConfigError(f"--api {ns.api} is configured by harness_reference_server.llm.config")
    return ServerConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        model_name=ns.model_name,
        max_batch_size=ns.max_batch_size,
        max_delay_ms=ns.max_delay_ms,
        queue_size=ns.queue_size,
        workers=ns.workers,
        priority_levels=ns.priority_levels,
        blas_threads=ns.blas_threads,
        drain_timeout_s=ns.drain_timeout_s,
        max_body_bytes=ns.max_body_bytes,
        warmup_delay_s=ns.warmup_delay_s,
        mlp_dims=ns.mlp_dims,
        sim_dims=ns.sim_dims,
        sim_base_ms=ns.sim_base_ms,
        sim_item_ms=ns.sim_item_ms,
        seed=ns.seed,
        faults=parse_faults(ns.fault),
        log_level=ns.log_level,
        access_log=ns.access_log,
    )
