"""Builders of results documents (schema ``harness.results/1``), piece by piece.

``hdr``, ``counters``, ``check``, ``scenario`` and ``stage`` build the records of
docs/outputs.md with every documented key, so a test hand-builds exactly what it needs.
The complete synthetic document of five scenarios is ``harness.testing.reference_document``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

T0 = 1764489600.0  # 2025-11-30T08:00:00Z: fixed so documents are reproducible
MACHINE = {
    "host": "ci-runner-1",
    "cpu_count": 2,
    "affinity": [0, 1],
    "python": "3.11.7",
    "platform": "Linux-6.1.0-x86_64-with-glibc2.36",
    "harness_version": "0.1.0",
}
SUT = {
    "target": "http://127.0.0.1:8000",
    "pid": 4242,
    "cmd": "python -m harness_reference_server --port 8000 --model mlp --workers 1",
    "model": "mlp",
    "cores": [1],
    "config": {"name": "harness_reference_server", "version": "0.1.0", "max_batch_size": 32},
}
LOADGEN = {"cores": [0], "workers": 1, "locust_version": "2.47.0"}
CLASSES = {
    "high": {"priority": 1, "share": 0.2, "timeout_us": None},
    "default": {"priority": 0, "share": 0.8, "timeout_us": None},
}
ERROR_KINDS = (
    "http_503",
    "http_500",
    "timeout",
    "connection",
    "cross_wired",
    "drift",
    "id_mismatch",
)


def new_hdr() -> HdrHistogram:
    return HdrHistogram(1, 60_000_000, 3)


def hdr(latencies_us: Iterable[float]) -> str:
    """Encode latencies (µs) as the document stores them: an HDR ``encode()`` string."""
    h = new_hdr()
    values, counts = np.unique(
        np.clip(np.asarray(list(latencies_us), dtype=np.int64), 1, 60_000_000), return_counts=True
    )
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        h.record_value(v, c)
    return h.encode().decode("ascii")


def scaled_hdr(encoded: str, factor: float) -> str:
    """The same histogram with every latency multiplied by ``factor`` (a slower release)."""
    src = HdrHistogram.decode(encoded.encode("ascii"))
    out = new_hdr()
    for item in src.get_recorded_iterator():
        out.record_value(
            max(1, int(item.value_iterated_to * factor)), item.count_added_in_this_iter_step
        )
    return out.encode().decode("ascii")


def counters(
    ok: int, failed: dict[str, int] | None = None, dropped: int = 0, in_flight: int = 0
) -> dict[str, Any]:
    fails = dict.fromkeys(ERROR_KINDS, 0)
    fails.update(failed or {})
    return {
        "scheduled": ok + sum(fails.values()) + dropped + in_flight,
        "ok": ok,
        "dropped": dropped,
        "in_flight": in_flight,
        "failed": fails,
    }


def check(
    id: str,
    passed: bool | None,
    value: float | None = None,
    threshold: float | None = None,
    op: str = "<=",
    unit: str = "",
    n: int | None = None,
    detail: str = "",
    skipped: str | None = None,
) -> dict[str, Any]:
    return {
        "id": id,
        "passed": passed,
        "value": value,
        "threshold": threshold,
        "op": op,
        "unit": unit,
        "n": n,
        "detail": detail,
        "skipped": skipped,
    }


def scenario(name: str, duration_s: float, **fields: Any) -> dict[str, Any]:
    """A scenario result with every documented key; ``fields`` override the defaults."""
    sc: dict[str, Any] = {
        "name": name,
        "file": f"scenarios/{name}.toml",
        "mode": "quick",
        "started_unix": T0,
        "duration_s": duration_s,
        "partial": False,
        "capacity_rps": None,
        "check_config": {},
        "time_to_ready_s": None,
        "stages": [],
        "classes": CLASSES,
        "counters": counters(0),
        "by_class": {},
        "by_stage": {},
        "windows": {"width_s": 1.0, "rows": []},
        "first_requests": None,
        "dispatch_lag_hdr": None,
        "error_latency_hdr": None,
        "integrity": None,
        "linearity": None,
        "contention": None,
        "chaos": [],
        "server": None,
        "system": None,
        "metrics": None,
        "checks": [],
        "validity": [],
        "verdict": None,
    }
    sc.update(fields)
    return sc


def stage(
    name: str, start: float, end: float, rate: float | None = 100.0, **kw: Any
) -> dict[str, Any]:
    """A stage record of an open-loop stage (``kw`` adds or overrides fields)."""
    return {
        "name": name,
        "start_s": start,
        "end_s": end,
        "kind": "open",
        "rate_rps": rate,
        "users": None,
        **kw,
    }
