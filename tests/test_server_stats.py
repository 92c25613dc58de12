"""Triton's statistics extension (``GET /v2/models/{m}/stats``).

The reference server serves it from its batcher's counters; the harness reads it at the
edges of every stage and stores a queue-time vs compute-time split per stage
(``server_stats`` of a scenario result), which the reports show.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from harness.testing.server import infer_body
from harness_reference_server.app import create_app, server_state
from harness_reference_server.config import ServerConfig
from harness_reference_server.fault_catalog import parse_faults

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


def test_stats_endpoint_triton_shape_and_extension_listed() -> None:
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


def test_stats_batched_requests_share_compute_and_wait_in_queue() -> None:
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


def test_stats_no_batching_fault_runs_one_request_per_execution() -> None:
    cfg = dataclasses.replace(SIM, sim_base_ms=20.0, faults=parse_faults(["no-batching"]))
    with client(cfg) as c:
        assert concurrent(c, [infer_body([ROW])] * 6) == [200] * 6
        e = stats(c)
        assert e["execution_count"] == e["inference_stats"]["success"]["count"] == 6
        assert [b["batch_size"] for b in e["batch_stats"]] == [1]


def test_stats_failures_counted_apart_from_successes() -> None:
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


# -- the harness: reading it at stage edges ---------------------------------------------


def triton_doc(
    model: str = "m",
    *,
    ok: int,
    fail: int = 0,
    queue_ns: int = 0,
    infer_ns: int = 0,
    rows: int | None = None,
    executions: int = 0,
    version: str = "1",
) -> dict[str, Any]:
    """One model's entry as Triton writes it (compute_input/output 1 µs per request)."""

    def d(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    return {
        "name": model,
        "version": version,
        "last_inference": 1,
        "inference_count": ok if rows is None else rows,
        "execution_count": executions,
        "inference_stats": {
            "success": d(ok, queue_ns + infer_ns + 2000 * ok),
            "fail": d(fail, 0),
            "queue": d(ok, queue_ns),
            "compute_input": d(ok, 1000 * ok),
            "compute_infer": d(ok, infer_ns),
            "compute_output": d(ok, 1000 * ok),
        },
        "batch_stats": [],
    }


def test_stats_split_from_counter_differences() -> None:
    """Means per request from the differences between two reads, versions of the model
    summed, other models ignored; a counter that went backwards (restart) gives nothing."""
    from harness.load.server_stats import stage_split
    from harness.protocols.kserve_v2 import counters_of

    start = counters_of({"model_stats": [triton_doc(ok=10, queue_ns=10**6, executions=10)]}, "m")
    end_doc = {
        "model_stats": [
            triton_doc(ok=60, queue_ns=101 * 10**6, infer_ns=200 * 10**6, executions=18),
            triton_doc(ok=50, queue_ns=0, infer_ns=100 * 10**6, executions=2, version="2"),
            triton_doc("other", ok=999, executions=999),
        ]
    }
    end = counters_of(end_doc, "m")
    assert start is not None and end is not None
    split = stage_split(start, end)
    assert split is not None
    assert split["requests"] == split["success"] == 100 and split["fail"] == 0
    assert split["executions"] == 10 and split["avg_batch"] == 10.0
    assert split["queue_ms"] == 1.0  # 100 ms over 100 requests
    assert split["compute_infer_ms"] == 3.0  # 300 ms over 100 requests
    assert split["compute_ms"] == 3.002  # + 1 µs input + 1 µs output each
    assert stage_split(end, start) is None
    assert counters_of({"model_stats": [triton_doc("other", ok=1)]}, "m") is None
    assert counters_of({"error": "nope"}, "m") is None


class FakeServer:
    """Answers reads from a list of counters; a None entry is a failed read."""

    def __init__(self, answers: list[dict[str, Any] | None]) -> None:
        self.answers = answers
        self.calls = 0

    def read(self, url: str, model: str, protocol: Any = None) -> tuple[Any, str | None]:
        from harness.protocols.kserve_v2 import counters_of

        doc = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if doc is None:
            return None, "no answer within 2 s"
        return counters_of({"model_stats": [doc]}, model), None


def stages_ab() -> list[Any]:
    from types import SimpleNamespace

    return [
        SimpleNamespace(name="low", start_s=0.0, end_s=5.0),
        SimpleNamespace(name="high", start_s=5.0, end_s=10.0),
    ]


def test_stats_read_once_per_stage_edge_on_the_scenario_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.load import server_stats

    fake = FakeServer(
        [
            triton_doc(ok=0),
            triton_doc(ok=50, executions=50, queue_ns=50 * 10**5),
            triton_doc(ok=450, executions=100, queue_ns=50 * 10**5 + 400 * 10**6),
        ]
    )
    monkeypatch.setattr(server_stats, "read", fake.read)
    clock = [-1.0]  # side tasks start before t = 0
    reader = server_stats.StageReader("http://x/v2/models/m/stats", "m", stages_ab())
    reader.follow(lambda: clock[0], lambda: True, lambda s: clock.__setitem__(0, clock[0] + s))
    assert fake.calls == 3  # t = 0, 5, 10: one read per edge, none between
    out = reader.result()
    assert out["source"] == "v2-statistics" and "missing" not in out
    low, high = out["stages"]["low"], out["stages"]["high"]
    assert (low["requests"], low["avg_batch"], low["queue_ms"]) == (50, 1.0, 0.1)
    assert (high["requests"], high["avg_batch"], high["queue_ms"]) == (400, 8.0, 1.0)
    assert (low["start_s"], low["end_s"], high["end_s"]) == (0.0, 5.0, 10.0)


def test_stats_failed_read_and_early_stop_named_per_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No retries: a failed read leaves its stages out, with the reason; a run stopped
    mid-stage is closed by one read at the final write (its real end time kept)."""
    from harness.load import server_stats

    fake = FakeServer([triton_doc(ok=0), None, triton_doc(ok=9)])
    monkeypatch.setattr(server_stats, "read", fake.read)
    clock = [0.0]
    reader = server_stats.StageReader("u", "m", stages_ab())
    reader.follow(lambda: clock[0], lambda: True, lambda s: clock.__setitem__(0, clock[0] + s))
    out = reader.result()
    assert out["stages"] == {}
    assert "the read at t=5 s failed: no answer within 2 s" in out["missing"]["low"]
    assert fake.calls == 3

    fake = FakeServer([triton_doc(ok=0), triton_doc(ok=30, executions=3)])
    monkeypatch.setattr(server_stats, "read", fake.read)
    reader = server_stats.StageReader("u", "m", stages_ab())
    reader.take(0.0, 0.01)  # the run was aborted at t = 3 s: no more edges read
    reader.close(3.0)
    reader.close(3.5)  # once
    assert fake.calls == 2
    out = reader.result()
    assert out["stages"]["low"]["requests"] == 30 and out["stages"]["low"]["end_s"] == 3.0
    assert out["missing"] == {"high": "not reached (t=5 s)"}


def test_stats_absent_when_server_does_not_offer_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GET at preparation; no side task, no field, and the document still valid."""
    from types import SimpleNamespace

    from harness.load import server_stats
    from harness.load.result import scenario_result
    from harness.load.scenario import load_scenario
    from harness.load.side_tasks import SideTasks
    from tests.conftest import schema_errors

    calls = []
    monkeypatch.setattr(
        server_stats, "read", lambda url, model, _p: calls.append(url) or (None, "HTTP 404")
    )
    tasks = SideTasks()
    from harness import protocols

    prep = SimpleNamespace(base_url="http://127.0.0.1:9", model="m", protocol=protocols.default())
    sc = SimpleNamespace(stages=stages_ab())
    assert server_stats.start(tasks, prep, sc, lambda: 0.0, lambda: True) is None  # type: ignore[arg-type]
    assert calls == ["http://127.0.0.1:9/v2/models/m/stats"] and tasks.greenlets == []
    state = SimpleNamespace(tasks=tasks, scenario_time=lambda: 1.0)
    assert server_stats.result_of(state, final=True) is None and len(calls) == 1

    scenario = load_scenario("steady_state")
    kw: dict[str, Any] = dict(
        scenario=scenario, file="f", recording=None, started_unix=1.0, duration_s=1.0,
        partial=False, capacity_rps=None, calibration=None, time_to_ready_s=None,
        golden_summary=None, chaos=[], samples=None, sut_cores=1, error=None,
        sut_exit=None, workers=1,
    )  # fmt: skip
    assert "server_stats" not in scenario_result(**kw)
    reader = server_stats.StageReader("u", "m", scenario.stages)
    with_stats = scenario_result(**kw, server_stats=reader.result())
    assert with_stats["server_stats"]["stages"] == {}
    from harness.results import new_document

    doc = new_document(sut={"target": "x"}, loadgen={"workers": 1})
    doc["scenarios"].append(with_stats)
    assert schema_errors(json.loads(json.dumps(doc))) == []


def test_stats_read_through_the_load_client_with_its_headers() -> None:
    """The GET goes through ``harness.load.http`` with the run's ``--header`` values (an
    ingress needs its auth token on this request too)."""
    from gevent.pywsgi import WSGIServer

    from harness.load import http, server_stats

    seen: list[tuple[str, str | None]] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append((environ["PATH_INFO"], environ.get("HTTP_AUTHORIZATION")))
        doc = {"model_stats": [triton_doc("my model", ok=7, executions=2)]}
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(doc).encode()]

    srv = WSGIServer(("127.0.0.1", 0), app, log=None)
    srv.start()
    before = http.current()
    try:
        http.configure(http.Client(headers=(("Authorization", "Bearer t0k"),)))
        base = f"http://127.0.0.1:{srv.server_port}"
        counters, why = server_stats.read(server_stats.stats_url(base, "my model"), "my model")
    finally:
        http.configure(before)
        srv.stop()
    assert why is None and counters is not None and counters["success_count"] == 7
    assert seen == [("/v2/models/my model/stats", "Bearer t0k")]


def test_stats_reports_show_the_split_per_stage() -> None:
    from harness.report.html import render_html
    from harness.report.summary import render_summary
    from harness.results import new_document
    from harness.testing.results import scenario

    stages = [
        {"name": n, "start_s": a, "end_s": b, "kind": "open", "rate_rps": 100.0, "users": None}
        for n, a, b in (("low", 0.0, 5.0), ("high", 5.0, 20.0))
    ]
    sc = scenario("steady_state", 20.0, stages=stages)
    names = ["low", "high"]
    split = {
        "start_s": 0.0, "end_s": 5.0, "requests": 1234, "success": 1234, "fail": 0,
        "executions": 300, "avg_batch": 4.11, "queue_ms": 2.5, "compute_ms": 7.25,
        "compute_infer_ms": 7.0, "request_ms": 9.9,
    }  # fmt: skip
    sc["server_stats"] = {
        "source": "v2-statistics",
        "url": "http://h/v2/models/m/stats",
        "model": "m",
        "stages": {names[0]: split},
        "missing": {names[-1]: "the read at t=20 s failed: HTTP 503"},
    }
    doc = new_document(sut={"target": "x"}, loadgen={"workers": 1})
    doc["scenarios"].append(sc)
    md = render_summary(doc)
    assert "server time split (from the server's statistics)" in md
    assert "| stage | requests | avg batch | queue ms | compute ms |" in md
    assert f"| {names[0]} | 1,234 | 4.11 | 2.5 | 7.25 |" in md
    assert "not split: " in md and "HTTP 503" in md
    html = render_html(doc)
    assert "Server time split (from the server&#x27;s statistics)" in html
    assert ">4.11<" in html and ">7.25<" in html and "http://h/v2/models/m/stats" in html
    del sc["server_stats"]
    assert "server time split" not in render_summary(doc).lower()
    assert "server time split" not in render_html(doc).lower()


# -- a real run against the reference server ---------------------------------------------


def _harness_run(out: Any, *server_args: str, capacity_rps: float | None = None) -> dict[str, Any]:
    """``harness run integrity --quick --duration 8`` against a reference server it starts
    (run this test under ``flock /tmp/harness-cpu.lock``: it is a real load run); with
    ``capacity_rps``, the stages' rates are multiples of it and no capacity is probed."""
    import shlex
    import subprocess
    import sys

    from harness.testing.locust_runs import REPO, scenario_result

    server = " ".join(shlex.quote(p) for p in [sys.executable, "-m", "harness_reference_server"])
    cmd = f"{server} {' '.join(server_args)} --port {{port}}"
    proc = subprocess.run(
        [
            sys.executable, "-m", "harness", "run", "integrity", "--quick", "--duration", "8",
            "--sut-cmd", cmd, "--out", str(out),
            *([f"--locust-arg=--capacity-rps={capacity_rps:g}"] if capacity_rps else []),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert (out / "results.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return scenario_result(out)


def _in_flight_bound(sc: dict[str, Any], name: str) -> float:
    """Requests that can be in flight at the stage's two edges (or sent between an edge and
    its read): the faster adjacent rate × (the slowest answer + the read's lag)."""
    from harness.testing.locust_runs import hist

    max_s = hist(sc["latency_hdr"]).get_max_value() / 1e6
    stages = sc["stages"]
    i = [s["name"] for s in stages].index(name)
    split = sc["server_stats"]["stages"][name]
    bound = 0.0
    for edge, read_t in (
        (stages[i]["start_s"], split["start_s"]),
        (stages[i]["end_s"], split["end_s"]),
    ):
        near = [s["rate_rps"] or 0.0 for s in stages if s["start_s"] <= edge <= s["end_s"]]
        bound += max(near) * (max_s + abs(read_t - edge))
    return bound + 2


@pytest.mark.slow
def test_stats_real_run_splits_queue_and_compute_per_stage(tmp_path: Any) -> None:
    from harness.testing.detection import ACCEPTANCE_SCENARIOS

    # the healthy integrity run of this session's quick acceptance (the default reference
    # server, 30 s), else one of our own
    healthy = ACCEPTANCE_SCENARIOS.get("integrity") or _harness_run(tmp_path / "healthy")
    # the serial server probes at ~110 req/s here: its stages at multiples of 80 stay below
    # what it serves (and answer the 300 the integrity check needs), without the probe
    serial = _harness_run(tmp_path / "no-batching", "--fault", "no-batching", capacity_rps=80)
    for sc in (healthy, serial):
        stats = sc["server_stats"]
        assert stats["source"] == "v2-statistics" and "missing" not in stats, stats
        assert set(stats["stages"]) == {s["name"] for s in sc["stages"]} == {"low", "high"}
        for name, split in stats["stages"].items():
            ok = sum(c["counters"]["ok"] for c in sc["by_stage"][name].values())
            assert abs(split["success"] - ok) <= _in_flight_bound(sc, name), (name, split, ok)
            assert split["fail"] == 0 and split["requests"] == split["success"] > 0
            assert split["queue_ms"] >= 0 and split["compute_ms"] > 0
            assert split["compute_ms"] >= split["compute_infer_ms"] > 0
            assert split["avg_batch"] >= 1
    # one request per model execution under the fault; full-ish batches near capacity
    assert [serial["server_stats"]["stages"][n]["avg_batch"] for n in ("low", "high")] == [1.0, 1.0]
    assert healthy["server_stats"]["stages"]["high"]["avg_batch"] > 1.0
