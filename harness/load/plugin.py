"""The harness's Locust plugin: options, event listeners, and what a locustfile imports.

A locustfile only needs ``from harness.load.plugin import *``: that brings the users
(``OpenLoopUser``, ``ClosedLoopUser``) and the ``ScenarioShape`` into its namespace, where
Locust finds them, and registers the listeners below on ``locust.events`` — the shape of
a Locust ``contrib`` plugin (``register(environment)`` runs at ``init``).

Every option has an environment variable (``HARNESS_*``) and travels from the master to
the workers with Locust's own option forwarding.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from typing import Any

import gevent
from locust import argument_parser, events
from locust.runners import MasterRunner, WorkerRunner

from harness import sut
from harness.errors import ExitCode, HarnessError
from harness.finish import PARENT_RENDERS_ENV, finish, verdict_line
from harness.load.controller import JUDGE_TIMEOUT_S, HarnessState
from harness.load.finalisation import FINALS_GRACE_S
from harness.load.live import session_verdict
from harness.load.options import add_options, options_from
from harness.load.shape import ScenarioShape
from harness.load.users import ClosedLoopUser, OpenLoopUser
from harness.load.wire import REPORT_KEY, FinalMessage, FinishMessage, PlanMessage

__all__ = ["ClosedLoopUser", "OpenLoopUser", "ScenarioShape", "register"]

log = logging.getLogger("harness.load")

events.init_command_line_parser.add_listener(add_options)


def cache_locust_defaults() -> None:
    """Build Locust's table of its own options' defaults once per process.

    A worker handling a spawn message asks ``argument_parser.default_args_dict()`` once per
    option the master forwards, and each call builds and parses a fresh argument parser,
    all on the worker's loop before its users start (docs/performance.md, "A run's fixed
    cost"). The table depends on Locust's built-in options only, so it is the same every
    time; each caller gets its own copy.
    """
    build = argument_parser.default_args_dict
    if getattr(build, "cached_by_harness", False):
        return
    table = functools.cache(build)

    def default_args_dict() -> dict:
        return dict(table())

    default_args_dict.cached_by_harness = True  # type: ignore[attr-defined]
    argument_parser.default_args_dict = default_args_dict


cache_locust_defaults()


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
    if getattr(parsed, "run_time", None):
        log.info(
            "harness: -t/--run-time %s s is the scenario's length: its stages are scaled to "
            "it, as --duration does (Locust's 'ignored' warning does not apply to this shape)",
            parsed.run_time,
        )
    runner = environment.runner
    if state.web:
        from harness.load import webui

        webui.install(environment, state)
    if not isinstance(runner, WorkerRunner):
        # Locust installs its own SIGTERM handler only after a headless shape run ends, so
        # until then a SIGTERM would kill it outright and lose the results: stop the test
        # (results written, marked partial); Locust's handler replaces this one later.
        gevent.signal_handler(signal.SIGTERM, lambda: gevent.spawn(_stop_on_sigterm, environment))
    if isinstance(runner, WorkerRunner):
        runner.register_message(PlanMessage.NAME, lambda msg, **_: state.on_plan(msg.data))
        runner.register_message(FinishMessage.NAME, lambda msg, **_: _on_finish(state, msg.data))
    elif isinstance(runner, MasterRunner):
        runner.register_message(
            FinalMessage.NAME, lambda msg, **_: state.on_final(msg.node_id, msg.data)
        )
    return state


def _on_finish(state: HarnessState, data: Any) -> None:
    FinishMessage.from_wire(data)
    # answering waits for requests still out: not on the message-receiving greenlet
    gevent.spawn(state.send_final)


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
    state = _state()
    if state is not None:
        report = state.drain_for_master()
        if report is not None:
            data[REPORT_KEY] = report


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
    if state.stoppable and runner is not None:
        # SIGTERM path: Locust fires quitting before it stops the runner; stop now so the
        # results (marked partial) are written before the exit code is chosen.
        runner.stop()
        state.finalize()
    elif state.finalising:
        # finalising on another greenlet (a SIGTERM while the workers' finals come in)
        state.wait_written(state.scenario.load.request_timeout_s + FINALS_GRACE_S + 30.0)
    # started from the web UI: each run was judged when it ended (into its own directory);
    # the session exits with the worst of them (one run: its own code), said last at quit
    started = state.web and (state.runs or state.judging is not None)
    if started and state.wait_judged(JUDGE_TIMEOUT_S) is not None:
        code, said = session_verdict(state.runs)
        _said_at_quit.append(f"harness: {said}")
        environment.process_exit_code = int(code)
        return
    if state.exit_code == ExitCode.USAGE or not state.on_disk:
        # a usage error (already logged as one line), or nothing was measured
        environment.process_exit_code = int(
            state.exit_code if state.exit_code is not None else ExitCode.INVALID
        )
        return
    try:
        # The same judging as `harness acceptance`: checks, validity, reports, exit code.
        parent_renders = os.environ.get(PARENT_RENDERS_ENV) == "1"
        doc, code = finish(state.out_dir, state.opts.checklist, render=not parent_renders)
    except HarnessError as exc:
        log.error("harness: %s", exc)
        environment.process_exit_code = exc.exit_code
        return
    for sc in doc["scenarios"]:
        for c in sc.get("checks") or []:
            if c.get("passed") is False:
                log.warning("harness: FAIL %s: %s", c["id"], c.get("detail"))
        if sc.get("validity"):
            log.warning("harness: INVALID run: %s", "; ".join(sc["validity"]))
    log.warning(
        "harness: %s (exit %d) — %s",
        verdict_line(doc),
        code,
        state.out_dir / ("results.json" if parent_renders else "report.html"),
    )
    state.judged()
    environment.process_exit_code = int(code)


# the web UI session's verdict: logged at quit, after Locust's stats tables (which show
# the last run only), so the session's last console line says which run decided its code
_said_at_quit: list[str] = []


@events.quit.add_listener
def _on_quit(**_: Any) -> None:
    state = _state()
    try:
        if state is not None:
            state.shutdown()
    finally:
        while _said_at_quit:
            log.warning(_said_at_quit.pop(0))


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
