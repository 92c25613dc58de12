"""Synthetic traffic for the reference document: per-second windows, per-class and
per-stage histograms, and the server's and the machine's sampled series."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from harness.testing.results import CLASSES, SUT, counters, hdr


def simulate(
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


def class_results(
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


def by_stage(
    rows: list[dict[str, Any]], by_class: dict[str, list[np.ndarray]], stages: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per-stage, per-class counters and histograms (chunk i of a class is second i)."""
    out = {}
    for st in stages:
        lo, hi = int(st["start_s"]), int(st["end_s"])
        mine = [r for r in rows if lo <= r["t"] < hi]
        out[st["name"]] = class_results(mine, {c: chunks[lo:hi] for c, chunks in by_class.items()})
    return out


def total_counters(by_class: dict[str, Any]) -> dict[str, Any]:
    ok = sum(v["counters"]["ok"] for v in by_class.values())
    failed: dict[str, int] = {}
    for v in by_class.values():
        for k, n in v["counters"]["failed"].items():
            failed[k] = failed.get(k, 0) + n
    return counters(ok, failed)


def server_record(
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


def system_record(
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
