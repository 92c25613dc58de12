"""Builders for realistic synthetic results documents (schema ``harness.results/1``).

Reusable by any test that needs a results document: ``build_document()`` gives a complete,
deterministic run of five scenarios (steady state, contention, linearity, soak, and an
invalid spike run) with HDR histograms, windows, server series, per-thread CPU, chaos,
linearity and contention data and checks that pass, fail and are skipped. The smaller
builders (``hdr``, ``check``, ``scenario``…) let a test hand-build exactly what it needs.

Regenerate the golden JUnit file (never the golden results of a released schema) with
``python -m tests.results_factory --junit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.results import SCHEMA

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
    "cmd": "python -m reference_server --port 8000 --model mlp --workers 1",
    "model": "mlp",
    "cores": [1],
    "config": {"name": "reference_server", "version": "0.1.0", "max_batch_size": 32},
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


# --- traffic simulation --------------------------------------------------------------


def _simulate(
    rng: np.random.Generator,
    duration_s: int,
    rate_rps: Callable[[int], float],
    median_ms: Callable[[int, str], float],
    errors: Callable[[int, str], dict[str, int]] | None = None,
) -> tuple[dict[str, Any], list[np.ndarray], dict[str, list[np.ndarray]]]:
    """Per-second windows for each class; returns (windows, all-latency chunks, by class)."""
    rows: list[dict[str, Any]] = []
    by_class: dict[str, list[np.ndarray]] = {c: [] for c in CLASSES}
    for t in range(duration_s):
        for cls, meta in CLASSES.items():
            n = int(rng.poisson(rate_rps(t) * meta["share"]))
            errs = {k: v for k, v in (errors(t, cls) if errors else {}).items() if v}
            ok = max(n - sum(errs.values()), 0)
            lat_ms = rng.lognormal(math.log(median_ms(t, cls)), 0.35, size=ok)
            lat_us = np.clip(lat_ms * 1000.0, 1, None)
            by_class[cls].append(lat_us)
            row: dict[str, Any] = {"t": float(t), "class": cls, "n": n, "ok": ok, "errors": errs}
            if ok:
                p50, p90, p99 = np.percentile(lat_ms, [50, 90, 99])
                row.update(
                    p50_ms=round(float(p50), 3),
                    p90_ms=round(float(p90), 3),
                    p99_ms=round(float(p99), 3),
                    max_ms=round(float(lat_ms.max()), 3),
                )
            else:
                row.update(p50_ms=None, p90_ms=None, p99_ms=None, max_ms=None)
            rows.append(row)
    chunks = [c for v in by_class.values() for c in v]
    return {"width_s": 1.0, "rows": rows}, chunks, by_class


def _class_results(
    rows: list[dict[str, Any]], by_class: dict[str, list[np.ndarray]]
) -> dict[str, Any]:
    out = {}
    for cls, chunks in by_class.items():
        mine = [r for r in rows if r["class"] == cls]
        failed: dict[str, int] = {}
        for r in mine:
            for k, v in r["errors"].items():
                failed[k] = failed.get(k, 0) + v
        ok = sum(r["ok"] for r in mine)
        out[cls] = {
            "counters": counters(ok, failed),
            "latency_hdr": hdr(np.concatenate(chunks) if chunks else []),
        }
    return out


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


def _by_stage(
    rows: list[dict[str, Any]], by_class: dict[str, list[np.ndarray]], stages: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per-stage, per-class counters and histograms (chunk i of a class is second i)."""
    out = {}
    for st in stages:
        lo, hi = int(st["start_s"]), int(st["end_s"])
        mine = [r for r in rows if lo <= r["t"] < hi]
        out[st["name"]] = _class_results(mine, {c: chunks[lo:hi] for c, chunks in by_class.items()})
    return out


def _total_counters(by_class: dict[str, Any]) -> dict[str, Any]:
    ok = sum(v["counters"]["ok"] for v in by_class.values())
    failed: dict[str, int] = {}
    for v in by_class.values():
        for k, n in v["counters"]["failed"].items():
            failed[k] = failed.get(k, 0) + n
    return counters(ok, failed)


def _server(
    rng: np.random.Generator,
    duration_s: int,
    rss_mib: Callable[[int], float],
    threads: Callable[[int], int],
    fds: Callable[[int], int] | None,
    cpu_pct: Callable[[int], float],
    pid: int = SUT["pid"],
) -> dict[str, Any]:
    ts = list(range(duration_s))
    series = {
        "t": [float(t) for t in ts],
        "rss_bytes": [int(rss_mib(t) * 2**20 + rng.normal(0, 0.3) * 2**20) for t in ts],
        "uss_bytes": [int(rss_mib(t) * 0.9 * 2**20) if t % 10 == 0 else None for t in ts],
        "threads": [threads(t) for t in ts],
        "fds": [fds(t) if fds else None for t in ts],
        "cpu_pct": [round(float(max(cpu_pct(t) + rng.normal(0, 3), 0)), 1) for t in ts],
        "late_s": [round(float(abs(rng.normal(0, 0.002))), 4) for t in ts],
    }
    top = []
    for tid, name, share in (
        (pid, "python", 0.55),
        (pid + 3, "batcher", 0.3),
        (pid + 4, "http-worker", 0.1),
    ):
        cpu = [
            round(float(max(series["cpu_pct"][i] * share + rng.normal(0, 1), 0)), 1)
            for i in range(duration_s)
        ]
        top.append(
            {
                "tid": tid,
                "name": name,
                "cpu_pct_mean": round(float(np.mean(cpu)), 2),
                "cpu_pct_max": float(max(cpu)),
                "wait_pct_mean": round(float(share * 4), 2),
                "cswch_s_mean": round(200 * share, 1),
                "nvcswch_s_mean": round(10 * share, 1),
                "series": {"t": series["t"], "cpu_pct": cpu},
            }
        )
    return {
        "pid": pid,
        "interval_s": 1.0,
        "ticks": duration_s,
        "missed_ticks": 0,
        "series": series,
        "threads_top": top,
    }


def _system(
    rng: np.random.Generator, duration_s: int, busy: Callable[[int], float]
) -> dict[str, Any]:
    ts = [float(t) for t in range(duration_s)]
    c0 = [round(float(min(busy(t) + rng.normal(0, 4), 100)), 1) for t in range(duration_s)]
    c1 = [round(float(min(busy(t) * 0.8 + rng.normal(0, 4), 100)), 1) for t in range(duration_s)]
    return {
        "series": {
            "t": ts,
            "cpu_pct": [round((a + b) / 2, 1) for a, b in zip(c0, c1, strict=True)],
            "loadgen_cpu_pct": [round(float(30 + rng.normal(0, 3)), 1) for _ in ts],
            "per_core": [c0, c1],
        }
    }


# --- the five scenarios of the reference document -------------------------------------


def steady_state(rng: np.random.Generator) -> dict[str, Any]:
    dur = 40
    windows, chunks, by_cls = _simulate(
        rng, dur, lambda t: 200.0, lambda t, c: 2.5 if c == "high" else 3.0
    )
    stages = [stage("steady", 0, dur, 200.0)]
    by_class = _class_results(windows["rows"], by_cls)
    tot = _total_counters(by_class)
    n = tot["ok"]
    p99 = HdrHistogram.decode(hdr(np.concatenate(chunks))).get_value_at_percentile(99) / 1000
    return scenario(
        "steady_state",
        float(dur),
        capacity_rps=330.0,
        check_config={
            "steady.p99_ms": {"threshold": 50},
            "steady.error_rate": {},
            "steady.throughput": {},
            "accounting.balanced": {},
        },
        stages=stages,
        counters=tot,
        by_class=by_class,
        by_stage=_by_stage(windows["rows"], by_cls, stages),
        windows=windows,
        dispatch_lag_hdr=hdr(rng.exponential(150, size=2000)),
        error_latency_hdr=hdr([]),
        integrity={
            "checked": n,
            "ok": n,
            "drift": 0,
            "cross_wired": 0,
            "id_mismatch": 0,
            "tolerance": 1e-5,
            "pool": 128,
            "examples": [],
        },
        server=_server(rng, dur, lambda t: 180.0, lambda t: 9, lambda t: 24, lambda t: 60.0),
        system=_system(rng, dur, lambda t: 55.0),
        checks=[
            check(
                "steady.p99_ms", True, round(p99, 2), 50, "<=", "ms", n, "p99 well inside the SLO"
            ),
            check("steady.error_rate", True, 0.0, 0.01, "<=", "ratio", n, "no failed requests"),
            check(
                "steady.throughput",
                True,
                round(n / dur, 1),
                190.0,
                ">=",
                "req/s",
                n,
                "served the offered 200 req/s",
            ),
            check(
                "accounting.balanced",
                True,
                0,
                0,
                "==",
                "requests",
                tot["scheduled"],
                "scheduled = ok + failed + dropped + in flight",
            ),
        ],
        verdict="pass",
    )


def contention(rng: np.random.Generator) -> dict[str, Any]:
    dur = 60

    def hog(t: int) -> bool:
        return 20 <= t < 40

    def errs(t: int, cls: str) -> dict[str, int]:
        # With one of its cores taken the server sheds ~58 % of the offered load as 503s.
        share = CLASSES[cls]["share"]
        return {"http_503": int(rng.poisson(0.58 * 180 * share))} if hog(t) else {}

    windows, chunks, by_cls = _simulate(
        rng,
        dur,
        lambda t: 180.0,
        lambda t, c: (7.5 if hog(t) else 3.0) * (0.8 if c == "high" else 1.0),
        errs,
    )
    by_class = _class_results(windows["rows"], by_cls)
    tot = _total_counters(by_class)
    stages = [
        {
            "name": "baseline",
            "start_s": 0,
            "end_s": 20,
            "kind": "open",
            "rate_rps": 180.0,
            "users": None,
        },
        {
            "name": "hog",
            "start_s": 20,
            "end_s": 40,
            "kind": "open",
            "rate_rps": 180.0,
            "users": None,
        },
        {
            "name": "after",
            "start_s": 40,
            "end_s": 60,
            "kind": "open",
            "rate_rps": 180.0,
            "users": None,
        },
    ]
    return scenario(
        "contention",
        float(dur),
        capacity_rps=300.0,
        check_config={
            "contention.throughput_ratio": {"threshold": 0.5},
            "contention.fail_fast": {},
            "contention.recovery_s": {},
        },
        stages=stages,
        counters=tot,
        by_class=by_class,
        by_stage=_by_stage(windows["rows"], by_cls, stages),
        windows=windows,
        dispatch_lag_hdr=hdr(rng.exponential(200, size=2000)),
        error_latency_hdr=hdr(rng.lognormal(math.log(800), 0.3, size=300)),
        contention={
            "blocks": [
                {
                    "kind": s["name"],
                    "start_s": s["start_s"],
                    "end_s": s["end_s"],
                }
                for s in stages
            ]
        },
        chaos=[
            {
                "action": "cpu_hog",
                "params": {"cores": 1, "cpus": [1]},
                "start_s": 20.0,
                "end_s": 40.0,
                "ok": True,
                "error": None,
            }
        ],
        server=_server(
            rng, dur, lambda t: 175.0, lambda t: 9, lambda t: 24, lambda t: 35.0 if hog(t) else 60.0
        ),
        system=_system(rng, dur, lambda t: 95.0 if hog(t) else 50.0),
        checks=[
            check(
                "contention.throughput_ratio",
                False,
                0.42,
                0.5,
                ">=",
                "x",
                20,
                "median throughput with 1 core taken was 0.42x baseline — find the serialized stage in the per-thread CPU plot",
            ),
            check(
                "contention.fail_fast",
                True,
                0.98,
                0.9,
                ">=",
                "ratio",
                2090,
                "98 % of failed requests were answered quickly with 503/429 (median 0.9 ms)",
            ),
            check(
                "contention.recovery_s",
                True,
                2.0,
                10,
                "<=",
                "s",
                20,
                "p99 back within the baseline band 2 s after the hog stopped",
            ),
        ],
        verdict="fail",
    )


def linearity(rng: np.random.Generator) -> dict[str, Any]:
    x1 = 55.0
    points = []
    for n, eff in ((1, 1.0), (2, 0.93), (3, 0.7), (4, 0.52)):
        points.append(
            {
                "n": n,
                "throughput_rps": [
                    round(float(x1 * n * eff * (1 + rng.normal(0, 0.02))), 2) for _ in range(3)
                ],
            }
        )
    stages = [
        {
            "name": f"n{p['n']}",
            "start_s": 10 * i,
            "end_s": 10 * (i + 1),
            "kind": "closed",
            "rate_rps": None,
            "users": p["n"],
        }
        for i, p in enumerate(points)
    ]
    return scenario(
        "linearity",
        40.0,
        check_config={"linearity.efficiency": {"threshold": 0.75}},
        stages=stages,
        counters=counters(7200),
        linearity={"points": points, "cores_available": 2},
        windows=None,
        checks=[
            check(
                "linearity.efficiency",
                True,
                0.93,
                0.75,
                ">=",
                "ratio",
                6,
                "E(2) = 0.93 for N <= 2 cores; USL peak beyond the core count",
            )
        ],
        verdict="pass",
    )


def soak(rng: np.random.Generator) -> dict[str, Any]:
    dur = 120
    windows, chunks, by_cls = _simulate(rng, dur, lambda t: 150.0, lambda t, c: 3.0 + t / 400)
    stages = [stage("soak", 0, dur, 150.0)]
    by_class = _class_results(windows["rows"], by_cls)
    return scenario(
        "soak",
        float(dur),
        capacity_rps=300.0,
        check_config={
            "soak.rss_trend": {"threshold": 1.0},
            "soak.threads_trend": {},
            "soak.fds_trend": {},
            "soak.latency_drift": {},
        },
        stages=stages,
        counters=_total_counters(by_class),
        by_class=by_class,
        by_stage=_by_stage(windows["rows"], by_cls, stages),
        windows=windows,
        server=_server(
            rng,
            dur,
            lambda t: 150.0 + 3.1 * t / 60,
            lambda t: 9 if t < 60 else 10,
            None,
            lambda t: 50.0,
        ),
        system=_system(rng, dur, lambda t: 45.0),
        checks=[
            check(
                "soak.rss_trend",
                False,
                3.1,
                1.0,
                "<=",
                "MiB/min",
                90,
                "RSS grew +3.1 MiB/min over the last 90 s (p=0.001) — rerun with --full to confirm",
            ),
            check(
                "soak.threads_trend",
                True,
                0.0,
                0.5,
                "<=",
                "threads/min",
                90,
                "one step up at 60 s, no sustained growth",
            ),
            check(
                "soak.fds_trend",
                None,
                None,
                0.5,
                "<=",
                "fds/min",
                None,
                "",
                skipped="fd counts not available: /proc/PID/fd unreadable",
            ),
            check("soak.latency_drift", True, 1.08, 2.0, "<=", "x", 8000, "late p99 / early p99"),
        ],
        verdict="fail",
    )


def invalid_spike(rng: np.random.Generator) -> dict[str, Any]:
    """A spike run that judges nothing: Locust saturated its core and lost requests."""
    dur = 20

    def spiking(t: int) -> bool:
        return 5 <= t < 10

    windows, chunks, by_cls = _simulate(
        rng, dur, lambda t: 900.0 if spiking(t) else 200.0, lambda t, c: 3.0
    )
    by_class = _class_results(windows["rows"], by_cls)
    tot = _total_counters(by_class)
    tot["scheduled"] += 312  # sent by the scheduler, never completed nor counted as dropped
    system = _system(rng, dur, lambda t: 90.0 if spiking(t) else 50.0)
    system["series"]["loadgen_cpu_pct"] = [
        97.0 if spiking(int(t)) else v
        for t, v in zip(system["series"]["t"], system["series"]["loadgen_cpu_pct"], strict=True)
    ]
    return scenario(
        "spike",
        float(dur),
        check_config={"spike.recovery_s": {}},
        stages=[
            stage("baseline", 0, 5, 200.0),
            stage("spike", 5, 10, 900.0),
            stage("after", 10, dur, 200.0),
        ],
        counters=tot,
        by_class=by_class,
        windows=windows,
        system=system,
        validity=[
            "load generator CPU 97% >= 90% for 5 s: the generator, not the server, was the bottleneck — run Locust with --processes 2",
            f"run accounting does not balance: scheduled {tot['scheduled']:,} != ok + failed + dropped + in flight (312 missing)",
        ],
        checks=[
            check(
                "spike.recovery_s",
                None,
                None,
                10.0,
                "<=",
                "s",
                None,
                "",
                skipped="run invalid: load generator saturated",
            ),
            check(
                "accounting.balanced",
                False,
                312,
                0,
                "==",
                "requests",
                tot["scheduled"],
                "312 scheduled requests unaccounted for",
            ),
        ],
        verdict="invalid",
    )


def build_document(seed: int = 0, scenarios: Sequence[str] | None = None) -> dict[str, Any]:
    """The reference synthetic document (deterministic for a given seed)."""
    rng = np.random.default_rng(seed)
    makers = {
        "steady_state": steady_state,
        "contention": contention,
        "linearity": linearity,
        "soak": soak,
        "spike": invalid_spike,
    }
    chosen = list(makers) if scenarios is None else list(scenarios)
    scs = [makers[name](rng) for name in chosen]
    rank = {"invalid": 3, "fail": 2, "pass": 1}
    verdict = max((s["verdict"] for s in scs), key=lambda v: rank[v]) if scs else None
    return {
        "schema": SCHEMA,
        "harness_version": "0.1.0",
        "created": "2025-11-30T08:00:00Z",
        "verdict": verdict,
        "partial": False,
        "machine": dict(MACHINE),
        "sut": dict(SUT),
        "loadgen": dict(LOADGEN),
        "scenarios": scs,
    }


if __name__ == "__main__":
    import argparse
    from pathlib import Path

    from harness.report.junit import render_junit
    from harness.results import load_document, write_document

    data = Path(__file__).parent / "data"
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--results",
        action="store_true",
        help="(re)write tests/data/results_v1.json — only while v1 is unreleased",
    )
    ap.add_argument(
        "--junit",
        action="store_true",
        help="re-render tests/data/junit_v1.xml from the golden results",
    )
    args = ap.parse_args()
    if args.results:
        write_document(data / "results_v1.json", build_document())
    if args.junit:
        (data / "junit_v1.xml").write_text(
            render_junit(load_document(data / "results_v1.json")), encoding="utf-8"
        )
