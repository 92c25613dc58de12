"""Workers outside the sampler's process tree are judged from their heartbeats
(harness.load.workers_cpu): a saturated remote worker makes the run invalid."""

from __future__ import annotations

from types import SimpleNamespace

from harness.checks.engine import validity
from harness.load.workers_cpu import WorkerCpu


def _runner(**cpu: float) -> SimpleNamespace:
    return SimpleNamespace(
        clients={w: SimpleNamespace(cpu_usage=c, memory_usage=50 << 20) for w, c in cpu.items()}
    )


def _system(n: int, started: float = 1000.0) -> dict:
    t = [float(i) for i in range(1, n + 1)]
    return {
        "started_unix": started,
        "series": {"t": t, "cpu_pct": [50.0] * n, "loadgen_cpu_pct": [20.0] * n},
        "loadgen_processes": [
            {"pid": 7, "name": "locust", "cpu_pct": [20.0] * n, "rss_bytes": [1] * n}
        ],
    }


def test_worker_heartbeats_join_the_ticks_by_wall_clock() -> None:
    now = [1000.2]
    runner = _runner(remote_a=30.0, remote_b=97.0)
    w = WorkerCpu(runner, clock=lambda: now[0])
    for k in range(1, 6):
        now[0] = 1000.2 + k
        runner.clients["remote_a"].cpu_usage = 30.0 + k
        w.poll()
    system = _system(9)  # ticks at 1001 … 1009; heartbeats read at 1001.2 … 1005.2
    samples = {"system": system}
    w.add_to(samples)
    procs = samples["system"]["loadgen_processes"]
    assert [p["pid"] for p in procs] == [7, None, None]
    a = next(p for p in procs if p.get("worker") == "remote_a")
    assert a["cpu_pct"][:5] == [31.0, 32.0, 33.0, 34.0, 35.0]
    # 1006 is 0.8 s from the last heartbeat: still it; 1007 and later: none near, empty
    assert a["cpu_pct"][5] == 35.0 and a["cpu_pct"][6:] == [None, None, None]
    assert a["rss_bytes"][0] == 50 << 20 and "heartbeat" in a["name"]


def test_a_saturated_remote_worker_makes_the_run_invalid() -> None:
    now = [1000.0]
    runner = _runner(remote=98.0)
    w = WorkerCpu(runner, clock=lambda: now[0])
    for k in range(1, 12):
        now[0] = 1000.0 + k
        w.poll()
    system = _system(10)
    sc = {"system": system}
    assert not any("generator" in r for r in validity(sc))  # the local process idles
    w.add_to(sc)
    reasons = [r for r in validity(sc) if "generator" in r]
    assert reasons and "worker remote" in reasons[0], reasons
    # the same worker at 60 %: nothing to say
    runner.clients["remote"].cpu_usage = 60.0
    w2 = WorkerCpu(runner, clock=lambda: now[0])
    for k in range(1, 12):
        now[0] = 1000.0 + k
        w2.poll()
    sc2 = {"system": _system(10)}
    w2.add_to(sc2)
    assert not any("generator" in r for r in validity(sc2))


def test_no_samples_or_no_workers_adds_nothing() -> None:
    w = WorkerCpu(SimpleNamespace(clients={}))
    w.poll()
    w.add_to(None)
    sc = {"system": _system(3)}
    w.add_to(sc)
    assert len(sc["system"]["loadgen_processes"]) == 1
