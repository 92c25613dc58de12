"""The reference synthetic results document: ``build_document()`` gives a complete,
deterministic run of five scenarios (steady state, contention, linearity, soak, and an
invalid spike run) with HDR histograms, windows, server series, per-thread CPU, chaos,
linearity and contention data and checks that pass, fail and are skipped.

Regenerate the golden JUnit file (never the golden results of a released schema) with
``python -m harness.testing.reference_document --junit``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from harness.results import SCHEMA
from harness.testing.results import (
    CLASSES,
    LOADGEN,
    MACHINE,
    SUT,
    check,
    counters,
    hdr,
    scenario,
    stage,
)
from harness.testing.traffic import (
    by_stage,
    class_results,
    server_record,
    simulate,
    system_record,
    total_counters,
)


def steady_state(rng: np.random.Generator) -> dict[str, Any]:
    dur = 40
    windows, chunks, by_cls = simulate(
        rng, dur, lambda t: 200.0, lambda t, c: 2.5 if c == "high" else 3.0
    )
    stages = [stage("steady", 0, dur, 200.0)]
    by_class = class_results(windows["rows"], by_cls)
    tot = total_counters(by_class)
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
        by_stage=by_stage(windows["rows"], by_cls, stages),
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
        server=server_record(rng, dur, lambda t: 180.0, lambda t: 9, lambda t: 24, lambda t: 60.0),
        system=system_record(rng, dur, lambda t: 55.0),
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

    windows, chunks, by_cls = simulate(
        rng,
        dur,
        lambda t: 180.0,
        lambda t, c: (7.5 if hog(t) else 3.0) * (0.8 if c == "high" else 1.0),
        errs,
    )
    by_class = class_results(windows["rows"], by_cls)
    tot = total_counters(by_class)
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
        by_stage=by_stage(windows["rows"], by_cls, stages),
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
        server=server_record(
            rng, dur, lambda t: 175.0, lambda t: 9, lambda t: 24, lambda t: 35.0 if hog(t) else 60.0
        ),
        system=system_record(rng, dur, lambda t: 95.0 if hog(t) else 50.0),
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
    windows, chunks, by_cls = simulate(rng, dur, lambda t: 150.0, lambda t, c: 3.0 + t / 400)
    stages = [stage("soak", 0, dur, 150.0)]
    by_class = class_results(windows["rows"], by_cls)
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
        counters=total_counters(by_class),
        by_class=by_class,
        by_stage=by_stage(windows["rows"], by_cls, stages),
        windows=windows,
        server=server_record(
            rng,
            dur,
            lambda t: 150.0 + 3.1 * t / 60,
            lambda t: 9 if t < 60 else 10,
            None,
            lambda t: 50.0,
        ),
        system=system_record(rng, dur, lambda t: 45.0),
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

    windows, chunks, by_cls = simulate(
        rng, dur, lambda t: 900.0 if spiking(t) else 200.0, lambda t, c: 3.0
    )
    by_class = class_results(windows["rows"], by_cls)
    tot = total_counters(by_class)
    tot["scheduled"] += 312  # sent by the scheduler, never completed nor counted as dropped
    system = system_record(rng, dur, lambda t: 90.0 if spiking(t) else 50.0)
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

    data = Path(__file__).resolve().parents[2] / "tests" / "data"
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
