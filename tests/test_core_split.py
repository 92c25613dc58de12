"""The server the harness starts and its load generator run on different cores.

``harness.locust_run.core_split`` picks them (``--sut-cores`` as given, else the default
split); ``harness run``/``acceptance`` pin the Locust process to the generator's cores and
tell it the server's; ``harness peak`` does the same for its points. The real runs are in
tests/test_acceptance_e2e.py (the quick checklist: the server's and the generator's
recorded cores are disjoint) and here (one real Locust process's affinity).
"""

from __future__ import annotations

import os
import sys

import pytest

from harness import cli, locust_run
from harness.cli.run import plan_from
from harness.locust_run import core_split


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr("harness.sut.cores.available_cores", lambda: (0, 1, 2, 3))


def test_the_default_split_and_a_given_one(four_cores) -> None:
    assert core_split(None) == ((2, 3), (0, 1))
    assert core_split("3") == ((3,), (0, 1, 2))
    assert core_split("0,2") == ((0, 2), (1, 3))
    # every core to the server: shared with the generator, nothing pinned
    assert core_split("0-3") is None


def test_one_core_is_shared(monkeypatch) -> None:
    monkeypatch.setattr("harness.sut.cores.available_cores", lambda: (0,))
    assert core_split(None) is None and core_split("0") is None


def _plan(argv: list[str]):
    parser = cli.build_parser()
    args = parser.parse_args(["run", "steady_state", *argv])
    return plan_from(args, (args.scenario,), "out")


def test_run_pins_the_generator_and_tells_locust_the_servers_cores(four_cores) -> None:
    plan = _plan(["--quick"])
    assert plan.loadgen_cores == (0, 1)
    assert plan.extra_args[-2:] == ("--sut-cores", "2,3")
    given = _plan(["--quick", "--sut-cores", "1"])
    assert given.loadgen_cores == (0, 2, 3)
    assert list(given.extra_args).count("--sut-cores") == 1
    # a server on every core, a server the harness did not start: not pinned
    assert _plan(["--quick", "--sut-cores", "0-3"]).loadgen_cores is None
    attached = _plan(["--quick", "--target", "http://127.0.0.1:8000"])
    assert attached.loadgen_cores is None and "--sut-cores" not in attached.extra_args


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to split")
def test_beside_an_attached_server_the_generator_takes_the_cores_it_leaves(tmp_path) -> None:
    """--target --sut-pid on this host: the generator is pinned to the cores the server's
    affinity leaves free; a server that may run on every core is not pinned against."""
    import subprocess

    cores = sorted(os.sched_getaffinity(0))
    pinned = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cores[-1]}),
    )
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:

        def plan(pid: int):
            return _plan(["--quick", "--target", "http://127.0.0.1:8000", "--sut-pid", str(pid)])

        assert plan(pinned.pid).loadgen_cores == tuple(cores[:-1])
        assert plan(free.pid).loadgen_cores is None
        # told nothing of the server's cores: the Locust process reads its affinity
        assert "--sut-cores" not in plan(pinned.pid).extra_args
    finally:
        for p in (pinned, free):
            p.kill()
            p.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to split")
def test_the_locust_process_runs_on_the_generators_cores(tmp_path, monkeypatch) -> None:
    """run_one's child (here a stand-in for Locust that prints its own affinity) gets the
    plan's generator cores before it execs, so every thread it starts inherits them."""
    monkeypatch.setattr(
        locust_run,
        "scenario_argv",
        lambda settings, name, out: [
            sys.executable,
            "-c",
            "import os; print(sorted(os.sched_getaffinity(0)))",
        ],
    )
    cores = (min(os.sched_getaffinity(0)),)
    settings = locust_run.RunSettings(
        target=locust_run.Target(url="http://127.0.0.1:1"), loadgen_cores=cores
    )
    stop = locust_run.StopFlag()
    run = locust_run.run_one(settings, tmp_path, "steady_state", 1, 1, stop, lambda s: None)
    assert run.returncode == 0
    assert (tmp_path / "steady_state" / "locust.log").read_text().strip() == str(list(cores))
