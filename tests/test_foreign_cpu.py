"""Another tenant on the run's cores makes the run invalid, not a failure of the server.

The sampler counts the CPU busy on the run's cores that none of the run's processes used
(``system.series.other_cpu_pct``) and names the busiest processes outside the run
(``system.foreign_processes``); ``validity`` calls the run invalid when that held
``foreign_max_pct`` of a core for ``foreign_sustain_s``. Real processes here: the run's
own busy child is the run's, a busy process outside its tree is foreign, a Locust worker
started by hand beside the master is adopted as the run's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.analysis.validity import foreign_cpu
from harness.checks.engine import validity, validity_margins
from harness.collectors.loop import TickLoop
from harness.collectors.samples import read_samples
from harness.collectors.system import SystemSampler, run_pids

BUSY = "while True: pass"
# the run's root: starts its own busy child (the run's work, like a CPU hog) and waits
RUN_ROOT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _sample(sampler: SystemSampler, seconds: float, interval: float = 0.5) -> list:
    loop = TickLoop(interval)
    t0 = loop.start()
    sampler.baseline(time.monotonic() - t0)
    ticks: list = []
    loop.run(lambda t, late: ticks.append(sampler.sample(t, 0.0)), seconds)
    sampler.close()
    return [t for t in ticks if t is not None]


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_cpu_outside_the_run_is_unattributed_and_named_the_runs_own_is_not(tmp_path):
    root = subprocess.Popen([sys.executable, "-c", RUN_ROOT], stdout=subprocess.PIPE, text=True)
    foreign = None
    child = int(root.stdout.readline())  # the root's busy child is up
    try:
        sampler = SystemSampler(tmp_path, loadgen_pids=None, run_pids=run_pids([root.pid]))
        quiet = _sample(sampler, 2.0)
        foreign = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
        sampler = SystemSampler(tmp_path / "busy", run_pids=run_pids([root.pid]))
        busy = _sample(sampler, 3.0)
    finally:
        _stop(root, *([foreign] if foreign else []))
        os.kill(child, 9)
    # the run's own busy child (a whole core) is not counted: only the rest of the box
    quiet_other = [t.other_cpu_pct for t in quiet]
    assert sorted(quiet_other)[len(quiet_other) // 2] < 30, quiet_other
    # a busy process outside the run shows as most of a core, and is named
    busy_other = [t.other_cpu_pct for t in busy[1:]]
    assert sum(busy_other) / len(busy_other) > 60, busy_other
    named = [p for t in busy for p in t.foreign_procs]
    assert any(pid == foreign.pid for pid, _, _ in named), named
    assert not any(pid == child for pid, _, _ in named)
    # written for the results: the series and who was busy
    system = read_samples(tmp_path / "busy")["system"]
    assert len(system["series"]["other_cpu_pct"]) == len(system["series"]["t"])
    assert any(r["pid"] == foreign.pid for r in system["foreign_processes"])


def test_a_process_the_run_starts_between_rescans_is_the_runs(tmp_path):
    """A hog the chaos timeline starts between two rescans: found at the next tick (the
    sampler rescans at once when the unattributed CPU jumps, and counts the whole CPU
    time of a process that started since the last tick), never reported as foreign."""
    sampler = SystemSampler(tmp_path, run_pids=run_pids([os.getpid()]), loadgen_every_s=60.0)
    hog: subprocess.Popen | None = None
    ticks: list = []

    def tick(t: float, late: float) -> None:
        nonlocal hog
        ticks.append((t, sampler.sample(t, 0.0)))
        if hog is None and t > 0.9:
            hog = subprocess.Popen([sys.executable, "-c", BUSY])  # the run's child

    try:
        loop = TickLoop(0.5)
        t0 = loop.start()
        sampler.baseline(time.monotonic() - t0)
        loop.run(tick, 3.5)
        sampler.close()
    finally:
        if hog is not None:
            _stop(hog)
    assert hog is not None
    after = [tk for t, tk in ticks if tk is not None and t > 1.2]
    assert not any(pid == hog.pid for tk in after for pid, _, _ in tk.foreign_procs)
    others = [tk.other_cpu_pct for tk in after]
    assert sorted(others)[len(others) // 2] < 30, others


def test_a_locust_worker_started_by_hand_is_adopted_as_the_runs_load(tmp_path):
    script = tmp_path / "locust"
    script.write_text(BUSY + "\n")
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = subprocess.Popen(
        [sys.executable, str(script), "--worker", "--master-host", "127.0.0.1"]
    )
    try:
        sampler = SystemSampler(tmp_path, run_pids=run_pids([root.pid]))
        ticks = _sample(sampler, 3.0)
    finally:
        _stop(root, worker)
    assert worker.pid in sampler._adopted
    # after the tick that found it, its CPU is the run's
    late = [t.other_cpu_pct for t in ticks[2:]]
    assert sorted(late)[len(late) // 2] < 30, late
    assert not any(pid == worker.pid for t in ticks[2:] for pid, _, _ in t.foreign_procs)


def test_the_server_restarted_by_its_own_supervisor_is_the_runs_before_the_sampler_follows(
    tmp_path,
):
    """An attached server killed and started again by its supervisor (not the run): until
    the sampler follows the new pid, the new process — same command line as the server it
    replaces — is the server, not another tenant."""
    script = tmp_path / "server.py"
    script.write_text(BUSY + "\n")
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    first = subprocess.Popen([sys.executable, str(script), "--port", "1"])
    again: int | None = None
    try:
        sampler = SystemSampler(
            tmp_path,
            run_pids=run_pids([root.pid], sut=lambda: [first.pid]),
            sut_pid=lambda: first.pid,
        )
        loop = TickLoop(0.5)
        t0 = loop.start()
        sampler.baseline(time.monotonic() - t0)
        ticks: list = []

        def tick(t: float, late: float) -> None:
            nonlocal again
            ticks.append((t, sampler.sample(t, 0.0)))
            if again is None and t > 0.9:
                _stop(first)  # the crash; a supervisor (no process of the run) restarts it
                out = subprocess.run(
                    ["sh", "-c", f"{sys.executable} {script} --port 1 >/dev/null 2>&1 & echo $!"],
                    capture_output=True,
                    text=True,
                )
                again = int(out.stdout)

        loop.run(tick, 4.0)
        sampler.close()
    finally:
        _stop(root, first)
        if again is not None:
            os.kill(again, 9)
    assert again is not None and again in sampler._adopted
    after = [tk for t, tk in ticks if tk is not None and t > 2.0]
    assert not any(pid == again for tk in after for pid, _, _ in tk.foreign_procs)
    others = [tk.other_cpu_pct for tk in after]
    assert sorted(others)[len(others) // 2] < 30, others


def _result(other: list[float | None], foreign: list[dict] | None = None) -> dict:
    t = [float(i + 1) for i in range(len(other))]
    return {
        "system": {
            "series": {"t": t, "cpu_pct": [50.0] * len(t), "other_cpu_pct": other},
            "foreign_processes": foreign or [],
        }
    }


def test_foreign_cpu_held_for_the_sustain_makes_the_run_invalid_and_names_who():
    # the fresh-clone run that failed: a foreign process took ~0.7 core for 4 s
    other = [12.0] * 25 + [66.0, 68.0, 86.0, 58.0] + [14.0] * 10
    rows = [{"t": 26.0 + i, "pid": 4242, "name": "python3", "cpu_pct": 60.0} for i in range(4)]
    reasons = validity(_result(other, rows))
    assert len(reasons) == 1 and "not the run's" in reasons[0], reasons
    assert "pid 4242 (python3)" in reasons[0] and "t = 26-29 s" in reasons[0]
    held, limit = validity_margins(_result(other))["foreign_cpu_pct"]
    assert held == 66.0 and limit == 50.0


def test_foreign_cpu_short_or_low_is_not_invalid():
    # two hot ticks (a `git status`), or a steady 35 % (the kernel's work, the
    # hypervisor's steal and the quantised clock at 600 req/s reached that)
    assert validity(_result([10.0] * 10 + [90.0, 90.0] + [10.0] * 10)) == []
    assert validity(_result([35.0] * 40)) == []
    # a missing tick breaks a stretch, as for the generator's saturation
    assert validity(_result([60.0, 60.0, None] * 6)) == []
    # results recorded before the series existed: nothing to judge, no reason
    r = _result([90.0] * 10)
    del r["system"]["series"]["other_cpu_pct"]
    assert validity(r) == []


def test_foreign_cpu_limits_come_from_the_checklist():
    other = [55.0] * 10
    assert validity(_result(other))  # 55 >= 50 for 10 s
    assert validity(_result(other), {"validity": {"foreign_max_pct": 60}}) == []
    assert validity(_result(other), {"validity": {"foreign_sustain_s": 20}}) == []
    msg = foreign_cpu([1.0, 2.0, 3.0, 4.0], [45.0] * 4, max_pct=40, sustain_s=3)
    assert msg and "no single process stood out" in msg


def test_the_system_csv_has_the_unattributed_column(tmp_path: Path):
    sampler = SystemSampler(tmp_path, run_pids=run_pids([os.getpid()]))
    _sample(sampler, 1.0)
    header = (tmp_path / "system.csv").read_text().splitlines()[0].split(",")
    assert header[-1] == "other_cpu_pct"


@pytest.mark.slow
def test_a_run_sharing_its_cores_with_another_tenant_is_invalid_and_says_who(tmp_path):
    """A real run: a busy process the harness did not start (a build job, another test)
    takes most of a core for 10 s mid-run. The run is invalid, its reason names that
    process, and its samples are kept; the scenario runs again once the tenant has gone,
    and the second attempt is the one judged. The healthy control under the same conditions is
    every other real run in the suite: the quick acceptance run (all eight scenarios) and
    the detection matrix's runs must be valid, so this rule firing on a quiet machine
    would fail them."""
    out = tmp_path / "run"
    sut = f"{sys.executable} -m reference_server --port {{port}} --workers 1"
    harness = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "run", "steady_state", "--quick"),
            *("--duration", "20", "--sut-cmd", sut, "--out", str(out)),
            "--locust-arg=--capacity-rps=300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tenant = None
    try:
        # under load: the scenario's live progress shows the run's clock
        progress = out / "steady_state" / "progress.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and harness.poll() is None:
            try:
                if json.loads(progress.read_text()).get("elapsed_s", 0) >= 3:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        tenant = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nt = time.time()\nwhile time.time() - t < 10: pass",
            ],
            start_new_session=True,
        )
        output, _ = harness.communicate(timeout=180)
    finally:
        for p in (harness, *([tenant] if tenant else [])):
            if p.poll() is None:
                p.kill()
            p.wait()
    # attempt 1: invalid, its reason names the tenant; kept whole beside the scenario's
    first = json.loads((out / "steady_state.attempt-1" / "results.json").read_text())
    sc1 = first["scenarios"][0]
    assert sc1["verdict"] == "invalid", (sc1["verdict"], sc1.get("validity"), output[-2000:])
    reasons = [r for r in sc1["validity"] if "not the run's" in r]
    assert reasons and f"pid {tenant.pid} " in reasons[0], sc1["validity"]
    # what was measured is kept: the server's series and the foreign process's rows
    assert len(sc1["server"]["series"]["t"]) >= 15
    assert any(r["pid"] == tenant.pid for r in sc1["system"]["foreign_processes"])
    # a disturbance, so the scenario ran again (--retry-invalid 1, the default) once the
    # tenant had gone: the kept result is the second attempt's, and it names the first
    doc = json.loads((out / "results.json").read_text())
    sc = doc["scenarios"][0]
    (attempt,) = sc["attempts"]
    assert attempt["dir"] == "steady_state.attempt-1" and attempt["validity"] == sc1["validity"]
    assert not any(tenant.pid == r["pid"] for r in sc["system"].get("foreign_processes") or [])
    assert sc["verdict"] == "pass" and harness.returncode == 0, (
        sc["verdict"],
        sc.get("validity"),
        output[-2000:],
    )
    assert "attempt 1 was invalid and was run again" in (out / "summary.md").read_text()
