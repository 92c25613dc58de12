"""The run lifecycle is a checked state machine, master/worker messages are
declared once, and a worker's error crosses the wire as its exit code.

Fast and in-process: the Locust runners are stand-ins (subclasses, so the plugin's
``isinstance`` role checks see a master or a worker) that record what would be sent.
The real distributed run is tests/test_locust_distributed.py (slow).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import pytest
from locust.rpc.protocol import Message
from locust.runners import MasterRunner, WorkerRunner

from harness import sut
from harness.errors import ConfigError, ExitCode, ResultFormatError, TargetUnavailable
from harness.finish import exit_code_for
from harness.load import distribution, plugin
from harness.load.controller import HarnessState
from harness.load.lifecycle import IllegalTransition, Lifecycle, RunState
from harness.load.options import Options
from harness.load.recording import Recording
from harness.load.users import Plan
from harness.load.wire import (
    ErrorInfo,
    FinalMessage,
    FinishMessage,
    PlanMessage,
    ReportMessage,
    WireFormatError,
)

SCENARIO = Path(__file__).parent / "data" / "scenarios_load" / "short_constant.toml"
S = RunState


def options(tmp_path: Path, **changes: Any) -> Options:
    opts = Options(
        scenario=str(SCENARIO),
        mode="quick",
        model=None,
        sut_pid=None,
        sut_cmd=None,
        sut_cores=None,
        out=str(tmp_path),
        inputs=("x:FP32:4",),
        sample_request=None,
        closed_loop_users=None,
        seed=None,
        max_in_flight=None,
        calibrate_s=None,
        capacity_rps=None,
        request_timeout_s=None,
        ready_timeout_s=60.0,
        sample=False,
        verify=True,
        duration_s=None,
        checklist=None,
    )
    return replace(opts, **changes)


def plan(slot: int = 0, slots: int = 1) -> Plan:
    return Plan(
        origin_unix=1_764_489_600.5,
        slot=slot,
        slots=slots,
        base_url="http://127.0.0.1:8000",
        model="mlp",
        capacity_rps=None,
        inputs=[[{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]],
        golden={"outputs": [[1.0, 2.0]], "tolerance": 1e-5, "numeric": True},
    )


def over_locust_wire(name: str, payload: Any) -> Any:
    """What the other process receives: Locust's msgpack framing, both ways."""
    return Message.unserialize(Message(name, payload, "node").serialize()).data


class FakeMaster(MasterRunner):
    def __init__(self) -> None:  # no sockets: only what the harness calls
        self.sent: list[tuple[str, Any, str | None]] = []
        self.stops = 0
        self.greenlet = None

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent.append((msg_type, data, client_id))

    def stop(self, send_stop_to_client: bool = True) -> None:
        self.stops += 1


class FakeWorker(WorkerRunner):
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.greenlet = None

    def send_message(self, msg_type: str, data: Any = None, client_id: str | None = None) -> None:
        self.sent.append((msg_type, data))


def environment(runner: Any) -> SimpleNamespace:
    return SimpleNamespace(
        runner=runner,
        host="http://127.0.0.1:8000",
        events=SimpleNamespace(request=SimpleNamespace(fire=lambda **_: None)),
        parsed_options=None,
        process_exit_code=None,
    )


# -- the state machine -------------------------------------------------------------------


def test_master_lifecycle_walks_a_complete_run_and_a_web_ui_restart() -> None:
    lc = Lifecycle.master()
    for state in (S.PREPARING, S.READY, S.RUNNING, S.COMPLETED, S.DRAINING, S.WRITING):
        lc.advance(state)
    lc.advance(S.WRITTEN)
    assert lc.reached(S.COMPLETED)
    lc.advance(S.PREPARING)  # the web UI's next start: a new run, its own history
    assert lc.state is S.PREPARING and not lc.reached(S.COMPLETED)
    lc.advance(S.FAILED)
    lc.advance(S.DRAINING)  # a failed preparation still writes results carrying the error
    lc.advance(S.WRITING)
    lc.advance(S.WRITTEN)
    lc.advance(S.JUDGED)
    assert lc.history[-1] is S.JUDGED
    lc.advance(S.PREPARING)  # the web UI judges each run before the next start
    assert lc.state is S.PREPARING


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ((), S.RUNNING),  # no load before preparation
        ((S.PREPARING, S.READY, S.RUNNING), S.WRITTEN),  # no results before draining
        ((S.PREPARING, S.FAILED), S.RUNNING),  # a failed preparation never runs
        ((S.PREPARING, S.READY, S.RUNNING, S.DRAINING), S.DRAINING),  # finalised once
        ((S.PREPARING, S.READY, S.ABORTED), S.COMPLETED),  # an aborted run is not complete
        ((S.PREPARING, S.READY, S.DRAINING, S.WRITING, S.WRITTEN, S.JUDGED), S.DRAINING),
    ],
)
def test_master_lifecycle_refuses_an_illegal_transition_naming_both_states(
    path: tuple[RunState, ...], illegal: RunState
) -> None:
    lc = Lifecycle.master()
    for state in path:
        lc.advance(state)
    before = lc.state
    with pytest.raises(IllegalTransition) as info:
        lc.advance(illegal)
    assert f"{before.value!r}" in str(info.value) and f"{illegal.value!r}" in str(info.value)
    assert "master" in str(info.value)
    assert lc.state is before  # refused: nothing moved
    assert lc.advance_if(illegal) is False and lc.state is before


def test_worker_lifecycle_reports_once_per_plan() -> None:
    lc = Lifecycle.worker()
    lc.advance(S.READY)
    lc.advance(S.DRAINING)
    lc.advance(S.REPORTED)
    assert not lc.can(S.DRAINING) and not lc.can(S.REPORTED)  # one final per plan
    lc.advance(S.READY)  # a new plan
    lc.advance(S.FAILED)  # a plan it could not use: the error was its final
    assert not lc.can(S.DRAINING)
    with pytest.raises(IllegalTransition, match="worker run lifecycle: cannot go from 'failed'"):
        lc.advance(S.REPORTED)
    with pytest.raises(IllegalTransition):
        Lifecycle.worker().advance(S.WRITTEN)  # a worker writes no results


def test_recordings_merge_from_preparation_until_the_recording_closes(tmp_path: Path) -> None:
    """Plans go out while preparing, so a worker's delta may arrive before ``ready``; the
    side tasks' greenlets, spawned while preparing, must see the run as live too."""
    state = HarnessState(environment(FakeMaster()), options(tmp_path))
    delta = Recording(1.0, 10).drain(0.0)
    state.merge("w-1", delta, 1.0)
    assert state.cpu_by_source == {}  # idle: no run to merge into
    state.lifecycle.advance(S.PREPARING)
    state.merge("w-1", delta, 1.0)
    assert state.cpu_by_source == {"w-1": 1.0}
    for s in (S.READY, S.RUNNING, S.COMPLETED, S.DRAINING):
        state.lifecycle.advance(s)
        state.merge("w-1", delta, 2.0)
        assert state.cpu_by_source == {"w-1": 2.0}
        state.cpu_by_source.clear()
    state.lifecycle.advance(S.WRITING)
    state.merge("w-1", delta, 3.0)
    assert state.cpu_by_source == {}  # closed: the results are being written


# -- wire messages -----------------------------------------------------------------------


def test_plan_message_round_trips_through_locusts_framing(tmp_path: Path) -> None:
    msg = PlanMessage(plan(1, 2), options(tmp_path), sut_cores_n=2)
    back = PlanMessage.from_wire(over_locust_wire(PlanMessage.NAME, msg.to_wire()))
    assert back == msg
    assert isinstance(back.options.inputs, tuple)


def test_final_report_and_finish_messages_round_trip() -> None:
    delta = {"scheduled": 3, "complete_through": 4}
    for final in (
        FinalMessage(recording=delta, cpu_s=1.5),
        FinalMessage(error=ErrorInfo(ExitCode.USAGE, "ResultFormatError", "worker: bad")),
        FinalMessage(),
    ):
        assert FinalMessage.from_wire(over_locust_wire(FinalMessage.NAME, final.to_wire())) == final
    report = ReportMessage(delta, 0.25)
    assert ReportMessage.from_wire(over_locust_wire("stats", report.to_wire())) == report
    conns = {"host": "b/net:[1]", "pid": 7, "sent": 100.0, "readings": [[99.0, 3], [100.0, 4]]}
    report = ReportMessage(delta, 0.25, conns)
    assert ReportMessage.from_wire(over_locust_wire("stats", report.to_wire())) == report
    assert FinishMessage.from_wire(over_locust_wire(FinishMessage.NAME, None)) == FinishMessage()


@pytest.mark.parametrize(
    ("cls", "payload", "says"),
    [
        (FinalMessage, {"recording": None, "cpu_s": None, "conns": None}, "missing ['error']"),
        (
            FinalMessage,
            {"recording": None, "cpu_s": None, "error": None, "conns": None, "x": 1},
            "unknown ['x']",
        ),
        (
            FinalMessage,
            {"recording": None, "cpu_s": None, "error": None, "conns": {"host": "h"}},
            "[time, count] readings",
        ),
        (FinalMessage, [1, 2], "list payload"),
        (ReportMessage, {"recording": "abc", "cpu_s": 1.0, "conns": None}, "str recording"),
        (ErrorInfo, {"code": 99, "kind": "X", "message": "m"}, "code 99"),
        (FinishMessage, {"now": True}, "it has no fields"),
    ],
)
def test_a_malformed_message_is_a_clear_usage_error(cls: Any, payload: Any, says: str) -> None:
    with pytest.raises(WireFormatError, match=r"same harness version|ExitCode") as info:
        cls.from_wire(payload)
    assert says in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE


def test_a_plan_with_a_missing_field_names_the_message_and_the_field(tmp_path: Path) -> None:
    wire = PlanMessage(plan(), options(tmp_path), 1).to_wire()
    del wire["plan"]["golden"]
    wire["options"]["colour"] = "blue"
    with pytest.raises(WireFormatError, match=r"harness_plan plan message.*missing \['golden'\]"):
        PlanMessage.from_wire(wire)
    wire["plan"]["golden"] = None
    with pytest.raises(
        WireFormatError, match=r"harness_plan options message.*unknown \['colour'\]"
    ):
        PlanMessage.from_wire(wire)


# -- errors cross the wire as codes --------------------------------------------------------


def test_error_info_carries_the_exit_code_errors_py_declares() -> None:
    for exc, code in (
        (ResultFormatError("bad results"), ExitCode.USAGE),
        (ConfigError("bad option"), ExitCode.USAGE),
        (TargetUnavailable("gone"), ExitCode.FAIL),
    ):
        info = ErrorInfo.from_exception(exc, prefix="worker: ")
        assert info.code == code
        assert info.as_result() == {"type": type(exc).__name__, "message": f"worker: {exc}"}


def test_master_sends_one_typed_plan_per_worker_in_worker_index_order(tmp_path: Path) -> None:
    runner = FakeMaster()
    runner.clients = SimpleNamespace(
        ready=[SimpleNamespace(id="w-b")], running=[SimpleNamespace(id="w-a")], spawning=[]
    )
    runner.get_worker_index = lambda cid: {"w-a": 0, "w-b": 1}[cid]
    ids = distribution.send_plans(runner, plan(), options(tmp_path), sut_cores_n=3)
    assert ids == ["w-a", "w-b"]
    got = [(cid, PlanMessage.from_wire(over_locust_wire(n, d))) for n, d, cid in runner.sent]
    assert [(cid, m.plan.slot, m.plan.slots, m.sut_cores_n) for cid, m in got] == [
        ("w-a", 0, 2, 3),
        ("w-b", 1, 2, 3),
    ]


def test_worker_result_format_error_exits_2_on_the_master(tmp_path: Path, monkeypatch) -> None:
    """The master once matched the class name "ConfigError" and exited 1 for any
    other worker error; a ResultFormatError is a usage error (errors.py): exit 2."""
    # the worker: its plan cannot be used (here: the scenario it names is unreadable)
    worker = FakeWorker()
    worker_state = HarnessState(environment(worker), options(tmp_path))

    def unreadable(opts: Options) -> Any:
        raise ResultFormatError(f"{opts.scenario}: not a harness scenario")

    monkeypatch.setattr(distribution, "scenario_for", unreadable)
    msg = PlanMessage(plan(), options(tmp_path), 1).to_wire()
    worker_state.on_plan(over_locust_wire(PlanMessage.NAME, msg))
    assert worker_state.load.lifecycle.state is S.FAILED
    [(name, payload)] = worker.sent
    assert name == FinalMessage.NAME
    worker_state.send_final()  # at test_stop: the error already was its final
    assert len(worker.sent) == 1

    # the master, mid-run: the worker's final stops the run with the error's own code
    master = FakeMaster()
    env = environment(master)
    state = env.harness = HarnessState(env, options(tmp_path / "out"))
    for s in (S.PREPARING, S.READY, S.RUNNING):
        state.lifecycle.advance(s)
    state.finals.expect(["w-1"])
    state.on_final("w-1", over_locust_wire(name, payload))
    assert state.exit_code == ExitCode.USAGE
    assert state.error == {
        "type": "ResultFormatError",
        "message": f"worker: {SCENARIO}: not a harness scenario",
    }
    assert state.lifecycle.state is S.ABORTED
    gevent.sleep(0)  # the stop is spawned off the message handler
    assert master.stops == 1
    assert state.shape_tick() is None  # the shape hands out no more stages

    # Locust quits: the results (partial, carrying the error) are written, exit 2, unjudged
    plugin._on_quitting(env)
    assert env.process_exit_code == 2
    assert state.lifecycle.state is S.WRITTEN
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["partial"] is True
    assert doc["scenarios"][0]["error"]["type"] == "ResultFormatError"


def test_a_malformed_final_stops_the_run_as_a_usage_error(tmp_path: Path) -> None:
    master = FakeMaster()
    state = HarnessState(environment(master), options(tmp_path))
    for s in (S.PREPARING, S.READY, S.RUNNING, S.COMPLETED):
        state.lifecycle.advance(s)
    state.finals.expect(["w-1"])
    state.on_final("w-1", {"delta": {}})  # an older worker's shape
    assert state.exit_code == ExitCode.USAGE
    assert "harness_final message has fields missing" in state.error["message"]
    assert state.finals.missing() == set()  # it answered: nobody waits for it


def test_exit_codes_come_from_one_table() -> None:
    assert exit_code_for({"verdict": "pass"}) is ExitCode.PASS
    assert exit_code_for({"verdict": "not_judged"}) is ExitCode.NOT_JUDGED
    assert exit_code_for({"verdict": None}) is ExitCode.INVALID
    assert exit_code_for({"verdict": "pass", "partial": True}) is ExitCode.INVALID
    assert exit_code_for({"verdict": "fail", "partial": True}) is ExitCode.FAIL
    assert ExitCode.for_verdict("bogus") is ExitCode.INVALID


def test_sut_process_returncode_is_public(tmp_path: Path) -> None:
    proc = sut.SutProcess([sys.executable, "-c", "raise SystemExit(3)"], log_path=tmp_path / "l")
    assert proc.returncode is None  # not started
    proc.start()
    while proc.alive():  # the watchdog's view: it polls until the server is gone
        time.sleep(0.05)
    assert proc.returncode == 3
    proc.stop()
    killed = sut.SutProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "k"
    )
    killed.start()
    killed.kill()
    assert killed.returncode == -9  # killed by SIGKILL


def test_the_shape_stops_at_the_last_stage_end_not_at_the_next_whole_second(monkeypatch) -> None:
    """Locust calls the shape's tick() once a second, counted from when preparation ended,
    not on the scenario's clock: a run whose last stage ends between two ticks idled up to
    a second past it (a peak point measures five). With under a second left and nothing to
    change, the tick waits out the remainder and ends the run at the stage's end; with more
    than a second left, or a change to hand Locust, it returns at once (the control)."""
    import types

    import harness.load.shape as shape_mod

    clock = {"t": 0.0}
    slept: list[float] = []

    def fake_sleep(s: float) -> None:
        slept.append(s)
        clock["t"] += s

    monkeypatch.setattr(shape_mod.gevent, "sleep", fake_sleep)
    stage = types.SimpleNamespace(kind="open", users=None)

    class State:
        scenario = types.SimpleNamespace(duration_s=8.0)
        slots = 1

        def prepare(self) -> bool:
            return True

        def scenario_time(self) -> float:
            return clock["t"]

        def shape_tick(self):
            return None if clock["t"] >= 8.0 else stage

    shape = shape_mod.ScenarioShape.__new__(shape_mod.ScenarioShape)
    shape.runner = types.SimpleNamespace(environment=types.SimpleNamespace(harness=State()))
    clock["t"] = 7.4  # the first tick this close to the end: users to start, no wait
    assert shape.tick() is not None and slept == []
    clock["t"] = 6.4  # more than a tick left: returns at once
    assert shape.tick() is not None and slept == []
    clock["t"] = 7.4  # 0.6 s left, nothing changes: waits it out, then ends the run
    assert shape.tick() is None
    assert slept == [pytest.approx(0.6)] and clock["t"] == pytest.approx(8.0)
