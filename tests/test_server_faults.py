"""Every ``--fault`` visibly changes the real server's behaviour (real sockets)."""

from __future__ import annotations

import http.client
import json
import statistics

import numpy as np
import psutil
import pytest

from reference_server.models import SimModel
from tests.server_fixtures import (
    SIM_ROW,
    ServerHandle,
    backlog_order,
    infer_body,
    metric_sum,
    run_clients,
    scrape,
    send,
    start_server,
)

pytestmark = pytest.mark.slow

SIM_FAST = ("--model", "sim", "--sim-base-ms", "0", "--sim-item-ms", "0")


def listed_faults(srv: ServerHandle) -> list[str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/v2")
        return json.loads(conn.getresponse().read())["faults"]
    finally:
        conn.close()


def sequential(srv: ServerHandle, n: int) -> None:
    for a in run_clients(srv, 1, n, infer_body([SIM_ROW])):
        assert a.status == 200


def test_leak_memory_grows_rss_by_the_configured_bytes() -> None:
    with start_server(*SIM_FAST, "--fault", "leak-memory:1000000") as srv:
        assert listed_faults(srv) == ["leak-memory:1000000"]
        before = metric_sum(scrape(srv.url), "process_resident_memory_bytes")
        sequential(srv, 60)
        after = metric_sum(scrape(srv.url), "process_resident_memory_bytes")
        assert after - before > 0.6 * 60 * 1_000_000


def test_leak_threads_and_fds_grow_with_traffic() -> None:
    args = (*SIM_FAST, "--fault", "leak-threads:2", "--fault", "leak-fds:2")
    with start_server(*args) as srv:
        assert listed_faults(srv) == ["leak-threads:2", "leak-fds:2"]
        proc = psutil.Process(srv.pid)
        threads0, fds0 = proc.num_threads(), proc.num_fds()
        sequential(srv, 50)
        # 25 of each leaked; the margin absorbs the warmup thread ending, the lazily
        # started model worker and connection sockets still closing.
        assert proc.num_threads() - threads0 >= 20
        assert proc.num_fds() - fds0 >= 20


def average_batch(srv: ServerHandle) -> float:
    m = scrape(srv.url)
    return metric_sum(m, "refserver_inference_count_total") / metric_sum(
        m, "refserver_execution_count_total"
    )


def test_no_batching_runs_one_request_per_batch() -> None:
    with start_server("--model", "sim", "--fault", "no-batching") as srv:
        assert listed_faults(srv) == ["no-batching"]
        answers = run_clients(srv, 8, 4, infer_body([SIM_ROW]))
        assert all(a.status == 200 for a in answers)
        assert average_batch(srv) == 1.0  # the same load batches > 2 without the fault


def test_unbounded_queue_never_sheds() -> None:
    args = ("--model", "sim", "--sim-base-ms", "50", "--max-batch-size", "1")
    with start_server(
        *args, "--queue-size", "2", "--priority-levels", "1", "--fault", "unbounded-queue"
    ) as srv:
        answers = run_clients(srv, 8, 3, infer_body([SIM_ROW]))
        # Without the fault this load gets 503s (test_full_queue_answers_503_fast_while_serving).
        assert [a.status for a in answers] == [200] * 24
        assert metric_sum(scrape(srv.url), "refserver_requests_total", reason="queue_full") == 0


def test_ignore_priority_serves_fifo() -> None:
    args = ("--model", "sim", "--sim-base-ms", "100", "--max-batch-size", "1")
    with start_server(*args, "--queue-size", "16", "--fault", "ignore-priority") as srv:
        high, defaults = backlog_order(srv, n_default=4)
        assert high.status == 200
        # Without the fault it finishes first; with it, last.
        assert high.end > max(a.end for a in defaults)


def test_cross_wire_swaps_outputs_between_requests() -> None:
    sim = SimModel("sim", (16, 4), 0.0, 0.0, seed=0)

    def body(client: int, i: int) -> bytes:
        return infer_body([[float(client * 10 + i)] * 16])

    def mismatches(srv: ServerHandle) -> int:
        answers = run_clients(srv, 8, 6, body)
        bad = 0
        for a in answers:
            assert a.status == 200
            x = np.asarray(json.loads(a.sent)["inputs"][0]["data"], np.float32).reshape(1, 16)
            got = np.asarray(a.doc["outputs"][0]["data"], np.float32)
            bad += not np.allclose(got, sim.predict(x)[0], rtol=1e-4, atol=1e-4)
        return bad

    args = ("--model", "sim", "--sim-base-ms", "20", "--max-delay-ms", "10")
    with start_server(*args, "--fault", "cross-wire:1") as srv:
        assert listed_faults(srv) == ["cross-wire:1"]
        assert mismatches(srv) >= 2
    with start_server(*args) as srv:
        assert mismatches(srv) == 0


def test_slow_start_is_ready_at_once_and_pays_on_the_first_request() -> None:
    with start_server(*SIM_FAST, "--fault", "slow-start:2") as srv:
        assert listed_faults(srv) == ["slow-start:2"]
        first = send(srv, infer_body([SIM_ROW]))
        second = send(srv, infer_body([SIM_ROW]))
        assert first.status == second.status == 200
        assert first.seconds > 10 * second.seconds


def test_stall_holds_the_gil_periodically() -> None:
    with start_server(*SIM_FAST, "--fault", "stall:1,0.5") as srv:
        assert listed_faults(srv) == ["stall:1,0.5"]
        # ~2.5 periods of back-to-back tiny requests: at least two land in a stall.
        answers = []
        while not answers or answers[-1].end - answers[0].start < 2.5:
            answers.extend(run_clients(srv, 1, 20, infer_body([SIM_ROW])))
        latencies = sorted(a.seconds for a in answers)
        worst, median = latencies[-1], statistics.median(latencies)
        # A slower box only makes requests slower, so a lower bound of half the hold
        # cannot fail spuriously; the ratio keeps it from passing on a box that is slow
        # for every request.
        assert worst > 0.25 and worst > 10 * median, (worst, median)
