"""Freeze, real runs: the Locust process SIGKILLed mid-freeze — no handler,
atexit or finally of the harness runs. An attached server is left running and serving (the
pause's undo guard continued it); a server the harness started is continued and stopped by
its own guard; the sampler stops with its harness either way."""

from __future__ import annotations

import contextlib
import json
import os
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


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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


def _kill_locust_mid_freeze(harness: subprocess.Popen, server: int) -> None:
    """Wait for the freeze, find the pause's undo guard, SIGKILL the Locust process."""
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
    _wait(lambda: not guard.is_running() or guard.status() == "zombie", 5, "pause guard exit")


def _harness(tmp_path: Path, out: Path, *target: str) -> subprocess.Popen:
    scenario = tmp_path / "freeze_kill.toml"
    scenario.write_text(FREEZE)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(scenario),
            "--quick",
            *target,
            "--out",
            str(out),
        ],  # fmt: skip
        cwd=REPO,
        stdout=(tmp_path / "harness.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _cleanup(harness: subprocess.Popen, server: int | None) -> None:
    if harness.poll() is None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.killpg(harness.pid, signal.SIGKILL)
    harness.wait(30)
    if server is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGCONT)
            os.kill(server, signal.SIGKILL)


def _results_of_the_dead_run(harness: subprocess.Popen, out: Path) -> dict:
    """The CLI outlives its SIGKILLed Locust process and writes what it has: a results
    document (the schema fixture validates it) whose scenario failed run.completed and
    keeps the server's samples taken before the kill."""
    assert harness.wait(60) == 1
    doc = json.loads((out / "results.json").read_text())
    (sc,) = doc["scenarios"]
    assert sc["verdict"] == "fail" and sc["partial"] and doc["verdict"] == "fail"
    (died,) = [c for c in sc["checks"] if c["id"] == "run.completed"]
    assert died["passed"] is False and "no results" in died["detail"]
    assert len(sc["server"]["series"]["t"]) >= 3, sc["server"]  # measured before the kill
    return doc


def _samplers(out: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "sample" in cmd and str(out) in " ".join(cmd):
            found.append(p)
    return found


@pytest.mark.slow
def test_sigkill_of_locust_mid_freeze_leaves_an_attached_server_serving(
    tmp_path: Path,
) -> None:
    """A server the harness attached to (not its own): resumed by the pause's undo guard
    and serving, as it was before the run."""
    from harness.testing.server import free_port, is_ready

    port = free_port()
    srv = subprocess.Popen(
        [sys.executable, "-m", "harness_reference_server", "--model", "mlp", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    out = tmp_path / "out"
    harness = None
    try:
        _wait(lambda: is_ready(base), 60, "the server ready")
        harness = _harness(tmp_path, out, "--target", base, "--sut-pid", str(srv.pid))
        _kill_locust_mid_freeze(harness, srv.pid)
        state = _wait(
            lambda: (s := proc_state(srv.pid)) not in ("T", "t") and s, 5, "the server to run"
        )
        assert state in ("S", "R"), state
        assert is_ready(base)
        assert _infer(base) == 200
        # the sampler the killed Locust process started stopped with it
        _wait(lambda: not _samplers(out), 10, "the sampler to stop")
        _results_of_the_dead_run(harness, out)
    finally:
        if harness is not None:
            _cleanup(harness, None)
        with contextlib.suppress(ProcessLookupError):
            os.kill(srv.pid, signal.SIGCONT)
        srv.kill()
        srv.wait()


@pytest.mark.slow
def test_sigkill_of_locust_mid_freeze_stops_the_server_it_started(
    tmp_path: Path,
) -> None:
    """A server the harness started (--sut-cmd): resumed, then stopped by its own guard —
    a SIGKILLed harness leaves no server holding its port and CPU, and no sampler."""
    out = tmp_path / "out"
    sut_cmd = f"{sys.executable} -m harness_reference_server --model mlp --port {{port}}"
    harness = _harness(tmp_path, out, "--sut-cmd", sut_cmd)
    server: int | None = None
    try:
        server = _wait(lambda: _server_pid(out), 120, "the server's pid file")
        _kill_locust_mid_freeze(harness, server)
        _wait(lambda: _gone(server), 20, "the server to stop")
        log = next(out.glob("*/sut.log")).read_text()
        # continued first: a frozen server cannot handle SIGTERM, this one drained
        assert "received SIGTERM: draining" in log, log[-2000:]
        _wait(lambda: not _samplers(out), 10, "the sampler to stop")
        _results_of_the_dead_run(harness, out)
    finally:
        _cleanup(harness, server)
