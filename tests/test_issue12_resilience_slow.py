"""Issue 12 (part A), real runs: the Locust process SIGKILLed mid-freeze leaves a server
that runs and serves (the undo guard continued it) — no handler, atexit or finally of the
harness ran."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from harness.chaos.base import proc_state

REPO = Path(__file__).resolve().parents[1]

# A long freeze, so the kill surely lands inside it; an absolute rate: no calibration.
FREEZE = """
name = "freeze_kill"
[load]
mode = "open"
arrival = "poisson"
request_timeout_s = 30
calibrate = false

[[stages]]
name = "baseline"
duration_s = 4
warmup_s = 1
rate = 40

[[stages]]
name = "freeze"
duration_s = 30
rate = 40

[[chaos]]
at_s = 4
action = "pause"
duration_s = 30

[checks]
"accounting.balanced" = {}
"""


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _server_pid(out: Path) -> int | None:
    """The pid the harness wrote for the server it started (OUT/<scenario>/samples)."""
    for f in out.glob("*/samples/sut.pid"):
        with contextlib.suppress(OSError, ValueError):
            return int(f.read_text())
    return None


def _infer(base: str) -> int:
    """One real inference request against the server; its HTTP status."""
    with urllib.request.urlopen(f"{base}/v2/models/mlp", timeout=10) as r:
        meta = json.load(r)
    inp = meta["inputs"][0]
    width = int(inp["shape"][-1])
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": inp["name"],
                    "shape": [1, width],
                    "datatype": inp["datatype"],
                    "data": [0.5] * width,
                }
            ]
        }  # fmt: skip
    ).encode()
    req = urllib.request.Request(
        f"{base}/v2/models/mlp/infer", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        json.load(r)
        return r.status


@pytest.mark.slow
def test_issue12_sigkill_of_locust_mid_freeze_leaves_the_server_serving(tmp_path: Path) -> None:
    scenario = tmp_path / "freeze_kill.toml"
    scenario.write_text(FREEZE)
    out = tmp_path / "out"
    sut_cmd = f"{sys.executable} -m reference_server --model mlp --port {{port}}"
    harness = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(scenario),
            "--quick",
            "--sut-cmd",
            sut_cmd,
            "--out",
            str(out),
        ],  # fmt: skip
        cwd=REPO,
        stdout=(tmp_path / "harness.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server: int | None = None
    try:
        server = _wait(lambda: _server_pid(out), 120, "the server's pid file")
        _wait(lambda: proc_state(server) in ("T", "t"), 120, "the freeze (server in state T)")
        locust = next(
            p
            for p in psutil.Process(harness.pid).children(recursive=True)
            if "locust" in " ".join(p.cmdline())
        )
        guard = next(  # the pause's undo guard, armed with this server's pid
            p
            for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "harness-guard"
            and any(a.startswith(f"{server}:") for a in p.info["cmdline"] or [])
        )
        locust.send_signal(signal.SIGKILL)  # no handler, no atexit, no finally runs
        locust.wait(10)
        state = _wait(
            lambda: (s := proc_state(server)) not in ("T", "t") and s, 5, "the server to run"
        )
        assert state in ("S", "R"), state
        _wait(lambda: not guard.is_running() or guard.status() == "zombie", 5, "guard exit")
        port = next(
            a.split("=", 1)[-1] if "=" in a else psutil.Process(server).cmdline()[i + 1]
            for i, a in enumerate(psutil.Process(server).cmdline())
            if a.startswith("--port")
        )
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=10) as r:
            assert r.status == 200
        assert _infer(base) == 200
    finally:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(30)
        if server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGCONT)
                os.kill(server, signal.SIGKILL)
        # the sampler the killed Locust process started runs in a session of its own
        for p in psutil.process_iter(["cmdline"]):
            if str(out) in " ".join(p.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        # what the CLI wrote after its Locust process died is a stub, not a results
        # document (the schema fixture would reject it); this test judges the server
        shutil.rmtree(out, ignore_errors=True)
