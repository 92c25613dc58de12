"""Run ``locust -f locustfiles/inference.py`` as real subprocesses, stopped by pid.

Paths are the source checkout's (the locustfile and the test scenarios under tests/data):
these helpers run from a clone, as the tests and the benchmarks do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = str(REPO / "locustfiles" / "inference.py")
SCENARIOS = REPO / "tests" / "data" / "scenarios_load"
# relaxes only the dispatch-lag validity limit; see the file's header
MECHANICS_CHECKLIST = str(SCENARIOS / "mechanics_checklist.toml")


def locust_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", LOCUSTFILE, *args]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM by pid, then SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def run_locust(*args: str, timeout: float = 90.0, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """A headless run to completion (stopped by pid if it overruns), judged with the
    mechanics checklist unless the test names its own."""
    if "--checklist" not in args:
        args = (*args, "--checklist", MECHANICS_CHECKLIST)
    proc = subprocess.Popen(
        locust_cmd("--headless", "--only-summary", *args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"locust overran {timeout} s:\n{out[-4000:]}") from None
    finally:
        stop(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def shipped_scenario_with(name: str, line: str, instead: str, out: Path) -> Path:
    """scenarios/NAME.toml with its one ``line`` replaced by ``instead`` (everything else
    as shipped), written to ``out``/NAME.toml; fails if the shipped file no longer holds
    ``line`` exactly once (the test's reason for the change would be stale)."""
    text = (REPO / "scenarios" / f"{name}.toml").read_text()
    assert text.count(line) == 1, f"scenarios/{name}.toml no longer has {line!r} once"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.toml"
    path.write_text(text.replace(line, instead))
    return path


def scenario_result(out_dir: Path) -> dict[str, Any]:
    doc = json.loads((out_dir / "results.json").read_text())
    assert doc["schema"] == "harness.results/1"
    assert len(doc["scenarios"]) == 1
    return doc["scenarios"][0]


def hist(encoded: str | None) -> HdrHistogram:
    h = HdrHistogram(1, 60_000_000, 3)
    if encoded:
        h.decode_and_add(encoded)
    return h


def balanced(counters: dict[str, Any]) -> bool:
    failed = sum(counters["failed"].values())
    return (
        counters["scheduled"]
        == counters["ok"] + failed + counters["dropped"] + counters["in_flight"]
    )
