"""Start ``python -m reference_server`` on a free loopback port; stop it by pid.

Reusable by any test that needs a real server::

    with start_server("--model", "sim") as srv:
        post_infer(srv.url, "sim", rows=[[0.0] * 16])

The server is always stopped in a ``finally`` (SIGTERM, then SIGKILL after a grace
period), by its own pid, never by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass
class ServerHandle:
    url: str
    port: int
    pid: int
    proc: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, path: str, timeout: float = 2.0) -> int:
    """GET and return the status code; -1 if the connection failed."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return -1
    finally:
        conn.close()


def wait_ready(handle: ServerHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError(
                f"reference_server exited with {handle.proc.returncode} before ready:\n{handle.log()}"
            )
        if http_status(handle.url, "/v2/health/ready", timeout=1.0) == 200:
            return
        time.sleep(0.05)
    raise TimeoutError(f"reference_server not ready after {timeout}s:\n{handle.log()}")


def stop_server(handle: ServerHandle, grace_s: float = 15.0) -> int | None:
    """SIGTERM by pid, wait, SIGKILL if still alive; returns the exit code."""
    proc = handle.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(handle.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode


@contextlib.contextmanager
def start_server(
    *args: str, ready_timeout: float = 30, wait_for_ready: bool = True
) -> Iterator[ServerHandle]:
    """Run the reference server with ``args`` on a free port until the block exits.

    ``--port`` and ``--host`` are chosen here. With ``wait_for_ready=False`` the handle
    is yielded as soon as the process has started (for readiness tests).
    """
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="refserver-", suffix=".log")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable,
        "-m",
        "reference_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    with os.fdopen(fd, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    handle = ServerHandle(f"http://127.0.0.1:{port}", port, proc.pid, proc, log_path)
    try:
        if wait_for_ready:
            wait_ready(handle, ready_timeout)
        yield handle
    finally:
        stop_server(handle)
        with contextlib.suppress(OSError):
            os.unlink(log_path)


def infer_body(
    rows: Sequence[Sequence[float]],
    *,
    request_id: str | None = None,
    priority: int | None = None,
    timeout_us: int | None = None,
) -> bytes:
    params: dict[str, int] = {}
    if priority is not None:
        params["priority"] = priority
    if timeout_us is not None:
        params["timeout"] = timeout_us
    doc: dict[str, Any] = {
        "inputs": [
            {
                "name": "input",
                "shape": [len(rows), len(rows[0])],
                "datatype": "FP32",
                "data": [v for row in rows for v in row],
            }
        ]
    }
    if request_id is not None:
        doc["id"] = request_id
    if params:
        doc["parameters"] = params
    return json.dumps(doc).encode()


def post_infer(
    url: str,
    model: str,
    body: bytes,
    timeout: float = 30.0,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST an inference; returns (status, JSON body, headers). Reuses ``conn`` if given."""
    own = conn is None
    if conn is None:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(
            "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        raw = resp.read()
        doc = json.loads(raw) if raw else {}
        return resp.status, doc, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        if own:
            conn.close()


def scrape(url: str) -> dict[str, float]:
    """GET /metrics and flatten to ``{'name{k="v",...}': value}`` (labels sorted)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of every series of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total
