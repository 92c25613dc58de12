"""Network faults: SIGKILL of the Locust process in the middle of a network fault.

No atexit hook or signal handler runs on SIGKILL: the fault proxy must notice by itself
(EOF on its control pipe) and go, freeing its port and closing the connections it held,
and the server — which only ever saw a client go away — must be as healthy as before.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from harness.testing.locust_runs import REPO, locust_cmd, stop
from harness.testing.server import http_status, infer_body, post_infer, start_server
from harness_reference_server.config import DEFAULT_MLP_DIMS

# A blackhole that outlasts the test: the kill lands while the proxy holds connections
# (the harder case: data held, clients waiting) after a latency phase has come and gone.
SCENARIO = """
name = "network_kill"
[load]
mode = "open"
arrival = "constant"
request_timeout_s = 5
calibrate = false
verify = false
[[stages]]
name = "baseline"
duration_s = 3
rate = 40
[[stages]]
name = "latency"
duration_s = 3
rate = 40
[[stages]]
name = "blackhole"
duration_s = 60
rate = 40
[[chaos]]
action = "network"
at_s = 3
duration_s = 3
toxic = "latency"
latency_ms = 30
[[chaos]]
action = "network"
at_s = 6
duration_s = 60
toxic = "timeout"
stream = "upstream"
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sockets(pid: int) -> int:
    fd_dir = Path(f"/proc/{pid}/fd")
    n = 0
    for fd in fd_dir.iterdir():
        try:
            n += os.readlink(fd).startswith("socket:")
        except OSError:
            continue
    return n


def _proxy_of(parent: int) -> psutil.Process | None:
    for child in psutil.Process(parent).children(recursive=True):
        try:
            if any(a.endswith("netproxy.py") for a in child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


@pytest.mark.slow
def test_sigkill_of_locust_mid_blackhole_leaves_no_proxy(tmp_path: Path) -> None:
    scenario = tmp_path / "network_kill.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    with start_server("--model", "mlp") as srv:
        body = infer_body([[0.5] * DEFAULT_MLP_DIMS[0]])
        status, _, _ = post_infer(srv.url, "mlp", body)
        assert status == 200
        sockets_before = _sockets(srv.pid)
        proc = subprocess.Popen(
            locust_cmd(
                "--headless",
                "--only-summary",
                "--scenario",
                str(scenario),
                "--host",
                srv.url,
                "--sut-pid",
                str(srv.pid),
                "--no-sample",
                "--out",
                str(out),
            ),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proxy = None
        try:
            # wait for the blackhole to hold connections: its stage, a second in
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                proxy = proxy or _proxy_of(proc.pid)
                try:
                    prog = json.loads((out / "progress.json").read_text())
                except (OSError, ValueError):
                    prog = {}
                if prog.get("stage") == "blackhole" and prog.get("elapsed_s", 0) >= 7.5:
                    break
                assert proc.poll() is None, "locust ended before the blackhole"
                time.sleep(0.2)
            else:
                pytest.fail("the run never reached its blackhole stage")
            assert proxy is not None and _alive(proxy.pid)
            port = next(c.laddr.port for c in proxy.net_connections("tcp") if c.status == "LISTEN")
            held = len([c for c in proxy.net_connections("tcp") if c.status == "ESTABLISHED"])
            assert held > 0  # connections were open through the proxy at the kill
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            gone_by = time.monotonic() + 5
            while _alive(proxy.pid) and time.monotonic() < gone_by:
                time.sleep(0.05)
            assert not _alive(proxy.pid), "the fault proxy outlived the SIGKILLed harness"
            with socket.socket() as s:
                # its port is free: nobody listens there. SO_REUSEADDR, as every server
                # sets it: the connections the proxy closed as it died sit in TIME_WAIT on
                # that port for a minute (TCP's rule, not a leftover), and only a listener
                # still bound there would refuse this bind
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen()
        finally:
            stop(proc)
            if proxy is not None and _alive(proxy.pid):
                proxy.kill()
        # the server: ready, answering at once, and holding no connection of the proxy's
        assert http_status(srv.url, "/v2/health/ready") == 200
        t0 = time.monotonic()
        status, _, _ = post_infer(srv.url, "mlp", body, timeout=5)
        assert status == 200 and time.monotonic() - t0 < 1.0
        settle = time.monotonic() + 5
        while _sockets(srv.pid) > sockets_before and time.monotonic() < settle:
            time.sleep(0.1)
        assert _sockets(srv.pid) <= sockets_before
