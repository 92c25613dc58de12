"""Real-socket tests: the reference server as a subprocess on a free loopback port."""

from __future__ import annotations

import http.client
import json
import os
import signal

import pytest

from harness.testing.server import (
    Answer,
    backlog_order,
    balanced,
    batches_started,
    http_status,
    in_background,
    infer_body,
    metric_sum,
    run_clients,
    scrape,
    send,
    start_server,
    wait_ready,
    wait_until,
)

pytestmark = pytest.mark.slow

ROW = [float(i) for i in range(16)]


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
