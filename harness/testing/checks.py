"""Scenario results sized for one check, and assertions on a check's verdict.

``result`` is a complete, schema-valid scenario record for one check (no classes, an empty
run) that a test fills with what the check reads; ``steady_result``, ``priority_result``,
``spike_result``, ``soak_result`` and ``good_steady`` are the common shapes; ``run`` runs
one check through the registry and asserts what every verdict must say; ``passed``,
``failed`` and ``skipped`` assert its outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.checks import REGISTRY, Check, resolve_params
from harness.testing.results import scenario, stage

MIB = 1024 * 1024


def hdr(values_us: Iterable[float]) -> str:
    h = HdrHistogram(1, 60_000_000, 3)
    for v in values_us:
        h.record_value(max(1, int(v)))
    return h.encode().decode("ascii")


def counters(
    ok: int, failed: dict[str, int] | None = None, dropped: int = 0, in_flight: int = 0
) -> dict[str, Any]:
    failed = {"http_503": 0, "timeout": 0, **(failed or {})}
    return {
        "scheduled": ok + sum(failed.values()) + dropped + in_flight,
        "ok": ok,
        "dropped": dropped,
        "in_flight": in_flight,
        "failed": failed,
    }


def result(**fields: Any) -> dict[str, Any]:
    """A scenario result for one check: the factory's complete record (schema-valid)
    with no classes, no start time and an empty run; ``fields`` override."""
    defaults: dict[str, Any] = {"started_unix": None, "classes": {}}
    return scenario(
        str(fields.pop("name", "t")),
        float(fields.pop("duration_s", 60.0)),
        **(defaults | fields),
    )


def row(t: float, p99: float | None, ok: int = 100, cls: str = "default", **errors: int) -> dict:
    return {
        "t": float(t),
        "class": cls,
        "n": ok + sum(errors.values()),
        "ok": ok,
        "errors": errors,
        "p50_ms": None if p99 is None else p99 / 3,
        "p90_ms": None if p99 is None else p99 / 1.5,
        "p99_ms": p99,
        "max_ms": p99,
    }


def run(check_id: str, sc: dict[str, Any], **params: Any) -> Check:
    c = REGISTRY[check_id].fn(sc, resolve_params(check_id, params))
    assert c.id == check_id
    json.dumps(c.to_dict(), allow_nan=False)  # always a valid JSON check object
    assert c.detail  # every verdict says something
    if c.passed is None:
        assert c.skipped
    else:
        assert c.skipped is None
    return c


def passed(c: Check) -> None:
    assert c.passed is True, c.detail


def failed(c: Check) -> None:
    assert c.passed is False, c.detail


def skipped(c: Check, *words: str) -> None:
    assert c.passed is None and c.skipped, c.detail
    for w in words:
        assert w in c.skipped, c.skipped


def steady_result(latencies_ms: Iterable[float], fails: dict[str, int] | None = None, **kw):
    lat = list(latencies_ms)
    c = counters(len(lat), fails)
    return result(
        stages=[stage("steady", 0, 40, 100.0)],
        counters=c,
        by_class={"default": {"counters": c, "latency_hdr": hdr(x * 1000 for x in lat)}},
        by_stage={
            "steady": {"default": {"counters": c, "latency_hdr": hdr(x * 1000 for x in lat)}}
        },
        **kw,
    )


def priority_result(high_ms: float, high_fail: int, low_fail: int = 500) -> dict[str, Any]:
    hc = counters(1000 - high_fail, {"http_503": high_fail})
    lc = counters(4000 - low_fail, {"http_503": low_fail})
    classes = {
        "high": {"priority": 1, "share": 0.2, "timeout_us": None},
        "low": {"priority": 2, "share": 0.8, "timeout_us": None},
    }
    by = {
        "high": {"counters": hc, "latency_hdr": hdr([high_ms * 1000] * hc["ok"])},
        "low": {"counters": lc, "latency_hdr": hdr([300_000] * lc["ok"])},
    }
    return result(
        stages=[stage("warmup", 0, 10), stage("overload", 10, 45, 300.0)],
        classes=classes,
        by_class=by,
        by_stage={"overload": by},
    )


def spike_result(recover_at: float, end: float = 60.0, **kw: Any) -> dict[str, Any]:
    rows = []
    for t in range(int(end)):
        if t < 20:
            p = 10.0 + (t % 3)
        elif t < recover_at:
            p = 400.0
        else:
            p = 11.0
        rows.append(row(t, p))
    return result(
        stages=[
            stage("baseline", 0, 20, 50, warmup_s=5),
            stage("spike", 20, 30, 200),
            stage("recovery", 30, end, 50),
        ],
        windows={"width_s": 1.0, "rows": rows},
        **kw,
    )


def hog_record(start: float, end: float, cores: int = 1, **fields: Any) -> dict[str, Any]:
    """A cpu_hog chaos record as the timeline writes it, with its evidence."""
    return {
        "action": "cpu_hog",
        "params": {"cores": cores, "pin": [1], "duration_s": end - start},
        "at_s": start,
        "start_s": start,
        "end_s": end,
        "ok": True,
        "error": None,
        "detail": {
            "pids": list(range(900, 900 + cores)),
            "cores_used": [1] * cores,
            "affinity": [[1]] * cores,
            "hog_cpu_s": [round(0.5 * (end - start), 2)] * cores,
        },
        **fields,
    }


def soak_result(
    rss_mib_per_min: float = 0.0,
    threads_per_min: float = 0.0,
    seconds: int = 120,
    seed: int = 0,
    with_fds: bool = True,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t = np.arange(0, seconds, 1.0)
    noise = np.zeros(seconds)
    for i in range(1, seconds):
        noise[i] = 0.7 * noise[i - 1] + rng.normal(0, 0.3)
    rss = (80 + rss_mib_per_min * t / 60 + noise) * MIB
    threads = np.floor(12 + threads_per_min * t / 60)
    series = {"t": t.tolist(), "rss_bytes": rss.tolist(), "threads": threads.tolist()}
    if with_fds:
        series["fds"] = [20.0] * seconds
    return result(
        duration_s=float(seconds),
        counters=counters(6000),
        server={"pid": 1, "interval_s": 1.0, "ticks": seconds, "missed_ticks": 0, "series": series},
    )


def inconclusive_rss_result() -> dict[str, Any]:
    """A soak whose RSS grows just above soak.rss_trend's default threshold S in noise as
    wide as S: significant growth the detector cannot confirm (inconclusive). The detector
    is scale-free (every statistic it uses moves with the series' unit), so the series is
    drawn in units of S."""
    from harness.catalog import CATALOG

    s = float(CATALOG["soak.rss_trend"].defaults["threshold"])
    rng = np.random.default_rng(1)
    sc = soak_result()
    t = np.asarray(sc["server"]["series"]["t"])
    sc["server"]["series"]["rss_bytes"] = (
        (100 + s * (1.2 * t / 60 + rng.normal(0, 1, len(t)))) * MIB
    ).tolist()
    return sc


def good_steady(**overrides: Any) -> dict[str, Any]:
    sc = steady_result([5.0] * 3960)
    sc["check_config"] = {
        "steady.p99_ms": {"stage": "steady"},
        "steady.error_rate": {},
        "steady.throughput": {"stage": "steady"},
    }
    sc.update(overrides)
    return sc
