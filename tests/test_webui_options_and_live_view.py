"""The web UI's parts below the browser: Locust's -t/-u/-r against a scenario, the start
form's text typed like argparse, run directories that never overwrite, the live view's
reading of sampler files being written, and the tab's rows."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from werkzeug.datastructures import MultiDict

import harness.load.plugin  # noqa: F401 (registers the harness options on Locust's parser)
from harness.errors import ConfigError
from harness.load import webui
from harness.load.controller import next_run_dir
from harness.load.live import _tail_rows, server_now
from harness.load.options import options_from
from harness.testing.locust_runs import REPO, locust_cmd


def _parsed(*argv: str) -> Any:
    from locust.argument_parser import get_parser

    return get_parser().parse_args(["-f", "locustfiles/inference.py", *argv])


def test_run_time_is_the_scenarios_length() -> None:
    assert options_from(_parsed("-t", "45s")).duration_s == 45.0
    assert options_from(_parsed("-t", "2m", "--duration", "120")).duration_s == 120.0
    with pytest.raises(ConfigError, match=r"-t/--run-time 30 s and --duration 40 s disagree"):
        options_from(_parsed("-t", "30", "--duration", "40"))


@pytest.mark.parametrize(("flag", "shown"), [("-u", "-u/--users 3"), ("-r", "-r/--spawn-rate 3")])
def test_users_and_spawn_rate_are_refused_with_the_reason(flag: str, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        options_from(_parsed(flag, "3"))
    msg = str(info.value)
    assert msg.startswith(shown) and "--closed-loop USERS" in msg and "\n" not in msg


def test_users_refused_by_a_real_locust_in_one_line() -> None:
    proc = subprocess.run(
        locust_cmd("--headless", "-u", "5", "--scenario", "steady_state"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    said = [ln for ln in proc.stderr.splitlines() if "harness:" in ln]
    assert len(said) == 1 and "-u/--users 5 does not apply" in said[0], proc.stderr[-2000:]


def test_form_text_is_typed_like_argparse_and_bad_text_names_the_option() -> None:
    parsed = _parsed()
    parsed.sut_pid, parsed.seed, parsed.duration, parsed.model = "4321", " 7 ", "", ""
    opts = options_from(parsed, form=True)
    assert (opts.sut_pid, opts.seed, opts.duration_s, opts.model) == (4321, 7, None, None)
    parsed.capacity_rps = "fast"
    with pytest.raises(ConfigError, match=r"--capacity-rps has value 'fast'; expected a number"):
        options_from(parsed, form=True)
    # the form's greyed-out user count arrives as 0: not a -u
    parsed = _parsed()
    parsed.num_users, parsed.spawn_rate = 0, 0.0
    assert options_from(parsed, form=True).scenario == "steady_state"


def test_run_dirs_never_overwrite(tmp_path: Path) -> None:
    assert next_run_dir(tmp_path / "missing") == tmp_path / "missing" / "run-1"
    for name in ("run-1", "run-3", "run-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "run-9").write_text("a file, not a run")
    assert next_run_dir(tmp_path) == tmp_path / "run-4"


def test_tail_rows_skip_a_row_being_written_and_one_the_window_cut(tmp_path: Path) -> None:
    path = tmp_path / "process.csv"
    rows = "".join(f"{t},{t * 10}\n" for t in range(1000))
    path.write_text("t,rss_bytes\n" + rows + "1000,99")  # the sampler is mid-row
    got = _tail_rows(path, max_bytes=200)
    assert got[-1] == {"t": "999", "rss_bytes": "9990"}
    ts = [int(r["t"]) for r in got]
    assert ts == list(range(ts[0], 1000)) and len(got) < 1000  # whole rows only
    assert _tail_rows(tmp_path / "none.csv") == []


def test_server_now_is_the_last_tick_and_its_busy_threads(tmp_path: Path) -> None:
    from harness.collectors.process import PROCESS_COLUMNS, THREAD_COLUMNS

    def line(cols: list[str], **kw: Any) -> str:
        return ",".join(str(kw.get(c, 0)) for c in cols) + "\n"

    (tmp_path / "process.csv").write_text(
        ",".join(PROCESS_COLUMNS)
        + "\n"
        + line(PROCESS_COLUMNS, t=1, rss_bytes=2**20, threads=3, fds=5, cpu_pct=10)
        + line(PROCESS_COLUMNS, t=2, rss_bytes=3 * 2**20, threads=4, fds=6, cpu_pct=20)
    )
    (tmp_path / "threads.csv").write_text(
        ",".join(THREAD_COLUMNS)
        + "\n"
        + line(THREAD_COLUMNS, t=1, tid=11, name="old", cpu_pct=99)
        + line(THREAD_COLUMNS, t=2, tid=12, name="idle", cpu_pct=0)
        + line(THREAD_COLUMNS, t=2, tid=13, name="worker", cpu_pct=70, usr_pct=65)
        + line(THREAD_COLUMNS, t=2, tid=14, name="io", cpu_pct=5)
    )
    now = server_now(tmp_path)
    assert now is not None
    assert (now["t"], now["rss_mib"], now["threads"], now["fds"]) == (2.0, 3.0, 4.0, 6.0)
    assert [t["name"] for t in now["top_threads"]] == ["worker", "io"]
    assert server_now(tmp_path / "nothing") is None


def _snap(judged: bool, passed: bool | None) -> dict[str, Any]:
    check = {
        "id": "integrity.mismatches",
        "value": 12,
        "unit": "responses",
        "op": "<=",
        "threshold": 0,
        "n": 3000,
        "state": ("FAIL" if passed is False else "pass") if judged else "pending",
        "so_far": None if judged else passed,
        "detail": "",
    }
    if judged:
        check["state"] = {True: "pass", False: "fail", None: "not judged"}[passed]
    return {
        "run": {
            "name": "run-2",
            "dir": "/x/run-2",
            "state": "judged" if judged else "running",
            "scenario": "integrity",
            "mode": "quick",
            "elapsed_s": 5.0,
            "total_s": 8.0,
            "judged": judged,
            "verdict": "fail" if judged else None,
        },
        "stages": [
            {"name": "low", "start_s": 0, "end_s": 3, "load": "open", "state": "done"},
            {"name": "high", "start_s": 3, "end_s": 8, "load": "open", "state": "now"},
        ],
        "checks": [check],
        "chaos": [
            {"action": "cpu_hog", "at_s": 4, "start_s": 4.01, "end_s": None, "state": "applied"}
        ],
        "validity": ["dispatch lag p99 60 ms"],
        "server": None,
        "runs": [{"name": "run-1", "line": "PASS — …", "verdict": "pass", "exit_code": 0}],
    }


def test_tab_rows_say_pending_with_the_side_so_far_then_the_verdict() -> None:
    rows = webui.table_rows(_snap(judged=False, passed=False))
    assert [r["section"] for r in rows] == [
        "run", "stage", "stage", "check", "chaos", "validity", "runs",
    ]  # fmt: skip
    check = rows[3]
    assert (check["item"], check["value"], check["limit"], check["n"]) == (
        "integrity.mismatches", "12 responses", "<= 0", "3000",
    )  # fmt: skip
    assert check["state"] == "pending (so far outside)"
    assert rows[2]["state"] == "◀ now" and rows[5]["state"] == "so far"
    judged = webui.table_rows(_snap(judged=True, passed=False))
    assert judged[0]["state"] == "FAIL" and judged[3]["state"] == "FAIL"


class _Lifecycle:
    def __init__(self, state: Any) -> None:
        self.state = state


class _State:
    def __init__(self, state: Any) -> None:
        self.lifecycle = _Lifecycle(state)
        self.judging = None


class _Env:
    def __init__(self) -> None:
        self.parsed_options = _parsed("--scenario", "integrity")


def test_start_form_is_refused_with_the_command_lines_error_or_while_a_run_goes() -> None:
    from harness.load.lifecycle import RunState

    idle, env = _State(RunState.IDLE), _Env()
    assert webui.refuse_start(env, idle, MultiDict({"duration": "8"})) is None
    said = webui.refuse_start(env, idle, MultiDict({"duration": "soon"}))
    assert said == "--duration has value 'soon'; expected a number"
    said = webui.refuse_start(env, idle, MultiDict({"scenario": "no_such_scenario"}))
    assert said is not None and "no_such_scenario" in said
    for going in (RunState.RUNNING, RunState.DRAINING, RunState.WRITTEN):
        said = webui.refuse_start(env, _State(going), MultiDict({}))
        assert said is not None and said.startswith(f"a run is going ({going.value})")
    assert env.parsed_options.duration is None  # checking the form changed nothing


@pytest.mark.slow
def test_a_headless_run_with_t_lasts_that_long(tmp_path: Path) -> None:
    """``-t 6s`` on a real headless run: the scenario's stages are scaled to 6 s, and the
    results say so (Locust alone would ignore -t for a load shape)."""
    import sys

    from harness.testing.locust_runs import run_locust, scenario_result

    server = f"{sys.executable} -m harness_reference_server --model mlp --port {{port}} --workers {{threads}}"
    # the capacity pinned (the reference MLP calibrates at 520-680 req/s): -t is what this
    # proves, not the probe, which would add ~6 s before the stages
    proc = run_locust(
        "-t", "6s", "--scenario", "integrity", "--quick", "--out", str(tmp_path),
        "--sut-cmd", server, "--capacity-rps", "300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    sc = scenario_result(tmp_path)
    assert sc["stages"][-1]["end_s"] == pytest.approx(6.0, abs=0.01), sc["stages"]
    assert "run-time" in proc.stdout and "scenario's length" in proc.stdout
