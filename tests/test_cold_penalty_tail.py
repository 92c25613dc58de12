"""The cold-start and restart penalties are never decided by one or two requests: each
judges a latency with at least ``min_tail`` (5) requests at or above it — the first
requests' p99 only once there are 500 of them, their 5th slowest before; after a restart,
the 5th slowest request (a bound the window summaries prove), not the worst window's p99,
which is the 2nd slowest of its ~100 requests."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from harness.analysis.hdr import nearest_rank
from harness.checks import REGISTRY, Check, resolve_params
from harness.checks.crash import kth_slowest_bound_ms
from harness.checks.latency import tail_rank
from harness.testing.results import counters, hdr, scenario, stage


def _run(check_id: str, sc: dict[str, Any], **params: Any) -> Check:
    return REGISTRY[check_id].fn(sc, resolve_params(check_id, params))


# -- cold_start.first_p99_ratio ----------------------------------------------------------


def _cold(first_ms: list[float], failed: int = 0, seed: int = 3) -> dict[str, Any]:
    """cold_start --quick: the first len(first_ms) + failed requests sent, and a warm
    stage of 840 answers around 15 ms (the healthy reference server at 60 req/s)."""
    rng = np.random.default_rng(seed)
    warm = rng.lognormal(np.log(12_000), 0.1, size=840)
    cell = {"counters": counters(840), "latency_hdr": hdr(warm)}
    first = {
        "n": len(first_ms) + failed,
        "latency_hdr": hdr(np.asarray(first_ms) * 1000),
        **counters(len(first_ms), {"http_503": failed}),
    }
    return scenario(
        "cold_start",
        20.0,
        stages=[stage("cold", 0.0, 6.0, 60.0), stage("steady", 6.0, 20.0, 60.0)],
        by_stage={"steady": {"default": cell}},
        by_class={"default": cell},
        first_requests=first,
    )


def test_the_tail_rank_leaves_min_tail_requests_at_or_above_it() -> None:
    assert tail_rank(100, 0.99, 5) == 96  # the p99 would be rank 99: 2 at or above
    assert tail_rank(200, 0.99, 5) == 196
    assert tail_rank(500, 0.99, 5) == nearest_rank(500, 0.99) == 495  # 6 at or above
    assert tail_rank(3, 0.99, 5) == 1


def test_two_slow_first_requests_do_not_decide_a_cold_start() -> None:
    """98 of the first 100 as fast as warm ones, two at 150 ms (a GC pause, a reconnect):
    the p99 of 100 is their 2nd slowest, 10x the warm p99 — it failed. The 5th slowest
    is a warm answer."""
    rng = np.random.default_rng(1)
    first = list(rng.lognormal(np.log(12), 0.1, size=98)) + [150.0, 150.0]
    c = _run("cold_start.first_p99_ratio", _cold(first), steady_stage="steady")
    assert c.passed is True and c.value < 1.5
    assert "5th slowest (p96; a p99 of 100 would be decided by its 2 slowest)" in c.detail


def test_five_slow_first_requests_fail_a_cold_start() -> None:
    rng = np.random.default_rng(2)
    first = list(rng.lognormal(np.log(12), 0.1, size=95)) + [150.0] * 5
    c = _run("cold_start.first_p99_ratio", _cold(first), steady_stage="steady")
    assert c.passed is False and c.value > 5


def test_the_planted_cold_starts_stay_caught() -> None:
    """slow-start:3 (every one of the first 100 queued behind a 3 s init: 79.6–176x at
    p99 in K=3) and cold-errors:10 (the first 10 answered 503: more failures than the
    tail, so the judged latency is a failure)."""
    slow = _run("cold_start.first_p99_ratio", _cold(list(np.linspace(3000, 1500, 100))))
    assert slow.passed is False and slow.value > 50
    rng = np.random.default_rng(4)
    refused = _run(
        "cold_start.first_p99_ratio", _cold(list(rng.lognormal(np.log(12), 0.1, 90)), 10)
    )
    assert refused.passed is False and not math.isfinite(refused.value)
    assert "is a failure" in refused.detail


def test_a_full_run_judges_the_p99_once_it_has_the_samples() -> None:
    rng = np.random.default_rng(5)
    first = list(rng.lognormal(np.log(12), 0.1, size=600))
    c = _run("cold_start.first_p99_ratio", _cold(first))
    assert c.passed is True and "p99 (7 at or above it)" in c.detail  # rank 594 of 600


# -- crash.cold_penalty ------------------------------------------------------------------


def _row(t: float, ok: int, p50: float, p90: float, p99: float, top: float) -> dict[str, Any]:
    return {"t": t, "class": "default", "n": ok, "ok": ok, "errors": {}, "p50_ms": p50,
            "p90_ms": p90, "p99_ms": p99, "max_ms": top}  # fmt: skip


def _crash(after: Callable[[float], tuple[float, float, float, float]]) -> dict[str, Any]:
    """crash_restart --quick: 0.25 s windows of ~100 requests, p99 ~80 ms warm; kill at
    8 s, ready at 8.81 s; ``after(t)`` gives (p50, p90, p99, max) of the windows from
    ready on."""
    rows = []
    for i in range(26 * 4):
        t = i * 0.25
        if 8.0 <= t < 8.75:
            rows.append({"t": t, "class": "default", "n": 100, "ok": 0,
                         "errors": {"connection": 100}, "p50_ms": None, "p90_ms": None,
                         "p99_ms": None, "max_ms": None})  # fmt: skip
        elif t >= 8.75:
            rows.append(_row(t, 100, *after(t)))
        else:
            rows.append(_row(t, 100, 52.0, 70.0, 80.0, 84.0))
    return scenario(
        "crash_restart",
        26.0,
        stages=[
            stage("baseline", 0, 8, 400.0, warmup_s=2.0),
            stage("outage", 8, 12, 400.0),
            stage("after", 12, 26, 400.0),
        ],
        windows={"width_s": 0.25, "rows": rows},
        chaos=[
            {
                "action": "kill",
                "params": {"restart": True, "signal": "SIGKILL", "duration_s": 0.0},
                "at_s": 8.0,
                "start_s": 8.0009,
                "end_s": 8.8104,
                "ok": True,
                "error": None,
                "detail": {"found": True, "gone": True, "new_pid": 2, "time_to_ready_s": 0.79},
            }
        ],
    )


def test_the_fifth_slowest_bound_counts_what_each_summary_proves() -> None:
    rows = [_row(0, 100, 50, 70, 80, 500), _row(1, 100, 50, 70, 400, 450)]
    # one 500, one 450, and rank 99 of the second window: 2 answers >= 400
    assert kth_slowest_bound_ms(rows, 1) == 500
    assert kth_slowest_bound_ms(rows, 3) == 400
    assert kth_slowest_bound_ms(rows, 4) == 80  # 2 in each window are >= 80
    assert kth_slowest_bound_ms(rows, 5) == 70  # the p90s: 11 in each window
    assert kth_slowest_bound_ms(rows, 23) == 50
    assert kth_slowest_bound_ms([_row(0, 3, 50, 60, 70, 80)], 5) is None


def test_one_window_with_two_slow_requests_does_not_decide_a_restart() -> None:
    """One window after ready holds two 600 ms answers (its p99 and max): the worst
    windowed p99 was 7.5x the warm p99 and failed. Two requests are not a cold restart."""
    c = _run("crash.cold_penalty", _crash(lambda t: (52, 70, 600, 600) if t == 9.5
                                          else (52, 70, 80, 84)))  # fmt: skip
    assert c.passed is True and c.value < 1.5
    assert "5th slowest of the 1200 requests" in c.detail


def test_a_restart_that_skipped_its_warm_up_stays_caught() -> None:
    """restart-slow-start's shape: the windows of the first second after ready wait for a
    3 s lazy init (51–66x the warm p99 at the worst windowed p99 in K=3)."""
    c = _run("crash.cold_penalty", _crash(lambda t: (2900, 3100, 3200, 3250) if t < 9.75
                                          else (52, 70, 80, 84)))  # fmt: skip
    assert c.passed is False and c.value == pytest.approx(3200 / 80, rel=0.01)
    # one window of ~100 requests that all waited is enough: its p90 proves 11 of them
    one = _run("crash.cold_penalty", _crash(lambda t: (2000, 2500, 2600, 2700) if t == 9.0
                                            else (52, 70, 80, 84)))  # fmt: skip
    assert one.passed is False and one.value > 25
