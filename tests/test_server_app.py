"""In-process tests of the reference server's routes and every error path (TestClient)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest
from starlette.testclient import TestClient

from harness.testing.server import infer_body, metric_sum, parse_metrics
from harness.testing.server_app import SIM, client
from harness_reference_server.app import ServerState, server_state
from harness_reference_server.config import ServerConfig
from harness_reference_server.fault_catalog import parse_faults
from harness_reference_server.models import SimModel

ROW = [float(i) for i in range(16)]
INFER = "/v2/models/sim/infer"


def state_of(c: TestClient) -> ServerState:
    return server_state(c.app)


def expected_sim(rows: list[list[float]]) -> np.ndarray:
    m = SimModel("sim", (16, 4), 0.0, 0.0, seed=0)
    return m.predict(np.asarray(rows, dtype=np.float32))


def accounting(c: TestClient) -> tuple[float, float]:
    m = parse_metrics(c.get("/metrics").text)
    return (
        metric_sum(m, "refserver_requests_received_total"),
        metric_sum(m, "refserver_requests_total"),
    )


# -- health and metadata ------------------------------------------------------------


def test_health_and_metadata() -> None:
    with client() as c:
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/v2/models/sim/ready").status_code == 200
        assert c.get("/v2/models/sim/versions/1/ready").status_code == 200
        meta = c.get("/v2").json()
        assert meta["name"] == "harness_reference_server"
        assert meta["faults"] == []
        assert meta["config"]["max_batch_size"] == 32
        model = c.get("/v2/models/sim").json()
        assert model["name"] == "sim"
        assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
        assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]


def test_model_name_flag_and_mlp_metadata() -> None:
    cfg = ServerConfig(model="mlp", model_name="tiny", mlp_dims=(8, 16, 3), max_batch_size=4)
    with client(cfg) as c:
        meta = c.get("/v2/models/tiny").json()
        assert meta["inputs"][0]["shape"] == [-1, 8]
        assert meta["outputs"][0]["shape"] == [-1, 3]
        assert c.get("/v2/models/mlp").status_code == 404
        r = c.post("/v2/models/tiny/infer", content=infer_body([[0.1] * 8, [0.2] * 8]))
        assert r.status_code == 200
        assert r.json()["outputs"][0]["shape"] == [2, 3]


def test_unknown_model_is_404_everywhere() -> None:
    with client() as c:
        for r in (
            c.get("/v2/models/nope"),
            c.get("/v2/models/nope/ready"),
            c.post("/v2/models/nope/infer", content=infer_body([ROW])),
        ):
            assert r.status_code == 404
            assert "'nope'" in r.json()["error"] and "'sim'" in r.json()["error"]


def test_unknown_route_and_method_are_json_errors() -> None:
    with client() as c:
        r = c.get("/v3")
        assert r.status_code == 404 and "error" in r.json()
        r = c.get(INFER)
        assert r.status_code == 405 and "error" in r.json()


# -- inference ----------------------------------------------------------------------


def test_infer_echoes_id_and_computes_deterministic_outputs() -> None:
    rows = [ROW, [1.0] * 16, [-2.0] * 16]
    with client() as c:
        r = c.post(INFER, content=infer_body(rows, request_id="req-7"))
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["id"] == "req-7"
        assert doc["model_name"] == "sim"
        out = doc["outputs"][0]
        assert out["name"] == "output" and out["datatype"] == "FP32" and out["shape"] == [3, 4]
        got = np.asarray(out["data"], dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(got, expected_sim(rows), rtol=1e-5, atol=1e-5)
        # Distinct inputs give distinct outputs (integrity checks rely on it).
        assert not np.allclose(got[0], got[1])


def test_infer_without_id_and_with_nested_data_and_outputs() -> None:
    doc = {
        "inputs": [{"name": "input", "shape": [2, 16], "datatype": "FP32", "data": [ROW, ROW]}],
        "outputs": [{"name": "output"}],
        "parameters": {"priority": 1, "timeout": 0},
    }
    with client() as c:
        r = c.post(INFER, content=json.dumps(doc))
        assert r.status_code == 200, r.text
        assert "id" not in r.json()
        assert r.json()["outputs"][0]["shape"] == [2, 4]


def test_answers_carry_the_outputs_bit_for_bit_and_echo_any_id() -> None:
    """The answer's numbers are the model's float32 outputs exactly (small magnitudes
    included, whose exponents the encoders write differently), and an id with a lone
    surrogate, which a request can carry as an escape, comes back as that id."""
    rows = [[v * 1e-7 for v in ROW], [v * 1e7 for v in ROW]]
    with client() as c:
        r = c.post(INFER, content=infer_body(rows, request_id="req-\u00e9"))
        assert r.status_code == 200, r.text
        got = r.json()["outputs"][0]["data"]
        assert got == expected_sim(rows).reshape(-1).tolist()
        assert r.json()["id"] == "req-\u00e9"
        body = infer_body(rows).replace(b'"inputs"', b'"id":"x\\ud800","inputs"', 1)
        r = c.post(INFER, content=body)
        assert r.status_code == 200, r.text
        assert json.loads(r.content)["id"] == "x\ud800"


def test_versioned_infer_route() -> None:
    with client() as c:
        assert (
            c.post("/v2/models/sim/versions/1/infer", content=infer_body([ROW])).status_code == 200
        )


def _tensor(**override: object) -> dict[str, object]:
    t: dict[str, object] = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": ROW}
    t.update(override)
    return t


BAD_REQUESTS = [
    ("not json", b"{nope", "not valid JSON"),
    ("not an object", b"[1, 2]", "Expected a JSON object"),
    ("id not string", {"id": 5, "inputs": [_tensor()]}, "id has value 5"),
    ("no inputs", {"id": "1"}, "inputs has null"),
    ("two inputs", {"inputs": [_tensor(), _tensor()]}, "inputs has 2 tensors"),
    ("input not object", {"inputs": [3]}, "inputs[0] has value 3"),
    (
        "wrong name",
        {"inputs": [_tensor(name="x")]},
        "inputs[0].name has value 'x'. Expected 'input'",
    ),
    (
        "wrong datatype",
        {"inputs": [_tensor(datatype="FP64")]},
        "datatype has value 'FP64'. Expected 'FP32'",
    ),
    (
        "wrong width",
        {"inputs": [_tensor(shape=[1, 15])]},
        "shape has value [1, 15]. Expected [k, 16]",
    ),
    ("zero rows", {"inputs": [_tensor(shape=[0, 16], data=[])]}, "shape has value [0, 16]"),
    ("too many rows", {"inputs": [_tensor(shape=[33, 16], data=ROW * 33)]}, "1 <= k <= 32"),
    ("1-d shape", {"inputs": [_tensor(shape=[16])]}, "shape has value [16]"),
    ("float shape", {"inputs": [_tensor(shape=[1.0, 16])]}, "shape has value [1.0, 16]"),
    (
        "no data",
        {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32"}]},
        "data is missing",
    ),
    ("data not list", {"inputs": [_tensor(data="abc")]}, "data has value 'abc'"),
    ("count", {"inputs": [_tensor(data=ROW[:10])]}, "has 10 elements. Expected 16"),
    ("non-numeric", {"inputs": [_tensor(data=["a"] * 16)]}, "could not be read as FP32"),
    (
        "ragged",
        {"inputs": [_tensor(shape=[2, 16], data=[ROW, ROW[:3]])]},
        "could not be read as FP32",
    ),
    ("nested wrong", {"inputs": [_tensor(shape=[2, 16], data=[ROW + ROW])]}, "nested as [1, 32]"),
    (
        "priority string",
        {"inputs": [_tensor()], "parameters": {"priority": "high"}},
        "parameters.priority has value 'high'",
    ),
    (
        "priority negative",
        {"inputs": [_tensor()], "parameters": {"priority": -1}},
        "parameters.priority has value -1",
    ),
    (
        "timeout float",
        {"inputs": [_tensor()], "parameters": {"timeout": 1.5}},
        "parameters.timeout has value 1.5",
    ),
    ("parameters list", {"inputs": [_tensor()], "parameters": []}, "parameters has value []"),
    (
        "unknown output",
        {"inputs": [_tensor()], "outputs": [{"name": "y"}]},
        "outputs[0].name has value 'y'",
    ),
    ("outputs not list", {"inputs": [_tensor()], "outputs": "y"}, "outputs has value 'y'"),
]


@pytest.mark.parametrize(("case", "body", "needle"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_malformed_requests_are_400_naming_the_problem(
    case: str, body: object, needle: str
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with client() as c:
        r = c.post(INFER, content=raw)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"]
        received, answered = accounting(c)
        assert received == answered == 1


def test_body_over_limit_is_413() -> None:
    cfg = dataclasses.replace(SIM, max_body_bytes=200)
    with client(cfg) as c:
        r = c.post(INFER, content=infer_body([ROW] * 4))
        assert r.status_code == 413
        assert "--max-body-bytes" in r.json()["error"] and "200" in r.json()["error"]
        # Without Content-Length (chunked) the limit still holds.
        r = c.post(INFER, content=iter([infer_body([ROW] * 4)]))
        assert r.status_code == 413
        assert c.post(INFER, content=b"{}").status_code == 400  # small bodies still parsed


def test_model_exception_is_500_and_counted_as_failed() -> None:
    with client() as c:

        def boom(x: np.ndarray) -> np.ndarray:
            raise RuntimeError("kaput")

        state_of(c).model._predict = boom  # type: ignore[method-assign]
        r = c.post(INFER, content=infer_body([ROW]))
        assert r.status_code == 500
        assert "kaput" in r.json()["error"]
        m = parse_metrics(c.get("/metrics").text)
        assert (
            metric_sum(m, "refserver_requests_total", outcome="failed", reason="model_error") == 1
        )


def test_nan_output_is_500() -> None:
    with client() as c:
        state_of(c).model._predict = lambda x: np.full((x.shape[0], 4), np.nan, np.float32)  # type: ignore[method-assign]
        r = c.post(INFER, content=infer_body([ROW]))
        assert r.status_code == 500 and "NaN" in r.json()["error"]


def test_not_ready_until_warmup_is_503() -> None:
    cfg = dataclasses.replace(SIM, warmup_delay_s=60.0)
    with client(cfg, wait_ready=False) as c:
        assert c.get("/v2/health/live").status_code == 200
        assert c.get("/v2/health/ready").status_code == 503
        assert c.get("/v2/models/sim/ready").status_code == 503
        r = c.post(INFER, content=infer_body([ROW]))
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        m = parse_metrics(c.get("/metrics").text)
        assert metric_sum(m, "refserver_ready") == 0
        assert metric_sum(m, "refserver_requests_total", reason="not_ready") == 1


def test_draining_answers_503_server_exiting() -> None:
    with client() as c:
        assert c.portal is not None
        assert c.portal.call(state_of(c).drain, 1.0) is True
        assert c.get("/v2/health/ready").status_code == 503
        r = c.post(INFER, content=infer_body([ROW]))
        assert r.status_code == 503 and "server exiting" in r.json()["error"]
        m = parse_metrics(c.get("/metrics").text)
        assert metric_sum(m, "refserver_draining") == 1
        assert metric_sum(m, "refserver_requests_total", reason="draining") == 1


def _concurrent(c: TestClient, bodies: list[bytes]) -> list[tuple[int, dict, dict]]:
    results: list[tuple[int, dict, dict]] = [None] * len(bodies)  # type: ignore[list-item]
    barrier = threading.Barrier(len(bodies))

    def go(i: int) -> None:
        barrier.wait()
        r = c.post(INFER, content=bodies[i])
        results[i] = (r.status_code, r.json(), dict(r.headers))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_queue_full_is_503_with_retry_after() -> None:
    cfg = dataclasses.replace(
        SIM, sim_base_ms=300.0, max_batch_size=1, queue_size=1, priority_levels=1
    )
    with client(cfg) as c:
        results = _concurrent(c, [infer_body([ROW])] * 6)
        full = [r for r in results if r[0] == 503]
        assert full, results
        for _, doc, headers in full:
            assert "queue is full" in doc["error"]
            assert headers["retry-after"] == "1"
        assert any(r[0] == 200 for r in results)
        received, answered = accounting(c)
        assert received == answered == 6


def wait_until(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    """Poll a state condition (an event we cannot subscribe to), bounded in time."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def test_expired_deadline_is_503_and_never_computed() -> None:
    cfg = dataclasses.replace(SIM, sim_base_ms=400.0, max_batch_size=1)
    with client(cfg) as c:
        batcher = state_of(c).batcher
        blocker = threading.Thread(target=lambda: c.post(INFER, content=infer_body([ROW])))
        blocker.start()
        # The blocker is computing (taken off the queue, worker busy).
        wait_until(lambda: not batcher.idle and batcher.queue.live == 0)
        r = c.post(INFER, content=infer_body([ROW], timeout_us=20_000))
        still_busy = not batcher.idle
        blocker.join(30)
        assert r.status_code == 503
        assert "expired before execution" in r.json()["error"]
        assert still_busy, "the expired request was answered only after the worker freed"
        m = parse_metrics(c.get("/metrics").text)
        assert metric_sum(m, "refserver_deadline_expired_total") == 1
        assert metric_sum(m, "refserver_inference_count_total") == 1  # the blocker only
        assert metric_sum(m, "refserver_requests_total", reason="deadline_expired") == 1


def test_metrics_accounting_balances_and_batches_counted() -> None:
    with client() as c:
        for _ in range(3):
            assert c.post(INFER, content=infer_body([ROW, ROW])).status_code == 200
        c.post(INFER, content=b"{}")
        c.post("/v2/models/zzz/infer", content=b"{}")
        text = c.get("/metrics").text
        m = parse_metrics(text)
        assert metric_sum(m, "refserver_requests_received_total") == 5
        assert metric_sum(m, "refserver_requests_total", outcome="success") == 3
        assert metric_sum(m, "refserver_requests_total", outcome="rejected") == 2
        assert metric_sum(m, "refserver_inference_count_total") == 6
        assert metric_sum(m, "refserver_execution_count_total") == 3
        assert metric_sum(m, "refserver_batch_size_count") == 3
        assert metric_sum(m, "refserver_batch_size_sum") == 6
        assert metric_sum(m, "refserver_queue_duration_seconds_count") == 3
        assert metric_sum(m, "refserver_compute_duration_seconds_count") == 3
        assert metric_sum(m, "refserver_request_duration_seconds_count") == 5
        assert metric_sum(m, "refserver_ready") == 1
        assert 'refserver_queue_depth{priority="2"}' in m
        assert "process_resident_memory_bytes" in text
        assert "process_open_fds" in text


def test_faults_are_listed_in_v2_and_metrics() -> None:
    cfg = dataclasses.replace(
        SIM, faults=parse_faults(["no-batching", "cross-wire:0.02", "leak-memory"])
    )
    with client(cfg) as c:
        assert c.get("/v2").json()["faults"] == [
            "leak-memory:4096",
            "no-batching",
            "cross-wire:0.02",
        ]
        m = parse_metrics(c.get("/metrics").text)
        assert metric_sum(m, "refserver_fault_active", fault="cross-wire") == 1


def test_slow_start_fault_is_ready_at_once_without_warmup() -> None:
    cfg = dataclasses.replace(SIM, faults=parse_faults(["slow-start:0"]))
    with client(cfg, wait_ready=False) as c:
        assert c.get("/v2/health/ready").status_code == 200
        assert not state_of(c).model.loaded
        assert c.post(INFER, content=infer_body([ROW])).status_code == 200
        assert state_of(c).model.loaded


def test_malformed_infer_paths_are_json_404() -> None:
    with client() as c:
        r = c.post("/v2/models/a/b/infer", content=infer_body([ROW]))
        assert r.status_code == 404 and "error" in r.json()
        r = c.get("/v2/models/sim/versions/1/infer")
        assert r.status_code == 405
