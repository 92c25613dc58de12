"""Runs that do not simply finish: interrupted, the server dies, the harness starts the server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.errors import ExitCode
from harness.testing.locust_runs import (
    REPO,
    SCENARIOS,
    balanced,
    hist,
    locust_cmd,
    run_locust,
    scenario_result,
    stop,
)
from harness.testing.server import scrape, start_server

# These load-mechanics scenarios list no check of their own (only the harness's
# bookkeeping, accounting.balanced): they judge nothing about the server, which is exit 4,
# never a pass (docs/checks.md, "Verdict").
NOT_JUDGED = ExitCode.NOT_JUDGED

pytestmark = pytest.mark.slow

SIM = ("--model", "sim", "--sim-base-ms", "2", "--sim-item-ms", "0.1")


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        locust_cmd("--headless", "--only-summary", *args),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 60.0) -> list[str]:
    """Read the process output until a line contains ``needle`` (the run is going)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen)[-3000:]}")


def test_sigterm_writes_partial_balanced_results(tmp_path) -> None:
    with start_server(*SIM) as srv:
        proc = _start(
            [
                "--host",
                srv.url,
                "--scenario",
                str(SCENARIOS / "long_open.toml"),
                "--out",
                str(tmp_path),
                "--no-sample",
            ]
        )
        try:
            _wait_for_line(proc, "All users spawned")
            _wait_served(srv.url, 50)
            os.kill(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            stop(proc)
    assert proc.returncode == 3, out[-3000:]
    sc = scenario_result(tmp_path)
    assert sc["partial"] is True
    c = sc["counters"]
    assert c["scheduled"] >= 50 and balanced(c)
    assert sc["duration_s"] < 40  # cut short, not the scenario's 60 s


def test_dead_server_stops_the_run_with_the_cause(tmp_path) -> None:
    with start_server(*SIM) as srv:
        proc = _start(
            [
                "--host",
                srv.url,
                "--scenario",
                str(SCENARIOS / "long_open.toml"),
                "--out",
                str(tmp_path),
                "--sut-pid",
                str(srv.pid),
                "--no-sample",
            ]
        )
        try:
            _wait_for_line(proc, "All users spawned")
            _wait_served(srv.url, 50)
            os.kill(srv.pid, signal.SIGKILL)
            srv.proc.wait(10)
            out, _ = proc.communicate(timeout=60)
        finally:
            stop(proc)
    assert proc.returncode == 1, out[-3000:]
    sc = scenario_result(tmp_path)
    assert sc["partial"] is True
    assert sc["sut_exit"] is not None and "exited" in sc["sut_exit"]["cause"]
    c = sc["counters"]
    assert balanced(c)
    assert c["failed"]["connection"] > 0  # requests sent to the dead server


def test_harness_started_server_calibrated_and_stopped(tmp_path) -> None:
    cmd = (
        f"{sys.executable} -m harness_reference_server --host 127.0.0.1 --port {{port}} "
        + " ".join(SIM)
    )
    run = run_locust(
        "--sut-cmd",
        cmd,
        "--scenario",
        str(SCENARIOS / "relative.toml"),
        "--out",
        str(tmp_path),
        "--no-sample",
        timeout=120,
    )
    assert run.returncode == NOT_JUDGED, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    assert sc["time_to_ready_s"] is not None and sc["time_to_ready_s"] > 0
    assert sc["capacity_rps"] > 0 and sc["calibration"]["ok"] > 0
    rate = sc["stages"][0]["rate_rps"]
    assert rate == pytest.approx(0.3 * sc["capacity_rps"])
    assert balanced(sc["counters"]) and sc["counters"]["scheduled"] > 0
    # the harness stopped the server it started
    import json

    pid = json.loads((tmp_path / "results.json").read_text())["sut"]["pid"]
    assert pid is not None
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _received(url: str) -> float:
    """Inference requests the server has received so far (its own counter)."""
    try:
        m = scrape(url)
    except OSError:
        return 0.0
    return sum(v for k, v in m.items() if k.endswith("_requests_received_total"))


def _wait_served(url: str, n: int, timeout: float = 30.0) -> None:
    """Wait until the load (not the golden fetch before it) has sent ``n`` requests."""
    start = _received(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _received(url) < start + n:
        time.sleep(0.2)


def test_chaos_pause_is_recorded_and_seen_by_the_open_loop(tmp_path) -> None:
    with start_server(*SIM) as srv:
        run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "pause.toml"),
            "--out",
            str(tmp_path),
            "--sut-pid",
            str(srv.pid),
            "--no-sample",
        )
    assert run.returncode == NOT_JUDGED, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    (event,) = sc["chaos"]
    assert event["action"] == "pause" and event["ok"] is True, event
    assert event["end_s"] - event["start_s"] >= 0.9
    assert balanced(sc["counters"])
    # requests due during the pause waited for it: the worst latency is about the pause,
    # while the median (most requests) is far below it
    h = hist(sc["latency_hdr"])
    assert h.get_max_value() >= 0.7 * 1e6
    assert h.get_value_at_percentile(50) < 0.2 * h.get_max_value()
    rows = [r for r in sc["windows"]["rows"] if r["ok"]]
    worst = max(rows, key=lambda r: r["max_ms"])
    assert 1.0 <= worst["t"] <= 3.0  # the slow window is the one the pause began in


def test_threads_sweep_restarts_the_server_per_stage(tmp_path) -> None:
    # sim batches cost 20 ms of sleep and hold one request: a thread serves ~50 req/s,
    # so two threads should serve about twice as much
    cmd = (
        f"{sys.executable} -m harness_reference_server --host 127.0.0.1 --port {{port}} --model sim "
        "--sim-base-ms 20 --sim-item-ms 0 --max-batch-size 1 --workers {threads}"
    )
    run = run_locust(
        "--sut-cmd",
        cmd,
        "--scenario",
        str(SCENARIOS / "linearity.toml"),
        "--out",
        str(tmp_path),
        "--no-sample",
        # both cores: a 1-core server has nothing to scale over and is refused up front
        "--sut-cores",
        "0-1",
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    assert [s["threads"] for s in sc["stages"]] == [1, 2]
    assert [s["users"] for s in sc["stages"]] == [2, 4]
    points = {p["n"]: p["throughput_rps"] for p in sc["linearity"]["points"]}
    assert set(points) == {1, 2}
    x1, x2 = points[1][0], points[2][0]
    assert x1 > 0 and x2 > 1.4 * x1, (x1, x2)
    assert balanced(sc["counters"])


def test_bad_input_spec_is_one_line_exit_2_with_results(tmp_path) -> None:
    with start_server(*SIM) as srv:
        run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "short_open.toml"),
            "--out",
            str(tmp_path),
            "--no-sample",
            "--input",
            "input:FLOAT:1,16",
        )
    assert run.returncode == 2, run.stdout[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if "harness:" in ln and "ERROR" in ln]
    assert len(lines) == 1 and "--input" in lines[0] and "FP32" in lines[0]
    assert "Traceback" not in run.stdout
    sc = scenario_result(tmp_path)
    assert sc["error"]["type"] == "ConfigError" and sc["partial"] is True
    assert sc["counters"]["scheduled"] == 0


def test_unreachable_target_exits_1(tmp_path) -> None:
    from harness.testing.server import free_port

    run = run_locust(
        "--host",
        f"http://127.0.0.1:{free_port()}",
        "--scenario",
        str(SCENARIOS / "short_open.toml"),
        "--out",
        str(tmp_path),
        "--no-sample",
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert scenario_result(tmp_path)["error"]["type"] == "TargetUnavailable"


@pytest.mark.parametrize("verify", [True, False], ids=["golden-fetch", "no-verify"])
def test_fresh_server_meets_the_load_cold(tmp_path, verify: bool) -> None:
    # slow-start: the server's first request pays 2 s of lazy init. The golden fetch would
    # have paid it; the harness restarts the server so the load's first requests do. With
    # --no-verify (and absolute rates: no calibration) nothing warmed it: started once.
    starts = tmp_path / "starts"
    server = (
        f"{sys.executable} -m harness_reference_server --host 127.0.0.1 --port {{port}} "
        + " ".join(SIM)
        + " --fault slow-start:2"
    )
    cmd = f"sh -c 'echo start >> {starts}; exec {server}'"
    run = run_locust(
        "--sut-cmd",
        cmd,
        "--scenario",
        str(SCENARIOS / "cold.toml"),
        "--out",
        str(tmp_path / "out"),
        "--no-sample",
        *(() if verify else ("--no-verify",)),
        timeout=120,
    )
    assert run.returncode == NOT_JUDGED, run.stdout[-3000:]
    sc = scenario_result(tmp_path / "out")
    assert sc["fresh_sut"] is True and sc["time_to_ready_s"] > 0
    assert starts.read_text().split() == ["start"] * (2 if verify else 1)
    first = hist(sc["first_requests"]["latency_hdr"])
    steady = hist(sc["by_stage"]["steady"]["default"]["latency_hdr"])
    assert first.get_max_value() > 10 * steady.get_value_at_percentile(99)
    assert balanced(sc["counters"])
