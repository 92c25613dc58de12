"""freeze.resource_step has a margin: one thread a pool creates on demand for the backlog
a freeze builds is not a leak, nor a pool that grew and shrank again — but a thread left
idle while a new one took its work is, whatever the margin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.checks import REGISTRY, Check, resolve_params
from harness.testing.results import scenario, stage

RUN_S = 25  # freeze --quick: 8 s baseline, 3 s SIGSTOP, 14 s after
FREEZE = (8.0, 11.0)


def _run(sc: dict[str, Any], **params: Any) -> Check:
    return REGISTRY["freeze.resource_step"].fn(sc, resolve_params("freeze.resource_step", params))


def _thread(tid: int, name: str, cpu: Callable[[float], float]) -> dict[str, Any]:
    t = [float(x) for x in range(1, RUN_S + 1)]
    return {
        "tid": tid,
        "name": name,
        "cpu_pct_mean": 0.0,
        "cpu_pct_max": 0.0,
        "wait_pct_mean": None,
        "cswch_s_mean": 0.0,
        "nvcswch_s_mean": 0.0,
        "series": {"t": t, "cpu_pct": [cpu(x) for x in t]},
    }


def _frozen(
    threads: Callable[[float], int],
    top: list[dict[str, Any]] | None = None,
    fds: Callable[[float], int] = lambda t: 11,
) -> dict[str, Any]:
    """The quick freeze run of the healthy reference server (6 threads, 11 non-socket
    fds, sampled at 1 Hz), with the thread count and per-thread CPU given."""
    t = [float(x) for x in range(1, RUN_S + 1)]
    frozen = [FREEZE[0] <= x < FREEZE[1] for x in t]
    busy = _thread(100, "model-worker_0", lambda x: 0.0 if FREEZE[0] <= x < FREEZE[1] else 70.0)
    loop = _thread(99, "python3", lambda x: 0.0 if FREEZE[0] <= x < FREEZE[1] else 12.0)
    return scenario(
        "freeze",
        float(RUN_S),
        stages=[
            stage("baseline", 0.0, 8.0, 400.0, warmup_s=2.0),
            stage("freeze", 8.0, 11.0, 400.0),
            stage("after", 11.0, float(RUN_S), 400.0),
        ],
        chaos=[
            {
                "action": "pause",
                "params": {"duration_s": 3.0},
                "at_s": FREEZE[0],
                "start_s": FREEZE[0],
                "end_s": FREEZE[1],
                "ok": True,
                "error": None,
                "detail": {},
            }
        ],
        server={
            "pid": 99,
            "interval_s": 1.0,
            "ticks": RUN_S,
            "missed_ticks": 0,
            "series": {
                "t": t,
                "rss_bytes": [190 << 20] * RUN_S,
                "threads": [threads(x) for x in t],
                "fds": [fds(x) + 50 for x in t],
                "socket_fds": [250 if f else 50 for f in frozen],
                "cpu_pct": [0.0 if f else 80.0 for f in frozen],
            },
            "threads_top": top if top is not None else [busy, loop],
        },
    )


def test_one_thread_a_pool_creates_for_the_backlog_is_not_a_leak() -> None:
    """6 → 7 threads after the freeze, every thread that worked before still working:
    a pool grown on demand. Threshold 0 failed it."""
    grown = _thread(101, "pool-worker", lambda x: 0.0 if x < FREEZE[1] else 4.0)
    sc = _frozen(lambda t: 6 if t < FREEZE[1] else 7)
    sc["server"]["threads_top"].append(grown)
    c = _run(sc)
    assert c.passed is True and c.value == 1.0
    assert c.threshold == 1.0 and "max(1, 5% of 17)" in c.detail


def test_a_pool_that_grew_for_the_backlog_and_shrank_again_left_nothing() -> None:
    """+3 threads settled after the freeze, gone before the run's end: not persistent."""
    c = _run(_frozen(lambda t: 9 if FREEZE[1] <= t < 19 else 6))
    assert c.passed is True and c.value == 0


def test_a_step_past_the_margin_fails() -> None:
    c = _run(_frozen(lambda t: 6 if t < FREEZE[1] else 8))
    assert c.passed is False and c.value == 2.0
    fds = _run(_frozen(lambda t: 6, fds=lambda t: 11 if t < FREEZE[1] else 13))
    assert fds.passed is False and fds.value == 2.0


def test_a_worker_left_idle_beside_its_replacement_fails_within_the_margin() -> None:
    """stall-respawn's shape (--workers 1): the stall starts a new pool; the old worker,
    busy before the freeze, does nothing after it and is never shut down, its
    replacement takes the work — 6 → 7 threads, the limit drops to 0."""
    old = _thread(100, "model-worker_0", lambda x: 70.0 if x < FREEZE[0] else 0.0)
    new = _thread(105, "model-worker_0", lambda x: 0.0 if x < FREEZE[1] else 70.0)
    loop = _thread(99, "python3", lambda x: 0.0 if FREEZE[0] <= x < FREEZE[1] else 12.0)
    c = _run(_frozen(lambda t: 6 if t < FREEZE[1] else 7, top=[old, new, loop]))
    assert c.passed is False and c.value == 1.0 and c.threshold == 0.0
    assert "model-worker_0 (100) worked before the freeze and did nothing after" in c.detail
    # the same idle thread with nothing left behind is no leak (it may be a spare)
    assert _run(_frozen(lambda t: 6, top=[old, new, loop])).passed is True
    # an old worker that died with its pool is not left behind
    gone = _thread(100, "model-worker_0", lambda x: 70.0)
    gone["series"] = {k: v[:10] for k, v in old["series"].items()}
    assert _run(_frozen(lambda t: 6 if t < FREEZE[1] else 7, top=[gone, new, loop])).passed
