"""crash_restart against a server the harness did not start. Killed, it is
started again by its supervisor (systemd's Restart=, Kubernetes, a restart loop); the
harness waits for the new process on the server's port, follows it (pid, sampler) and
judges the crash checks as for a server it restarted itself."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.errors import TargetUnavailable
from harness.load.preflight import TargetFacts, unsupported_reason
from harness.load.scenario import load_scenario
from harness.sut import AttachedSut, free_port, listener_pid
from harness.testing.server import is_ready

REPO = Path(__file__).resolve().parent.parent


def test_preflight_lets_an_attached_server_crash_but_not_roll() -> None:
    crash = load_scenario("crash_restart", mode="quick")
    roll = load_scenario("rolling_shutdown", mode="quick")
    attached = TargetFacts(sut_cmd=None, attached=True, sut_pid=4321)
    assert unsupported_reason(crash, attached) is None  # its supervisor restarts it
    why = unsupported_reason(roll, attached)
    assert why is not None and "exit code" in why
    # no pid: nothing to signal
    assert unsupported_reason(crash, TargetFacts(sut_cmd=None, attached=True)) is not None
    # through an agent attached by pid: the agent does not wait for a supervisor
    why = unsupported_reason(
        crash, TargetFacts(sut_cmd=None, attached=True, sut_pid=1, remote_cores=(0,))
    )
    assert why is not None and "supervisor" in why


def test_listener_pid_names_the_process_on_the_port() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    try:
        assert listener_pid(s.getsockname()[1]) == os.getpid()
    finally:
        s.close()
    assert listener_pid(free_port()) is None


def test_nothing_restarting_the_server_is_named() -> None:
    port = free_port()
    sut = AttachedSut(os.getpid(), f"http://127.0.0.1:{port}")
    assert sut.waits_for_supervisor
    with pytest.raises(TargetUnavailable, match="nothing restarted the server on port"):
        sut.restart(ready_timeout=0.3)
    assert not AttachedSut(os.getpid()).waits_for_supervisor  # no URL: no port to watch


def _ready(port: int) -> bool:
    return is_ready(f"http://127.0.0.1:{port}", timeout_s=1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_crash_restart_of_an_attached_server_waits_for_its_supervisor(tmp_path) -> None:
    port = free_port()
    server = f"{shlex.quote(sys.executable)} -m harness_reference_server --model mlp --port {port}"
    # a restart loop, as a supervisor: the server starts again 0.5 s after it exits
    loop = subprocess.Popen(
        ["bash", "-c", f"while true; do {server}; sleep 0.5; done"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (_ready(port) and listener_pid(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        first = listener_pid(port)
        assert first is not None and _ready(port), "the supervised server never became ready"
        out = tmp_path / "out"
        # the capacity pinned near what the MLP calibrates at (520-680 req/s): the load stays
        # 0.5x of it, and the run skips the probe (~6 s), which this test is not about
        r = subprocess.run(
            [sys.executable, "-m", "harness", "run", "crash_restart", "--quick"]
            + ["--target", f"http://127.0.0.1:{port}", "--sut-pid", str(first), "--out", str(out)]
            + ["--locust-arg=--capacity-rps=500"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        doc = json.loads((out / "results.json").read_text())
        sc = doc["scenarios"][0]
        tail = r.stdout[-1500:] + r.stderr[-1500:]
        (kill,) = [e for e in sc["chaos"] if e["action"] == "kill"]
        assert kill["ok"], kill
        d = kill["detail"]
        assert d["restarted_by"] == "supervisor" and d["found"] and d["gone"], d
        assert d["old_pid"] == first and d["new_pid"] == listener_pid(port) != first, d
        # the server's own start to ready, and the outage as the clients saw it
        assert 0 < d["time_to_ready_s"] <= d["recovery_s"], d
        # the sampler followed the new process (its pid file)
        retargets = json.loads(
            (out / "crash_restart" / "samples" / "sampler.json").read_text()
        ).get("retargets")
        assert retargets and retargets[-1]["pid"] == d["new_pid"], retargets
        checks = {c["id"]: c for c in sc["checks"]}
        for cid in ("crash.recovery_s", "crash.errors_after_ready", "crash.cold_penalty"):
            assert checks[cid]["passed"] is True, (checks[cid], tail)
        assert sc["verdict"] == "pass" and r.returncode == 0, (sc["checks"], tail)
    finally:
        os.killpg(loop.pid, signal.SIGKILL)  # the loop and the server it started
        loop.wait()


def test_an_attached_server_meets_the_kill_after_every_other_scenario() -> None:
    """Killed, a server started by hand stays dead: moved last, the kill costs only its own
    scenario, not the soak after it. A server the harness starts keeps the checklist's order."""
    from harness.acceptance.plan import CHECKLIST, kills_last

    attached = kills_last(CHECKLIST, attached=True)
    assert attached[-1] == "crash_restart"
    assert sorted(attached) == sorted(CHECKLIST)
    assert [s for s in attached if s != "crash_restart"] == [
        s for s in CHECKLIST if s != "crash_restart"
    ]
    assert CHECKLIST.index("soak") > CHECKLIST.index("crash_restart")  # what this changes
    assert kills_last(CHECKLIST, attached=False) == CHECKLIST
    assert kills_last(("crash_restart", "steady_state"), attached=True) == (
        "steady_state",
        "crash_restart",
    )
