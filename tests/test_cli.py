"""The ``harness`` command: exit codes, one-line errors, partial reports, re-rendering."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.checks import CHECK_IDS
from harness.sut import free_port

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SERVER = f"{sys.executable} -m harness_reference_server --model sim --port {{port}}"


def harness(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("harness: error: ")
    return lines[0]


def test_unknown_scenario_is_a_usage_error_naming_the_valid_ones():
    r = harness("run", "nosuch")
    assert r.returncode == 2
    line = one_line_error(r.stderr)
    assert "nosuch" in line and "steady_state" in line


def test_malformed_scenario_file_is_a_usage_error_naming_the_key():
    r = harness("run", str(DATA / "scenarios" / "bad" / "bad_rate.toml"))
    assert r.returncode == 2
    assert "rate" in one_line_error(r.stderr)


def test_bad_target_url_and_bad_checklist_are_usage_errors():
    r = harness("acceptance", "--target", "localhost:8000")
    assert r.returncode == 2
    assert "http://" in one_line_error(r.stderr)
    r = harness("run", "steady_state", "--checklist", str(DATA / "no_such_checklist.toml"))
    assert r.returncode == 2
    one_line_error(r.stderr)


def test_unknown_acceptance_subset_is_a_usage_error():
    r = harness("acceptance", "--scenarios", "steady_state,bogus")
    assert r.returncode == 2
    assert "bogus" in one_line_error(r.stderr)


def test_readme_lists_every_check_id():
    readme = (REPO / "README.md").read_text()
    missing = [cid for cid in CHECK_IDS if f"`{cid}`" not in readme]
    assert not missing, f"README's check table lacks {missing}"


def test_readme_names_every_packaged_scenario():
    scenarios = sorted(f.stem for f in (REPO / "scenarios").glob("*.toml"))
    readme = (REPO / "README.md").read_text()
    listed = readme.split("`SCENARIO` is a name from `scenarios/`", 1)[1].split(")", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", listed)) == scenarios
    guide_opening = (REPO / "docs" / "scenarios.md").read_text().split("\n\n")[1]
    assert sorted(re.findall(r"`(\w+)`", guide_opening.split("—")[1])) == scenarios


def test_locust_spellings_mean_the_same_as_the_harness_ones():
    from harness.cli import build_parser

    parser = build_parser()
    for command in (["run", "steady_state"], ["acceptance"], ["peak", "--slo-p99-ms", "100"]):
        args = parser.parse_args([*command, "--host", "http://127.0.0.1:9"])
        assert args.target == "http://127.0.0.1:9", command
    assert parser.parse_args(["sample", "--sut-pid", "7", "--out", "o"]).pid == 7
    assert parser.parse_args(["sample", "--pid", "7", "--out", "o"]).pid == 7


def test_everyday_load_options_reach_every_locust_run_of_run_and_acceptance():
    from harness.cli import build_parser
    from harness.cli.run import plan_request

    parser = build_parser()
    for command in (["run", "steady_state"], ["acceptance"]):
        args = parser.parse_args(
            [*command, "--seed", "7", "--capacity-rps", "450", "--request-timeout", "2.5"]
            + ["--locust-arg=--calibrate-s=9"]
        )
        req = plan_request(args, ("steady_state",), "out")
        assert req.locust_args == (
            "--seed",
            "7",
            "--capacity-rps",
            "450",
            "--request-timeout",
            "2.5",
            "--locust-arg=--calibrate-s=9"[len("--locust-arg=") :],
        ), command
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "steady_state", "--seed", "x"])  # the plugin's type


def test_locust_options_lists_every_plugin_option_with_its_environment_variable():
    import configargparse

    from harness.load.options import add_options

    parser = configargparse.ArgumentParser(add_help=False)
    add_options(parser)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings]
    r = harness("locust-options")
    assert r.returncode == 0, r.stderr
    missing = [f for f in flags if f not in r.stdout]
    assert not missing, missing
    assert "[env var: HARNESS_SCENARIO]" in " ".join(r.stdout.split())


@pytest.mark.slow
def test_unreachable_target_fails_with_the_cause_and_writes_a_report(tmp_path):
    port = free_port()  # nothing listens there
    r = harness(
        "run",
        str(DATA / "scenarios_load" / "short_open.toml"),
        "--target",
        f"http://127.0.0.1:{port}",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"127.0.0.1:{port}" in r.stdout + r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["verdict"] == "fail"
    assert (tmp_path / "junit.xml").exists() and (tmp_path / "summary.md").exists()


@pytest.mark.slow
def test_server_dying_mid_run_fails_with_the_cause_and_keeps_what_was_measured(tmp_path):
    # The server is SIGKILLed 6 s into a 60 s run: a crash, not a clean exit.
    cmd = f"timeout -s KILL 6 {SERVER}"
    r = harness(
        "run",
        str(DATA / "scenarios_load" / "long_open.toml"),
        "--sut-cmd",
        cmd,
        "--out",
        str(tmp_path),
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    sc = doc["scenarios"][0]
    assert doc["partial"] is True and sc["verdict"] == "fail"
    died = [c for c in sc["checks"] if c["id"] == "run.completed"]
    assert died and died[0]["passed"] is False and "exited" in died[0]["detail"]
    assert sc["counters"]["ok"] > 0  # what was measured before the crash is kept
    assert "run.completed" in (tmp_path / "junit.xml").read_text()


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_writes_a_partial_report_and_leaves_nothing_running(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(DATA / "scenarios_load" / "long_open.toml"),
            "--sut-cmd",
            SERVER,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress = tmp_path / "long_open" / "progress.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if progress.exists() and json.loads(progress.read_text() or "{}").get("ok", 0) > 50:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never made progress")
        sut_pid = int((tmp_path / "long_open" / "samples" / "sut.pid").read_text())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (1, 3), out + err  # interrupted: never a pass
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["partial"] is True
    assert doc["scenarios"][0]["counters"]["ok"] > 50
    assert (tmp_path / "report.html").exists()
    assert not psutil.pid_exists(sut_pid) or psutil.Process(sut_pid).status() == "zombie"


def test_report_rerenders_from_results_json_alone(tmp_path):
    shutil.copy(DATA / "results_v1.json", tmp_path / "results.json")
    r = harness("report", str(tmp_path))
    doc = json.loads((tmp_path / "results.json").read_text())
    assert r.returncode == {"pass": 0, "fail": 1, "invalid": 3}[doc["verdict"]]
    for name in ("report.html", "junit.xml", "summary.md"):
        assert (tmp_path / name).stat().st_size > 0


def test_report_on_a_directory_without_results_is_a_one_line_error(tmp_path):
    r = harness("report", str(tmp_path))
    assert r.returncode == 2
    assert "results.json" in one_line_error(r.stderr)


def test_compare_same_run_is_no_regression_and_other_machine_is_refused(tmp_path):
    base, new, other = tmp_path / "base", tmp_path / "new", tmp_path / "other"
    golden = json.loads((DATA / "results_v1.json").read_text())
    # the golden file also holds an invalid scenario, which compare reports as exit 3
    golden["scenarios"] = [s for s in golden["scenarios"] if s.get("verdict") != "invalid"]
    for d in (base, new, other):
        d.mkdir()
        (d / "results.json").write_text(json.dumps(golden))
    r = harness("compare", str(base), str(new))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"NO REGRESSION", r.stdout)
    doc = json.loads((other / "results.json").read_text())
    doc["machine"]["cpu_count"] = 64
    (other / "results.json").write_text(json.dumps(doc))
    r = harness("compare", str(base), str(other))
    assert r.returncode == 2
    assert "--force" in one_line_error(r.stderr)
    assert harness("compare", str(base), str(other), "--force").returncode in (0, 1)


def test_acceptance_pins_the_first_calibrated_capacity():
    from harness.acceptance import calibrated_capacity

    assert calibrated_capacity(None) is None
    pinned = {"scenarios": [{"name": "spike", "capacity_rps": 610.0, "calibration": None}]}
    assert calibrated_capacity(pinned) is None  # given, not measured: nothing new to pin
    measured = {"scenarios": [{"capacity_rps": 612.5, "calibration": {"capacity_rps": 612.5}}]}
    assert calibrated_capacity(measured) == 612.5


def test_version_prints_the_package_version() -> None:
    import contextlib
    import io

    from harness import __version__
    from harness.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and out.getvalue().strip() == f"harness {__version__}"


def test_judge_rejudges_results_under_another_checklist(tmp_path):
    """``harness judge DIR``: the end-of-run judging for results on disk (a killed run's,
    or a web UI run's); a stricter checklist turns a pass into a fail, in the file too."""
    from harness.testing.reference_document import build_document

    doc = build_document(seed=1, scenarios=["steady_state"])
    doc["scenarios"][0]["checks"], doc["scenarios"][0]["verdict"] = [], None
    (tmp_path / "results.json").write_text(json.dumps(doc))
    r = harness("judge", str(tmp_path))
    judged = json.loads((tmp_path / "results.json").read_text())
    assert r.returncode == 0 and judged["verdict"] == "pass", r.stdout + r.stderr
    assert r.stdout.strip().endswith("(exit 0)") and "PASS" in r.stdout
    assert all(
        (tmp_path / f).stat().st_size > 0 for f in ("report.html", "junit.xml", "summary.md")
    )
    strict = tmp_path / "strict.toml"
    strict.write_text('[checks]\n"steady.throughput" = { min_ratio = 1.5 }\n')
    r = harness("judge", str(tmp_path), "--checklist", str(strict))
    judged = json.loads((tmp_path / "results.json").read_text())
    assert r.returncode == 1 and judged["verdict"] == "fail", r.stdout + r.stderr
    tput = next(c for c in judged["scenarios"][0]["checks"] if c["id"] == "steady.throughput")
    offered = doc["scenarios"][0]["counters"]["scheduled"] / 40.0  # the arrivals drawn
    assert tput["passed"] is False, tput
    assert tput["threshold"] == pytest.approx(1.5 * offered, abs=1e-3), tput


def test_batch_size_and_input_data_reach_every_locust_run(tmp_path, monkeypatch):
    from harness.cli import build_parser
    from harness.cli.run import plan_request

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.json").write_text('{"data": [{"input": [1, 2, 3, 4]}]}')
    parser = build_parser()
    for command in (["run", "steady_state"], ["acceptance"]):
        args = parser.parse_args([*command, "--batch-size", "4", "--input-data", "data.json"])
        req = plan_request(args, ("steady_state",), "out")
        # the file as an absolute path: every Locust process reads the same one
        assert req.locust_args == ("--batch-size", "4", "--input-data", str(tmp_path / "data.json"))
    for bad in (["--batch-size", "0"], ["--input-data", "missing.json"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["run", "steady_state", *bad])  # the plugin's types


def test_the_sampler_command_starts_without_the_load_and_report_machinery():
    """``harness sample`` is the run's sampler, started 0.3 s before the load's t = 0: its
    command line builds its own parser only, so its first read comes before the load's
    first request (with every command's imports it came ~0.1-0.3 s after it)."""
    probe = (
        "import sys; from harness.cli import build_parser; "
        "build_parser('sample').parse_args(['sample', '--pid', '1', '--out', 'x']); "
        "import harness.collectors.runner; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('locust', 'scipy', 'matplotlib') or m.startswith(('harness.load', "
        "'harness.peak', 'harness.report', 'harness.locust_run')))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "", out
    # the whole parser still lists every command
    full = subprocess.run(
        [sys.executable, "-m", "harness", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for name in ("acceptance", "run", "sample", "peak", "tune", "agent", "report"):
        assert re.search(rf"^\s+{re.escape(name)}\s", full, re.M), (name, full)
