"""The protocol seam: the harness speaks whatever ``harness.protocols`` names.

A toy protocol (JSON over HTTP: ``POST /echo`` with ``{"id", "x"}``, answered with
``{"id", "y"}``, y = 2x) is registered and a real scenario runs against a real toy server
through ``harness run``: readiness, metadata, the golden outputs, calibration, the load
and the integrity check all go through the protocol, and the run is judged. KServe V2,
the first protocol, keeps its requests byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness import protocols
from harness.errors import ConfigError
from harness.protocols import BadResponse, ClassParams, WireProtocol
from harness.testing.locust_runs import stop

REPO = Path(__file__).resolve().parent.parent
MECHANICS_CHECKLIST = REPO / "tests" / "data" / "scenarios_load" / "mechanics_checklist.toml"


class EchoProtocol(WireProtocol):
    """The toy: no server metadata, one model (``echo``), inputs of ``width`` numbers."""

    name = "toy-echo"
    ready_path = "/ready"
    request_name = "echo"

    def default_model(self, server_meta: Mapping[str, Any] | None) -> str:
        return "echo"

    def model_metadata_path(self, model: str) -> str:
        return "/model"

    def infer_path(self, model: str) -> str:
        return "/echo"

    def resolve_inputs(
        self,
        meta: Mapping[str, Any],
        model: str,
        input_options: Sequence[str] = (),
        sample_request: str | None = None,
    ) -> int:
        if input_options or sample_request:
            raise ConfigError("the toy-echo protocol takes no --input or --sample-request")
        return int(meta["width"])

    def generate_inputs(self, template: int, count: int, seed: int) -> list[list[int]]:
        return [[seed + i * template + j for j in range(template)] for i in range(count)]

    def request_parts(self, inputs: Any, cls: ClassParams) -> tuple[bytes, bytes]:
        return b'{"id":"', b'","x":' + json.dumps(inputs).encode() + b"}"

    def parse_answer(self, body: bytes) -> tuple[str | None, tuple[Any, ...]]:
        try:
            doc = json.loads(body)
            return doc.get("id"), tuple(doc["y"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadResponse(f"{type(exc).__name__}: {exc}") from None


TOY_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    SEEN = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, doc):
            SEEN[self.command + " " + self.path] = SEEN.get(self.command + " " + self.path, 0) + 1
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/ready":
                self.send(200, {})
            elif self.path == "/model":
                self.send(200, {"name": "echo", "width": 4})
            elif self.path == "/seen":
                self.send(200, SEEN)
            else:
                self.send(404, {"error": "no such path"})

        def do_POST(self):
            doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/echo":
                return self.send(404, {"error": "no such path"})
            self.send(200, {"id": doc["id"], "y": [2 * v for v in doc["x"]]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


@contextlib.contextmanager
def toy_server(tmp_path: Path) -> Iterator[str]:
    """The toy server in its own process on 127.0.0.1; its URL. Stopped by pid."""
    script = tmp_path / "toy_server.py"
    script.write_text(TOY_SERVER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)  # SIGTERM by pid, SIGKILL if it lingers


def test_the_registry_finds_a_protocol_by_name_or_by_module() -> None:
    assert protocols.get("kserve-v2") is protocols.default()
    assert protocols.DEFAULT in protocols.names()
    toy = protocols.register(EchoProtocol())
    assert protocols.get("toy-echo") is toy
    spec = f"{__name__}:EchoProtocol"
    assert isinstance(protocols.get(spec), EchoProtocol)  # a class: instantiated once
    assert protocols.get(spec) is protocols.get(spec)
    with pytest.raises(ConfigError, match=r"--protocol has value 'nope'; valid: .*kserve-v2"):
        protocols.get("nope")
    with pytest.raises(ConfigError, match="not a WireProtocol"):
        protocols.get(f"{__name__}:TOY_SERVER")


def test_kserve_v2_requests_and_answers_are_unchanged() -> None:
    """The first protocol's request bytes, as the harness always sent them."""
    from harness.load.payloads import PayloadPool

    v2 = protocols.get("kserve-v2")
    inputs = [[{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, -0.25]}]]
    classes = [ClassParams("default"), ClassParams("high", 2, 1000)]
    pool = PayloadPool("h", 8000, "/p" + v2.infer_path("m"), inputs, classes, v2)
    tail = b'"inputs":[{"name":"input","shape":[1,2],"datatype":"FP32","data":[0.5,-0.25]}]}'
    body = b'{"id":"0001000000000002",' + tail
    assert pool.raw("default", 0, "0001000000000002") == (
        b"POST /p/v2/models/m/infer HTTP/1.1\r\nHost: h:8000\r\nUser-Agent: harness-load\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    high = pool.body("high", 0, "0001000000000002")
    assert high == b'{"id":"0001000000000002","parameters":{"priority":2,"timeout":1000},' + tail
    answer = b'{"id":"7","outputs":[{"name":"b","data":[[3,4]]},{"name":"a","data":[1]}]}'
    assert pool.parse_answer(answer) == ("7", (1, 3, 4))
    assert v2.ready_path == "/v2/health/ready" and v2.stats_path("a b") == "/v2/models/a%20b/stats"


def test_the_engine_builds_and_verifies_with_the_plans_protocol() -> None:
    """A worker's engine finds the protocol the plan names, frames its requests and
    judges its answers with it."""
    from harness.load.integrity import build_golden, golden_to_wire
    from harness.load.recording import Recording
    from harness.load.scenario import load_scenario
    from harness.load.users import Engine, Plan

    protocols.register(EchoProtocol())
    toy = protocols.get("toy-echo")
    inputs = toy.generate_inputs(4, 8, seed=1)
    golden = build_golden([[2 * v for v in x] for x in inputs])
    sc = load_scenario("steady_state")
    plan = Plan(0.0, 0, 1, "http://127.0.0.1:9", "echo", 100.0, inputs, golden_to_wire(golden))
    assert Engine(sc, plan, Recording(1.0, 10)).protocol is protocols.default()
    plan = Plan(**{**plan.to_wire(), "protocol": "toy-echo"})
    engine = Engine(sc, plan, Recording(1.0, 10))
    raw = engine.payloads.raw(sc.classes[0].name, 3, "00000000000000aa")
    assert raw.startswith(b"POST /echo HTTP/1.1\r\n")
    assert raw.endswith(b'{"id":"00000000000000aa","x":[13, 14, 15, 16]}')
    own = json.dumps({"id": "00000000000000aa", "y": [26, 28, 30, 32]}).encode()
    other = json.dumps({"id": "00000000000000aa", "y": [2 * v for v in inputs[5]]}).encode()
    assert engine.verify(3, "00000000000000aa", own) == "ok"
    assert engine.verify(3, "00000000000000aa", other) == "cross_wired"
    assert engine.verify(3, "00000000000000aa", b'{"outputs": []}') == "bad_response"


@pytest.mark.slow
def test_a_scenario_runs_and_is_judged_over_a_toy_protocol(tmp_path: Path) -> None:
    """``harness run steady_state --quick --protocol`` against the toy server
    (each Locust process imports the toy by MODULE:ATTRIBUTE): the run
    completes, every answer is verified against its golden output, and it is judged."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with toy_server(tmp_path) as url:
        proc = subprocess.run(
            [
                sys.executable, "-m", "harness", "run", "steady_state", "--quick",
                "--target", url, "--out", str(out), "--checklist", str(MECHANICS_CHECKLIST),
                "--protocol", f"{__name__}:EchoProtocol",
                "--locust-arg=--duration=5",
            ],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        from harness.load import http

        seen = json.loads(http.request(url + "/seen", "GET")[1])
    doc = json.loads((out / "results.json").read_text())
    sc = doc["scenarios"][0]
    assert doc["verdict"] in ("pass", "fail", "invalid"), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode in (0, 1, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sc["error"] is None and not sc["partial"]
    assert doc["sut"]["model"] == "echo" and doc["sut"]["config"]["model"]["width"] == 4
    assert sc["capacity_rps"] > 0 and sc["checks"]
    assert all(c["passed"] is not None or c["skipped"] for c in sc["checks"])
    ok = sc["counters"]["ok"]
    integrity = sc["integrity"]
    assert ok > 100 and integrity["checked"] >= ok and integrity["ok"] == integrity["checked"]
    assert integrity["cross_wired"] == integrity["drift"] == integrity["id_mismatch"] == 0
    assert seen["GET /ready"] >= 1 and seen["GET /model"] >= 1 and seen["POST /echo"] > ok
    assert not any(path.startswith(("GET /v2", "POST /v2")) for path in seen)
    assert "server_stats" not in sc  # the toy has no statistics endpoint


def test_every_command_that_reaches_a_server_takes_protocol(tmp_path: Path) -> None:
    """``run``, ``acceptance``, ``peak``, ``tune`` and ``agent`` take ``--protocol`` and
    refuse an unknown one in seconds (exit 2, one line naming the valid ones), before any
    server starts."""
    out = str(tmp_path / "o")
    commands = {
        "run": ["run", "steady_state"],
        "acceptance": ["acceptance", "--quick"],
        "peak": ["peak", "--slo-p99-ms", "100"],
        "tune": [
            "tune",
            "--slo-p99-ms",
            "100",
            "--sut-cmd",
            "s --port {port} {mb}",
            "--space",
            "mb=1,2",
        ],
        "agent": ["agent", "--token", "t"],
    }
    for name, argv in commands.items():
        r = subprocess.run(
            [sys.executable, "-m", "harness", *argv, "--protocol", "nope", "--out", out]
            if name != "agent"
            else [sys.executable, "-m", "harness", *argv, "--protocol", "nope"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        assert "--protocol has value 'nope'; valid: kserve-v2" in r.stderr, (name, r.stderr)
        assert not (tmp_path / "o").exists(), name


def test_a_protocol_of_ones_own_keeps_working_without_the_batch_and_data_keywords(
    tmp_path: Path,
) -> None:
    """``resolve_inputs`` gets ``batch_size`` / ``input_data`` only when the user sets
    them: a protocol that does not declare them resolves as before, and is refused with
    the option's name when one is set; one that declares them gets their values."""
    import dataclasses

    import configargparse

    from harness.load.options import add_options, options_from
    from harness.load.preparation import resolve_inputs

    parser = configargparse.ArgumentParser()
    add_options(parser)
    opts = options_from(parser.parse_args([], env_vars={}))
    toy = EchoProtocol()
    assert resolve_inputs(toy, {"width": 4}, "echo", opts) == 4
    data = tmp_path / "data.json"
    data.write_text('{"data": [{"x": [1, 2, 3, 4]}]}')
    for change, flag in (
        ({"batch_size": 4}, "--batch-size"),
        ({"input_data": str(data)}, "--input-data"),
    ):
        with pytest.raises(ConfigError) as err:
            resolve_inputs(toy, {"width": 4}, "echo", dataclasses.replace(opts, **change))
        assert str(err.value).startswith(
            f"{flag} is set, but the toy-echo protocol does not take it"
        )

    class BatchingEcho(EchoProtocol):
        def resolve_inputs(self, meta, model, input_options=(), sample_request=None, **kw):
            return (int(meta["width"]), kw)

    batched = dataclasses.replace(opts, batch_size=4)
    assert resolve_inputs(BatchingEcho(), {"width": 4}, "echo", batched) == (4, {"batch_size": 4})
    v2 = protocols.get("kserve-v2")
    meta = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]}
    template = resolve_inputs(v2, meta, "mlp", batched)
    assert v2.generate_inputs(template, 2, seed=1)[0][0]["shape"] == [4, 8]
