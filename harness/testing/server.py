"""Start ``python -m harness_reference_server`` on a free loopback port; stop it by pid.

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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness.protocols import get as protocol

# the reference server speaks KServe V2: its readiness and inference paths come from there
V2 = protocol("kserve-v2")


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
                f"harness_reference_server exited with {handle.proc.returncode} before ready:\n{handle.log()}"
            )
        if http_status(handle.url, V2.ready_path, timeout=1.0) == 200:
            return
        time.sleep(0.05)
    raise TimeoutError(f"harness_reference_server not ready after {timeout}s:\n{handle.log()}")


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
        "harness_reference_server",
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
        conn.request("POST", V2.infer_path(model), body, {"Content-Type": "application/json"})
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


# -- concurrent clients for real-socket tests ----------------------------------------

SIM_ROW = [float(i) for i in range(16)]


@dataclasses.dataclass
class Answer:
    status: int
    doc: dict
    headers: dict
    start: float
    end: float
    sent: bytes = b""

    @property
    def seconds(self) -> float:
        return self.end - self.start


def wait_http_ok(
    url: str, proc: subprocess.Popen[Any], timeout: float, log: Path, what: str
) -> None:
    """Poll ``url`` until it answers 2xx; an AssertionError with the tail of ``log`` when
    ``proc`` (a server a test started) exits first or ``timeout`` passes."""
    import urllib.request

    end = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"{what} did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.3)


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll server state we cannot subscribe to (readiness, metrics), bounded in time."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def connection(srv: ServerHandle) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)


def send(srv: ServerHandle, body: bytes, model: str = "sim") -> Answer:
    t0 = time.monotonic()
    status, doc, headers = post_infer(srv.url, model, body, timeout=60)
    return Answer(status, doc, headers, t0, time.monotonic(), body)


def run_clients(
    srv: ServerHandle,
    n_clients: int,
    per_client: int,
    body: bytes | Callable[[int, int], bytes],
    model: str = "sim",
) -> list[Answer]:
    """Closed loop: n_clients threads, each with one keep-alive connection.

    ``body`` is fixed or a function of (client index, request index).
    """
    answers: list[Answer] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        conn = connection(srv)
        try:
            for r in range(per_client):
                sent = body(c, r) if callable(body) else body
                t0 = time.monotonic()
                status, doc, headers = post_infer(srv.url, model, sent, conn=conn)
                with lock:
                    answers.append(Answer(status, doc, headers, t0, time.monotonic(), sent))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
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


def backlog_order(srv: ServerHandle, n_default: int) -> tuple[Answer, list[Answer]]:
    """Occupy the single worker, queue n_default default requests, then one priority 1."""
    blocker: list[Answer] = []
    threads = [in_background(srv, infer_body([SIM_ROW]), blocker)]
    wait_until(lambda: batches_started(srv) == 1)
    defaults: list[Answer] = []
    for _ in range(n_default):
        threads.append(in_background(srv, infer_body([SIM_ROW]), defaults))
    wait_until(lambda: metric_sum(scrape(srv.url), "refserver_requests_in_flight") == 1 + n_default)
    high = send(srv, infer_body([[9.0] * 16], priority=1))
    for t in threads:
        t.join(60)
    return high, defaults


def is_ready(base: str, timeout_s: float = 2.0) -> bool:
    """The server at ``base`` (http://HOST:PORT) answers 200 on its V2 readiness path."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}{V2.ready_path}", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False
