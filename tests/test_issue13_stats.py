"""Issue 13: Triton's statistics extension (``GET /v2/models/{m}/stats``).

The reference server serves it from its batcher's counters; the harness reads it at the
edges of every stage and stores a queue-time vs compute-time split per stage
(``server_stats`` of a scenario result), which the reports show.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from reference_server.app import create_app, server_state
from reference_server.config import ServerConfig
from reference_server.faults import parse_faults
from tests.server_fixtures import infer_body

SIM = ServerConfig(model="sim", sim_base_ms=0.0, sim_item_ms=0.0, max_delay_ms=1.0)
ROW = [float(i) for i in range(16)]
INFER = "/v2/models/sim/infer"
STATS = "/v2/models/sim/stats"


@contextlib.contextmanager
def client(config: ServerConfig = SIM) -> Iterator[TestClient]:
    app = create_app(config)
    with TestClient(app) as c:
        assert server_state(app).warmed_up.wait(30), "warmup did not finish"
        yield c


def stats(c: TestClient) -> dict[str, Any]:
    r = c.get(STATS)
    assert r.status_code == 200, r.text
    (entry,) = r.json()["model_stats"]
    return entry


def concurrent(c: TestClient, bodies: list[bytes]) -> list[int]:
    codes = [0] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def go(i: int) -> None:
        barrier.wait()
        codes[i] = c.post(INFER, content=bodies[i]).status_code

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return codes


def consistent(entry: dict[str, Any]) -> None:
    """batch_stats count executions and add up to the model's own counters."""
    batches = entry["batch_stats"]
    assert sum(b["compute_infer"]["count"] for b in batches) == entry["execution_count"]
    assert (
        sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches)
        == (entry["inference_count"])
    )


# -- the server -----------------------------------------------------------------------


def test_issue13_stats_endpoint_triton_shape_and_extension_listed() -> None:
    with client() as c:
        assert "statistics" in c.get("/v2").json()["extensions"]
        first = stats(c)
        assert first["name"] == "sim" and first["version"] == "1"
        assert first["inference_count"] == first["execution_count"] == 0  # warmup not counted
        assert set(first["inference_stats"]) == {
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
        }
        for _ in range(3):  # one at a time: each its own batch
            assert c.post(INFER, content=infer_body([ROW, ROW])).status_code == 200
        e = stats(c)
        inf = e["inference_stats"]
        assert inf["success"]["count"] == inf["queue"]["count"] == 3
        assert inf["compute_infer"]["count"] == 3 and inf["fail"]["count"] == 0
        assert e["inference_count"] == 6 and e["execution_count"] == 3  # rows vs executions
        assert e["batch_stats"][0]["batch_size"] == 2
        assert inf["success"]["ns"] >= inf["queue"]["ns"] + inf["compute_infer"]["ns"]
        assert e["last_inference"] > 0
        consistent(e)
        # Triton's other paths: a version, every model; unknown ones are 404s
        assert c.get("/v2/models/sim/versions/1/stats").json()["model_stats"][0]["name"] == "sim"
        assert c.get("/v2/models/stats").json()["model_stats"][0]["name"] == "sim"
        assert c.get("/v2/models/zzz/stats").status_code == 404
        assert c.get("/v2/models/sim/versions/7/stats").status_code == 404


def test_issue13_stats_batched_requests_share_compute_and_wait_in_queue() -> None:
    """A request computing on a 60 ms model, 7 more arriving meanwhile: they wait in the
    queue for it, then run as one batch — 2 executions for 8 requests, every request
    charged its batch's whole model time (Triton's convention), the 7 a queue time."""
    cfg = dataclasses.replace(SIM, sim_base_ms=60.0, max_delay_ms=5.0)
    with client(cfg) as c:
        batcher = server_state(c.app).batcher
        blocker = threading.Thread(target=lambda: c.post(INFER, content=infer_body([ROW])))
        blocker.start()
        wait_until(lambda: not batcher.idle and batcher.queue.live == 0)  # it computes
        assert concurrent(c, [infer_body([ROW])] * 7) == [200] * 7
        blocker.join(30)
        e = stats(c)
        inf = e["inference_stats"]
        assert inf["success"]["count"] == 8 and e["inference_count"] == 8
        assert e["execution_count"] == 2, e
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in e["batch_stats"]} == {
            1: 1,
            7: 1,
        }
        infer_mean_s = inf["compute_infer"]["ns"] / inf["compute_infer"]["count"] / 1e9
        assert infer_mean_s >= 0.9 * 0.060  # every request charged the whole batch's time
        assert inf["queue"]["ns"] > 0
        parts = sum(inf[k]["ns"] for k in ("queue", "compute_input", "compute_infer"))
        assert inf["success"]["ns"] >= parts  # enqueue → answer covers queue + compute
        consistent(e)


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def test_issue13_stats_no_batching_fault_runs_one_request_per_execution() -> None:
    cfg = dataclasses.replace(SIM, sim_base_ms=20.0, faults=parse_faults(["no-batching"]))
    with client(cfg) as c:
        assert concurrent(c, [infer_body([ROW])] * 6) == [200] * 6
        e = stats(c)
        assert e["execution_count"] == e["inference_stats"]["success"]["count"] == 6
        assert [b["batch_size"] for b in e["batch_stats"]] == [1]


def test_issue13_stats_failures_counted_apart_from_successes() -> None:
    """A model error (fault error-rate:1) and a deadline that expired in the queue are
    ``fail``; neither adds to the success, queue or compute counts."""
    cfg = dataclasses.replace(SIM, faults=parse_faults(["error-rate:1"]))
    with client(cfg) as c:
        for _ in range(3):
            assert c.post(INFER, content=infer_body([ROW])).status_code == 500
        e = stats(c)
        inf = e["inference_stats"]
        assert inf["fail"]["count"] == 3
        assert inf["success"]["count"] == inf["queue"]["count"] == 0
        assert inf["compute_infer"]["count"] == 0
    cfg = dataclasses.replace(SIM, sim_base_ms=300.0, max_batch_size=1)
    with client(cfg) as c:
        codes = concurrent(c, [infer_body([ROW])] + [infer_body([ROW], timeout_us=20_000)] * 2)
        inf = stats(c)["inference_stats"]
        assert inf["success"]["count"] == codes.count(200)
        assert inf["fail"]["count"] == codes.count(503) >= 1
