"""Real-socket tests: the reference server as a subprocess on a free loopback port."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.server_fixtures import (
    ServerHandle,
    http_status,
    infer_body,
    metric_sum,
    post_infer,
    scrape,
    start_server,
    wait_ready,
)

pytestmark = pytest.mark.slow

ROW = [float(i) for i in range(16)]


@dataclass
class Answer:
    status: int
    doc: dict
    headers: dict
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def connection(srv: ServerHandle) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)


def send(srv: ServerHandle, body: bytes, model: str = "sim") -> Answer:
    t0 = time.monotonic()
    status, doc, headers = post_infer(srv.url, model, body, timeout=60)
    return Answer(status, doc, headers, t0, time.monotonic())


def run_clients(srv: ServerHandle, n_clients: int, per_client: int, body: bytes) -> list[Answer]:
    """Closed loop: n_clients threads, each with one keep-alive connection."""
    answers: list[Answer] = []
    lock = threading.Lock()

    def client() -> None:
        conn = connection(srv)
        try:
            for _ in range(per_client):
                t0 = time.monotonic()
                status, doc, headers = post_infer(srv.url, "sim", body, conn=conn)
                with lock:
                    answers.append(Answer(status, doc, headers, t0, time.monotonic()))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return answers


def in_background(srv: ServerHandle, body: bytes, out: list[Answer]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(send(srv, body)))
    t.start()
    return t


def batches_started(srv: ServerHandle) -> float:
    # The batch-size histogram is observed when a batch starts; execution_count when it ends.
    return metric_sum(scrape(srv.url), "refserver_batch_size_count")


def balanced(srv: ServerHandle) -> tuple[float, float]:
    m = scrape(srv.url)
    return metric_sum(m, "refserver_requests_received_total"), metric_sum(
        m, "refserver_requests_total"
    )


def test_batches_form_under_concurrency() -> None:
    with start_server("--model", "sim", "--max-delay-ms", "5") as srv:
        answers = run_clients(srv, n_clients=16, per_client=8, body=infer_body([ROW]))
        assert [a.status for a in answers] == [200] * 128
        m = scrape(srv.url)
        rows = metric_sum(m, "refserver_inference_count_total")
        execs = metric_sum(m, "refserver_execution_count_total")
        assert rows == 128
        assert rows / execs > 2, f"average batch {rows / execs:.2f}"
        assert balanced(srv) == (128, 128)


def test_full_queue_answers_503_fast_while_serving() -> None:
    args = ("--model", "sim", "--sim-base-ms", "200", "--max-batch-size", "1")
    with start_server(*args, "--queue-size", "2", "--priority-levels", "1") as srv:
        answers = run_clients(srv, n_clients=8, per_client=3, body=infer_body([ROW]))
        ok = [a for a in answers if a.status == 200]
        full = [a for a in answers if a.status == 503]
        assert ok and full and len(ok) + len(full) == len(answers)
        assert all(a.headers.get("retry-after") == "1" for a in full)
        assert all("queue is full" in a.doc["error"] for a in full)
        # Rejections are answered at enqueue, not after waiting: far faster than a compute.
        slowest_reject = max(a.seconds for a in full)
        fastest_ok = min(a.seconds for a in ok)
        assert slowest_reject < fastest_ok / 2, (slowest_reject, fastest_ok)
        # ...and the server kept serving.
        assert send(srv, infer_body([ROW])).status == 200
        m = scrape(srv.url)
        assert metric_sum(m, "refserver_requests_total", reason="queue_full") == len(full)
        received, answered = balanced(srv)
        assert received == answered == len(answers) + 1


def backlog_order(srv: ServerHandle, n_default: int) -> tuple[Answer, list[Answer]]:
    """Occupy the single worker, queue n_default default requests, then one priority 1."""
    blocker: list[Answer] = []
    threads = [in_background(srv, infer_body([ROW]), blocker)]
    wait_until(lambda: batches_started(srv) == 1)
    defaults: list[Answer] = []
    for _ in range(n_default):
        threads.append(in_background(srv, infer_body([ROW]), defaults))
    wait_until(lambda: metric_sum(scrape(srv.url), "refserver_requests_in_flight") == 1 + n_default)
    high = send(srv, infer_body([[9.0] * 16], priority=1))
    for t in threads:
        t.join(60)
    return high, defaults


def test_priority_one_overtakes_default_backlog() -> None:
    args = ("--model", "sim", "--sim-base-ms", "100", "--max-batch-size", "1")
    with start_server(*args) as srv:
        high, defaults = backlog_order(srv, n_default=4)
        assert high.status == 200 and all(a.status == 200 for a in defaults)
        # Queued after all four defaults, it finishes before every one of them.
        assert high.end < min(a.end for a in defaults)


def test_expired_request_is_not_computed() -> None:
    args = ("--model", "sim", "--sim-base-ms", "400", "--max-batch-size", "1")
    with start_server(*args) as srv:
        blocker: list[Answer] = []
        t = in_background(srv, infer_body([ROW]), blocker)
        wait_until(lambda: batches_started(srv) == 1)
        expired = send(srv, infer_body([ROW], timeout_us=30_000))
        t.join(60)
        assert expired.status == 503
        assert "expired before execution" in expired.doc["error"]
        assert expired.end < blocker[0].end  # answered by the timer, not when a worker freed
        m = scrape(srv.url)
        assert metric_sum(m, "refserver_deadline_expired_total") == 1
        assert metric_sum(m, "refserver_inference_count_total") == 1
        assert metric_sum(m, "refserver_execution_count_total") == 1


def test_sigterm_drains_every_accepted_request_and_exits_0() -> None:
    args = ("--model", "sim", "--sim-base-ms", "300", "--max-batch-size", "2")
    with start_server(*args) as srv:
        answers: list[Answer] = []
        threads = [
            in_background(srv, infer_body([ROW], request_id=str(i)), answers) for i in range(6)
        ]
        wait_until(lambda: metric_sum(scrape(srv.url), "refserver_requests_in_flight") == 6)
        os.kill(srv.pid, signal.SIGTERM)
        # While draining: not ready, new work refused with "server exiting", process alive.
        wait_until(lambda: http_status(srv.url, "/v2/health/ready") == 503)
        late = send(srv, infer_body([ROW]))
        assert srv.proc.poll() is None
        assert late.status == 503 and "server exiting" in late.doc["error"]
        for t in threads:
            t.join(60)
        assert srv.proc.wait(30) == 0
        assert sorted(a.doc.get("id") for a in answers) == [str(i) for i in range(6)]
        assert [a.status for a in answers] == [200] * 6


def test_readiness_waits_for_warmup() -> None:
    with start_server("--model", "sim", "--warmup-delay-s", "3", wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/v2/health/live") == 200)
        assert http_status(srv.url, "/v2/health/ready") == 503
        assert http_status(srv.url, "/v2/models/sim/ready") == 503
        assert send(srv, infer_body([ROW])).status == 503
        wait_ready(srv, 30)
        assert http_status(srv.url, "/v2/models/sim/ready") == 200
        assert send(srv, infer_body([ROW])).status == 200


def test_mlp_default_model_serves_the_readme_request() -> None:
    with start_server() as srv:
        meta = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        meta.request("GET", "/v2/models/mlp")
        doc = json.loads(meta.getresponse().read())
        meta.close()
        assert doc["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}]
        a = send(srv, infer_body([[0.5] * 256], request_id="1"), model="mlp")
        assert a.status == 200 and a.doc["id"] == "1"
        assert a.doc["outputs"][0]["shape"] == [1, 10]
