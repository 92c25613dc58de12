"""End to end: real Locust runs against the reference server over
https (uvicorn's own TLS, a throwaway CA) behind a bearer-token check.

The server answers 401 to any request without the token, so ``ok > 0`` proves the header
went out on the load's requests (and on the preflight, metadata and golden fetches before
them), over TLS, through the plan to the load process.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.testing.locust_runs import REPO, SCENARIOS, run_locust, scenario_result, stop
from harness.testing.server import free_port
from harness.testing.tls import make_certs, needs_openssl

pytestmark = [pytest.mark.slow, needs_openssl]

TOKEN = "Bearer s3cret-token-4242"

# The bundled reference server, served by uvicorn with TLS, refusing requests without the
# token (an ASGI wrapper: the reference server itself has no auth).
_LAUNCHER = """
import sys, uvicorn
from harness_reference_server.app import create_app
from harness_reference_server.config import parse_config
port, key, cert, token = sys.argv[1:5]
app = create_app(parse_config(["--model", "sim", "--sim-base-ms", "2", "--sim-item-ms", "0.1",
                               "--port", port]))
async def guarded(scope, receive, send):
    if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != token.encode():
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await app(scope, receive, send)
uvicorn.run(guarded, host="127.0.0.1", port=int(port), ssl_keyfile=key, ssl_certfile=cert,
            log_level="warning", lifespan="on")
"""


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory) -> Iterator[dict]:
    d = tmp_path_factory.mktemp("tls_run")
    certs = make_certs(d)
    port = free_port()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    log = open(d / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(port), str(certs["key"]), str(certs["cert"]), TOKEN],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    try:
        deadline = time.monotonic() + 60
        while True:
            req = urllib.request.Request(url + "/v2/health/ready", headers={"Authorization": TOKEN})
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(req, context=ctx, timeout=1) as resp,
            ):
                if resp.status == 200:
                    break
            assert proc.poll() is None, (d / "server.log").read_text()
            assert time.monotonic() < deadline, "TLS reference server not ready in 60 s"
            time.sleep(0.1)
        yield {"url": url, **certs}
    finally:
        stop(proc)
        log.close()


def _no_secret_in(out: Path, *texts: str) -> None:
    """The token is in no output file and no log line: the results name the header only."""
    secret = TOKEN.split()[-1]
    for path in out.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    for text in texts:
        assert secret not in text


def test_https_run_with_ca_cert_and_auth_header(tls_server, tmp_path) -> None:
    run = run_locust(
        "--host", tls_server["url"],
        "--ca-cert", str(tls_server["ca"]),
        "--header", f"Authorization: {TOKEN}",
        "--scenario", str(SCENARIOS / "short_constant.toml"),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode != 2, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    c = sc["counters"]
    assert c["ok"] >= 0.5 * c["scheduled"] > 0, c  # 401s would be errors, not ok
    assert c["failed"]["cross_wired"] == c["failed"]["drift"] == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["sut"]["headers"] == ["Authorization"]
    assert doc["sut"]["tls"] == {"ca_cert": str(tls_server["ca"]), "verify": True}
    assert doc["sut"]["target"] == tls_server["url"]
    _no_secret_in(tmp_path, run.stdout)


def test_https_without_ca_cert_is_refused_before_load(tls_server, tmp_path) -> None:
    """The server's certificate does not verify against the system CAs: exit 2 in one line
    naming --ca-cert, before any load (no request was counted)."""
    run = run_locust(
        "--host", tls_server["url"],
        "--header", f"Authorization: {TOKEN}",
        "--scenario", str(SCENARIOS / "short_constant.toml"),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 2, run.stdout[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if "certificate verify failed" in ln]
    assert len(lines) == 1 and "--ca-cert FILE" in lines[0] and "--insecure" in lines[0], (
        run.stdout[-3000:]
    )
    results = tmp_path / "results.json"
    if results.exists():
        sc = json.loads(results.read_text())["scenarios"]
        assert not sc or not (sc[0].get("counters") or {}).get("scheduled")
    _no_secret_in(tmp_path, run.stdout)


def test_https_insecure_with_header_from_the_environment(tls_server, tmp_path) -> None:
    env_before = os.environ.get("HARNESS_HEADER")
    os.environ["HARNESS_HEADER"] = json.dumps([f"Authorization: {TOKEN}"])
    try:
        run = run_locust(
            "--host", tls_server["url"],
            "--insecure",
            "--scenario", str(SCENARIOS / "short_constant.toml"),
            "--duration", "3",
            "--out", str(tmp_path),
        )  # fmt: skip
    finally:
        if env_before is None:
            os.environ.pop("HARNESS_HEADER", None)
        else:
            os.environ["HARNESS_HEADER"] = env_before
    assert run.returncode != 2, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    assert sc["counters"]["ok"] > 0, sc["counters"]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["sut"]["tls"] == {"ca_cert": None, "verify": False}
    _no_secret_in(tmp_path, run.stdout)
