"""The harness's Locust plugin: options, event listeners, and what a locustfile imports.

A locustfile only needs ``from harness.load.plugin import *``: that brings the users
(``OpenLoopUser``, ``ClosedLoopUser``) and the ``ScenarioShape`` into its namespace, where
Locust finds them, and registers the listeners below on ``locust.events`` — the shape of
a Locust ``contrib`` plugin (``register(environment)`` runs at ``init``).

Every option has an environment variable (``HARNESS_*``) and travels from the master to
the workers with Locust's own option forwarding.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

import gevent
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from harness import sut
from harness.errors import ConfigError, HarnessError
from harness.load.controller import HarnessState, Options
from harness.load.shape import ScenarioShape
from harness.load.users import ClosedLoopUser, OpenLoopUser

__all__ = ["ClosedLoopUser", "OpenLoopUser", "ScenarioShape", "register"]

log = logging.getLogger("harness.load")


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    g = parser.add_argument_group("harness", "Inference load & chaos harness")
    g.add_argument(
        "--scenario",
        default="steady_state",
        env_var="HARNESS_SCENARIO",
        help="scenario name (scenarios/NAME.toml) or path to a .toml file",
    )
    g.add_argument(
        "--mode",
        choices=["quick", "full"],
        default="quick",
        env_var="HARNESS_MODE",
        help="quick (CI) or full variant of the scenario",
    )
    g.add_argument(
        "--quick", dest="mode", action="store_const", const="quick", help="same as --mode quick"
    )
    g.add_argument(
        "--full", dest="mode", action="store_const", const="full", help="same as --mode full"
    )
    g.add_argument(
        "--model",
        default=None,
        env_var="HARNESS_MODEL",
        help="model name on the server (default: the one GET /v2 names)",
    )
    g.add_argument(
        "--sut-pid",
        type=int,
        default=None,
        env_var="HARNESS_SUT_PID",
        help="pid of the running server: sample it, apply chaos, watch it",
    )
    g.add_argument(
        "--sut-cmd",
        default=None,
        env_var="HARNESS_SUT_CMD",
        help="start this server command ({port}, {threads} filled in); --host is derived",
    )
    g.add_argument(
        "--sut-cores",
        default=None,
        env_var="HARNESS_SUT_CORES",
        help="cores for a --sut-cmd server, e.g. 1 or 0,2-3 (default: half of them)",
    )
    g.add_argument(
        "--out",
        default="harness-results",
        env_var="HARNESS_OUT",
        help="directory for results.json and samples/",
    )
    g.add_argument(
        "--input",
        dest="harness_input",
        action="append",
        default=None,
        env_var="HARNESS_INPUT",
        help="NAME:DTYPE:SHAPE of a model input, when the server lists none (repeatable)",
    )
    g.add_argument(
        "--sample-request",
        default=None,
        env_var="HARNESS_SAMPLE_REQUEST",
        help="a V2 inference request JSON file whose inputs are used as the template",
    )
    g.add_argument(
        "--closed-loop",
        type=int,
        default=None,
        env_var="HARNESS_CLOSED_LOOP",
        metavar="USERS",
        help="run every stage closed loop with USERS users",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        env_var="HARNESS_SEED",
        help="override the scenario's seed (arrivals, payloads)",
    )
    g.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        env_var="HARNESS_MAX_IN_FLIGHT",
        help="open loop: in-flight cap over all workers; beyond it requests are dropped",
    )
    g.add_argument(
        "--calibrate-s",
        type=float,
        default=None,
        env_var="HARNESS_CALIBRATE_S",
        help="length of the capacity probe for relative rates",
    )
    g.add_argument(
        "--capacity-rps",
        type=float,
        default=None,
        env_var="HARNESS_CAPACITY_RPS",
        help="known capacity in req/s (skips the probe)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        env_var="HARNESS_REQUEST_TIMEOUT",
        help="client deadline per request in seconds (default: the scenario's)",
    )
    g.add_argument(
        "--ready-timeout",
        type=float,
        default=60.0,
        env_var="HARNESS_READY_TIMEOUT",
        help="seconds to wait for a --sut-cmd server to become ready",
    )
    g.add_argument(
        "--no-sample",
        action="store_true",
        default=False,
        env_var="HARNESS_NO_SAMPLE",
        help="do not run the server sampler even when the pid is known",
    )
    g.add_argument(
        "--no-verify",
        action="store_true",
        default=False,
        env_var="HARNESS_NO_VERIFY",
        help="skip golden outputs and response integrity checks",
    )


def options_from(parsed: Any) -> Options:
    """Validated Options from Locust's parsed options (a ConfigError names the bad one)."""

    def positive(name: str, value: float | None) -> None:
        if value is not None and not value > 0:
            raise ConfigError(f"--{name} has value {value!r}; expected a number > 0")

    positive("max-in-flight", parsed.max_in_flight)
    positive("calibrate-s", parsed.calibrate_s)
    positive("capacity-rps", parsed.capacity_rps)
    positive("request-timeout", parsed.request_timeout)
    positive("ready-timeout", parsed.ready_timeout)
    positive("closed-loop", parsed.closed_loop)
    if parsed.sut_cmd and parsed.sut_pid:
        raise ConfigError(
            "--sut-cmd and --sut-pid are both set; start a server or attach to one, not both"
        )
    inputs = parsed.harness_input or ()
    if isinstance(inputs, str):  # from the environment variable: comma-free, space-separated
        inputs = inputs.split()
    return Options(
        scenario=parsed.scenario,
        mode=parsed.mode or "quick",
        model=parsed.model,
        sut_pid=parsed.sut_pid,
        sut_cmd=parsed.sut_cmd,
        sut_cores=parsed.sut_cores,
        out=parsed.out,
        inputs=tuple(inputs),
        sample_request=parsed.sample_request,
        closed_loop_users=parsed.closed_loop,
        seed=parsed.seed,
        max_in_flight=parsed.max_in_flight,
        calibrate_s=parsed.calibrate_s,
        capacity_rps=parsed.capacity_rps,
        request_timeout_s=parsed.request_timeout,
        ready_timeout_s=parsed.ready_timeout,
        sample=not parsed.no_sample,
        verify=not parsed.no_verify,
    )


def register(environment: Any) -> HarnessState | None:
    """Attach the harness to a Locust environment (called at ``init``)."""
    parsed = environment.parsed_options
    if parsed is None or not hasattr(parsed, "scenario"):
        return None
    try:
        opts = options_from(parsed)
        state = HarnessState(environment, opts)
    except HarnessError as exc:
        # The edge of the Locust process: one line, the harness's exit code.
        log.error("harness: %s", exc)
        sys.exit(exc.exit_code)
    if opts.sut_cmd and not environment.host:
        environment.host = f"http://127.0.0.1:{sut.free_port()}"
        parsed.host = environment.host
    environment.harness = state
    runner = environment.runner
    if not isinstance(runner, WorkerRunner):
        # Locust installs its own SIGTERM handler only after a headless shape run ends, so
        # until then a SIGTERM would kill it outright and lose the results: stop the test
        # (results written, marked partial); Locust's handler replaces this one later.
        gevent.signal_handler(signal.SIGTERM, lambda: gevent.spawn(_stop_on_sigterm, environment))
    if isinstance(runner, WorkerRunner):
        runner.register_message("harness_plan", lambda msg, **_: state.on_plan(msg.data))
        # answering waits for requests still out: not on the message-receiving greenlet
        runner.register_message("harness_finish", lambda msg, **_: gevent.spawn(state.send_final))
    elif isinstance(runner, MasterRunner):
        runner.register_message(
            "harness_final", lambda msg, **_: state.on_final(msg.node_id, msg.data)
        )
    return state


def _stop_on_sigterm(environment: Any) -> None:
    log.info("harness: SIGTERM — stopping the test and writing partial results")
    runner = environment.runner
    if runner is not None:
        runner.stop()
        state = getattr(environment, "harness", None)
        if state is not None:
            state.finalize()
        runner.quit()


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    register(environment)


@events.report_to_master.add_listener
def _on_report_to_master(client_id: str, data: dict[str, Any], **_: Any) -> None:
    from locust.env import Environment  # noqa: F401  (typing only)

    state = _state()
    if state is not None:
        delta = state.drain_for_master()
        if delta is not None:
            data["harness"] = delta


@events.worker_report.add_listener
def _on_worker_report(client_id: str, data: dict[str, Any], **_: Any) -> None:
    state = _state()
    if state is not None:
        state.on_worker_report(client_id, data)


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_: Any) -> None:
    state = getattr(environment, "harness", None)
    if state is None:
        return
    if state.is_worker:
        state.send_final()
        return
    state.finalize()


@events.quitting.add_listener
def _on_quitting(environment: Any, **_: Any) -> None:
    state = getattr(environment, "harness", None)
    if state is None or state.is_worker:
        return
    runner = environment.runner
    if state.prepared and not state.finalized and runner is not None:
        # SIGTERM path: Locust fires quitting before it stops the runner; stop now so the
        # results (marked partial) are written before the exit code is chosen.
        runner.stop()
        state.finalize()
    if state.exit_code is not None:
        environment.process_exit_code = state.exit_code
    elif state.finalized and state.partial:
        environment.process_exit_code = 3  # interrupted: the partial results judge nothing
    elif state.finalized:
        # The verdict belongs to harness.checks (not wired yet): a run that completed and
        # wrote its results is not a failure because some requests failed.
        environment.process_exit_code = 0


@events.quit.add_listener
def _on_quit(**_: Any) -> None:
    state = _state()
    if state is not None:
        state.shutdown()


_environments: list[Any] = []


@events.init.add_listener
def _remember(environment: Any, **_: Any) -> None:
    _environments.append(environment)


def _state() -> HarnessState | None:
    for env in reversed(_environments):
        state = getattr(env, "harness", None)
        if state is not None:
            return state
    return None
