"""Servers on other hosts — ``--header``, ``https://`` with ``--ca-cert`` /
``--insecure``, ``--metrics-url``, and ``compare`` matching machines on the CPU.

Fast tests on real loopback sockets: a gevent server (plain or TLS, with a throwaway CA made
by the ``openssl`` CLI) records every request head, so each path the harness talks to the
server on (preflight GET, metadata, golden outputs, calibration, the load's pre-built
requests) is seen to carry the headers, over TLS, on kept-alive connections.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import configargparse
import gevent
import pytest
from gevent import ssl as gssl
from gevent.server import StreamServer

from harness import cli
from harness.errors import ConfigError, ResultFormatError
from harness.load import calibrate, http, payloads, target
from harness.load.options import add_options, options_from
from harness.load.preflight import check_transport
from harness.load.users import Plan
from harness.load.wire import PlanMessage
from harness.locust_run import Target
from harness.protocols import kserve_v2
from harness.report.compare import compare
from harness.results import machine_metadata
from harness.testing.results import MACHINE
from harness.testing.tls import make_certs

SECRET = "Bearer s3cret-token-4242"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI makes the throwaway test CA")
    d = tmp_path_factory.mktemp("tls")
    return {**make_certs(d, "ca"), "other_ca": make_certs(d, "other")["ca"]}


@pytest.fixture(autouse=True)
def _plain_client():
    """Each test sets the process's client itself; leave it as the rest of the suite finds it."""
    yield
    http.configure(http.Client())


class Recorder:
    """A keep-alive V2-ish server recording each request's head and each accepted connection."""

    def __init__(self, tls: dict[str, Path] | None = None) -> None:
        self.heads: list[dict[str, str]] = []
        self.connections = 0
        self.tls = None
        if tls:
            self.tls = gssl.SSLContext(gssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(str(tls["cert"]), str(tls["key"]))
        self.server = StreamServer(("127.0.0.1", 0), self._handle)
        self.server.start()
        self.port = self.server.server_port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def _answer(self, method: str, path: str, body: bytes) -> bytes:
        if path == "/v2/models/m/infer":
            req = json.loads(body)
            value = float(sum(map(float, req["inputs"][0]["data"])))
            return json.dumps(
                {
                    "id": req["id"],
                    "outputs": [
                        {"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [value]}
                    ],
                }
            ).encode()
        if path == "/v2/models/m":
            return json.dumps(
                {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4]}]}
            ).encode()
        return b'{"model": "m"}'

    def _handle(self, sock, _addr) -> None:
        buf = b""
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)  # a refused handshake: out
            self.connections += 1
            while True:
                while b"\r\n\r\n" not in buf and not buf.startswith(b"\x16"):
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                if buf.startswith(b"\x16"):  # a TLS hello to a plain-HTTP port, as h11 answers
                    sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    return
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ")
                fields = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    fields[k.strip().lower()] = v.strip()
                self.heads.append({"method": method, "path": path, **fields})
                length = int(fields.get("content-length", 0))
                while len(buf) < length:
                    buf += sock.recv(65536)
                body, buf = buf[:length], buf[length:]
                out = self._answer(method, path, body)
                sock.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(out), out)
                )
        except OSError:
            return


def _client(url: str, *headers: str, ca: Path | None = None, insecure: bool = False):
    return http.Client.for_target(url, list(headers), str(ca) if ca else None, insecure)


# -- --header: validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("Bearer s3cret-token-4242", "has no ':'"),
        (": s3cret-token-4242", "not an HTTP header name"),
        ("Bad Name: s3cret-token-4242", "not an HTTP header name"),
        ("Authorization: s3cret-token-4242\r\nX-Evil: 1", "CR, LF or NUL"),
        ("Authorization: s3cret-token-4242\nX-Evil: 1", "CR, LF or NUL"),
        ("Content-Length: 0", "sets Content-Length itself"),
        ("Authorization: s3cr\u20acet", "Latin-1"),
    ],
)
def test_bad_header_is_a_one_line_usage_error_without_the_value(given, message):
    with pytest.raises(ConfigError, match=message) as err:
        http.parse_headers([given])
    text = str(err.value)
    assert "s3cret" not in text and "\n" not in text and err.value.exit_code == 2


def test_header_given_twice_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        http.parse_headers(["Authorization: a", "authorization: b"])


def _plugin_parse(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    p = configargparse.ArgumentParser()
    add_options(p)
    return p.parse_args(argv, env_vars=env or {})


def test_plugin_options_parse_validate_and_travel_to_workers(tmp_path, certs):
    parsed = _plugin_parse(
        ["--header", f"Authorization: {SECRET}", "--header", "Host:model.example.com",
         "--ca-cert", str(certs["ca"]), "--metrics-url", "http://127.0.0.1:8002/metrics"]
    )  # fmt: skip
    opts = options_from(parsed)
    assert opts.headers == (f"Authorization: {SECRET}", "Host: model.example.com")
    assert opts.ca_cert == str(certs["ca"]) and not opts.insecure
    assert opts.metrics_url == "http://127.0.0.1:8002/metrics"
    # the environment variable: one header, or a JSON list of them
    env = {"HARNESS_HEADER": json.dumps([f"Authorization: {SECRET}", "X-Team: ml"])}
    assert options_from(_plugin_parse([], env)).headers == (
        f"Authorization: {SECRET}",
        "X-Team: ml",
    )
    assert options_from(_plugin_parse([], {"HARNESS_HEADER": "X-One: 1"})).headers == ("X-One: 1",)
    # to the workers inside the plan's options (JSON on the wire), and back equal
    plan = Plan(0.0, 0, 1, "https://10.0.0.5:8443", "m", None, [], None)
    msg = PlanMessage(plan=plan, options=opts, sut_cores_n=1)
    assert PlanMessage.from_wire(json.loads(json.dumps(msg.to_wire()))).options == opts
    # refused at parsing, exit 2
    for argv, why in (
        (["--header", "NoColonHere"], "has no ':'"),
        (["--ca-cert", str(tmp_path / "missing.pem")], "no such file"),
        (["--ca-cert", str(certs["ca"]), "--insecure"], "both set"),
        (["--metrics-url", "127.0.0.1:8002/metrics"], "expected a URL"),
    ):
        with pytest.raises(ConfigError, match=why):
            options_from(_plugin_parse(argv))


# -- --header: on every request the harness makes --------------------------------------------


def test_headers_reach_the_server_on_every_request_path(certs):
    """Preflight GET, metadata, golden outputs, calibration and the load's pre-built
    requests all carry the headers; a given Host replaces the default one."""
    srv = Recorder(tls=certs)
    try:
        client = _client(srv.url, f"Authorization: {SECRET}", "Host: model.example.com",
                         ca=certs["ca"])  # fmt: skip
        http.configure(client)
        assert target.get(srv.url + "/v2/health/ready")[0] == 200
        meta = payloads.model_metadata(srv.url, "m")
        specs, _ = kserve_v2.resolve_specs(meta, "m")
        inputs = kserve_v2.generate_inputs(specs, 4, seed=1)
        pool = payloads.PayloadPool(
            "127.0.0.1", srv.port, "/v2/models/m/infer", inputs, [payloads.ClassParams("default")]
        )
        golden = target.fetch_golden(pool, "127.0.0.1", srv.port, 5.0)
        assert golden.summary()
        cal = calibrate.calibrate(
            pool, "127.0.0.1", srv.port, "default", users=2, duration_s=0.4, timeout_s=2.0
        )
        assert cal.ok > 0
        paths = {h["path"] for h in srv.heads}
        assert {"/v2/health/ready", "/v2/models/m", "/v2/models/m/infer"} <= paths
        assert len(srv.heads) > 10
        for h in srv.heads:
            assert h["authorization"] == SECRET, h
            assert h["host"] == "model.example.com", h
        assert client.describe() == {
            "headers": ["Authorization", "Host"],
            "tls": {"ca_cert": str(certs["ca"]), "verify": True},
        }
    finally:
        srv.stop()


def test_without_headers_the_request_is_unchanged():
    head = http.build_head("POST", "/v2/models/m/infer", "h", 8000, 7, http.Client())
    assert head == (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h:8000\r\nUser-Agent: harness-load\r\n"
        b"Content-Type: application/json\r\nContent-Length: 7\r\n\r\n"
    )


# -- https:// ---------------------------------------------------------------------------------


def test_tls_keep_alive_reuses_one_connection(certs):
    srv = Recorder(tls=certs)
    try:
        client = _client(srv.url, ca=certs["ca"])
        conn = http.Connection("127.0.0.1", srv.port, client=client)
        raw = http.build_head("GET", "/v2", "127.0.0.1", srv.port, None, client)
        sock = None
        for i in range(20):
            assert conn.exchange(raw, timeout=5.0, method="GET") == (200, b'{"model": "m"}')
            if i == 0:
                sock = conn.sock
                gevent.sleep(0.05)  # TLS 1.3 session tickets arrive while the socket idles
        assert conn.sock is sock and srv.connections == 1
        conn.close()
    finally:
        srv.stop()


def test_tls_failures_are_usage_errors_naming_the_fix(certs, tmp_path):
    srv = Recorder(tls=certs)
    plain = Recorder()
    try:
        # no --ca-cert: the system CAs do not know the test CA
        for client, fix in (
            (_client(srv.url), "pass --ca-cert FILE"),
            (_client(srv.url, ca=certs["other_ca"]), "did not sign it"),
        ):
            with pytest.raises(http.TLSFailed, match=fix):
                http.request(srv.url + "/v2", client=client)
            http.configure(client)
            with pytest.raises(ConfigError, match="--insecure") as err:
                target.get(srv.url + "/v2/health/ready")  # the plugin's first request
            assert "\n" not in str(err.value) and err.value.exit_code == 2
            with pytest.raises(ConfigError, match="certificate verify failed"):
                check_transport(srv.url, client)
            with pytest.raises(ConfigError, match="certificate verify failed"):
                payloads.fetch_json(srv.url + "/v2")
        # --insecure: no verification, works
        assert http.request(srv.url + "/v2", client=_client(srv.url, insecure=True))[0] == 200
        check_transport(srv.url, _client(srv.url, ca=certs["ca"]))  # verifies: no error
        # an https:// URL on a plain-HTTP port
        bad = plain.url.replace("http://", "https://")
        with pytest.raises(ConfigError, match="does not speak TLS"):
            check_transport(bad, _client(bad, ca=certs["ca"]))
        # a port nobody listens on: left to the readiness wait, no usage error here
        check_transport("https://127.0.0.1:1", _client("https://127.0.0.1:1"))
        with pytest.raises(ConfigError, match="not be loaded as PEM"):
            (tmp_path / "junk.pem").write_text("not a certificate")
            http.check_ca_cert(str(tmp_path / "junk.pem"))
    finally:
        srv.stop()
        plain.stop()


def test_tls_failure_during_load_is_a_connection_error(certs):
    """Under load a TLS failure is one more failed request (the engine's ConnectionFailed),
    never an exception that kills the user greenlet."""
    srv = Recorder(tls=certs)
    try:
        conn = http.Connection("127.0.0.1", srv.port, client=_client(srv.url))
        with pytest.raises(http.ConnectionFailed):
            conn.exchange(b"GET / HTTP/1.1\r\n\r\n", timeout=5.0)
        assert conn.sock is None
    finally:
        srv.stop()


# -- harness run / acceptance ------------------------------------------------------------------


def test_cli_refuses_bad_deployment_options_in_one_line(capsys, certs, tmp_path):
    srv = Recorder(tls=certs)
    try:
        for base in (
            ["run", "steady_state", "--out", str(tmp_path / "o")],
            ["peak", "--slo-p99-ms", "100", "--out", str(tmp_path / "p")],
        ):
            _refuses_bad_deployment_options(base, srv, capsys, tmp_path)
        assert not (tmp_path / "p").exists()  # peak refused before anything was written
    finally:
        srv.stop()


def test_peak_points_go_out_with_the_deployment_options(certs):
    from harness.acceptance.plan import deployment_of
    from harness.peak.runner import target_for

    deployment = deployment_of([f"Authorization: {SECRET}"], str(certs["ca"]), False, None)
    with target_for(
        sut_cmd=None,
        url="https://10.0.0.5:8443",
        sut_pid=None,
        sut_cores=None,
        model="m",
        log_path=Path("unused.log"),
        deployment=deployment,
    ) as (settings, _gone, _desc):
        t = settings.target
    assert t.headers == (f"Authorization: {SECRET}",)
    assert t.ca_cert == str(certs["ca"])
    assert SECRET not in " ".join(t.locust_args())  # the header goes by the environment


def _refuses_bad_deployment_options(base, srv, capsys, tmp_path):
    cases = (
        ([*base, "--target", srv.url, "--header", "NoColon s3cret"], "has no ':'"),
        ([*base, "--target", srv.url, "--ca-cert", str(tmp_path / "x.pem")], "no such file"),
        ([*base, "--target", srv.url], "pass --ca-cert FILE"),
    )
    for argv, why in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert why in err and "s3cret" not in err and len(err.splitlines()) == 1, err


def test_acceptance_forwards_headers_in_the_environment_not_argv(certs):
    t = Target(
        url="https://10.0.0.5:8443",
        headers=(f"Authorization: {SECRET}",),
        ca_cert=str(certs["ca"]),
        metrics_url="http://10.0.0.5:8002/metrics",
    )
    args = t.locust_args()
    assert SECRET not in " ".join(args)
    assert args[args.index("--ca-cert") + 1] == str(certs["ca"].resolve())
    assert args[args.index("--metrics-url") + 1] == "http://10.0.0.5:8002/metrics"
    env = t.locust_env()
    parsed = _plugin_parse([], env)
    assert options_from(parsed).headers == (f"Authorization: {SECRET}",)
    assert t.describe()["headers"] == ["Authorization"]


# -- harness compare across CI runners ---------------------------------------------------------


def _doc(**machine) -> dict:
    m = {**MACHINE, "cpu_model": "AMD EPYC 7763 64-Core Processor", "governor": None, **machine}
    return {"machine": m, "sut": {}, "scenarios": []}


def test_compare_matches_machines_on_cpu_not_hostname(tmp_path):
    # two ephemeral runners of one class: only the hostname differs
    cmp = compare(_doc(host="runner-a"), _doc(host="runner-b"))
    assert any("machine.host differs" in w for w in cmp.warnings)
    # another CPU model, another governor: refused unless forced
    for fld, other in (("cpu_model", "Intel(R) Xeon(R) Platinum 8370C"), ("governor", "powersave")):
        with pytest.raises(ResultFormatError, match=rf"machine\.{fld} is .*--force"):
            compare(_doc(), _doc(**{fld: other}))
        forced = compare(_doc(), _doc(**{fld: other}), force=True)
        assert any(f"machine.{fld}" in w for w in forced.warnings)
    # documents from before the CPU was recorded: the hostname still decides
    old = {"machine": dict(MACHINE), "sut": {}, "scenarios": []}
    with pytest.raises(ResultFormatError, match=r"machine\.host"):
        compare(old, {**old, "machine": {**MACHINE, "host": "elsewhere"}})
    # this machine records what compare matches on
    m = machine_metadata()
    assert "cpu_model" in m and "governor" in m and m["cpu_model"]


def test_compare_cli_exit_codes(tmp_path, capsys):
    from harness.results import write_document
    from harness.testing.reference_document import build_document

    for name, machine in (
        ("a", {"host": "runner-a"}),
        ("b", {"host": "runner-b"}),
        ("c", {"cpu_model": "Other CPU"}),
    ):
        doc = build_document(scenarios=["steady_state"])
        doc["machine"] = {**doc["machine"], "cpu_model": "AMD EPYC", "governor": None, **machine}
        (tmp_path / name).mkdir()
        write_document(tmp_path / name / "results.json", doc)
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "machine.cpu_model" in capsys.readouterr().err
    assert cli.main(["compare", "--force", str(tmp_path / "a"), str(tmp_path / "c")]) == 0
