"""Distribution: plans out to the load processes, recordings back to the master.

Master side (``send_plans``, ``Finals``): one ``PlanMessage`` per worker, slots in
Locust's worker-index order; ``harness_finish`` asks every worker that has not sent its
final report yet; ``Finals`` tells when all of them did. A local runner is its own only
load process (``"local"``).

Load-process side (``LoadProcess``, on a worker or the local runner): builds the
``Engine`` from the plan, hands Locust's periodic report a ``ReportMessage``, and at the
end waits for its requests out and sends one ``FinalMessage`` — or, when the plan cannot
be used (the scenario file missing on this machine), a ``FinalMessage`` carrying the
error's code, so the master's results carry it instead of a timeout. Its state is a
worker ``Lifecycle`` (ready → draining → reported, or failed).

Every payload is a dataclass of ``harness.load.wire``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event

from harness.errors import HarnessError, TargetUnavailable
from harness.load import http, target
from harness.load.lifecycle import Lifecycle, RunState
from harness.load.options import Options, scenario_for
from harness.load.own_conns import ConnCounter
from harness.load.recording import Recording
from harness.load.scenario import Scenario
from harness.load.users import Engine, Plan
from harness.load.wire import ErrorInfo, FinalMessage, FinishMessage, PlanMessage, ReportMessage

if TYPE_CHECKING:
    from locust.env import Environment
    from locust.runners import MasterRunner

log = logging.getLogger("harness.load")

LOCAL = "local"  # the local runner's one load process, as a recording source


# -- master ------------------------------------------------------------------------------


def options_for_workers(opts: Options) -> Options:
    """The master's options as workers get them: a scenario path that exists here travels
    absolute (workers on this machine may run from another directory)."""
    path = Path(opts.scenario)
    return replace(opts, scenario=str(path.resolve())) if path.is_file() else opts


def send_plans(runner: MasterRunner, plan: Plan, opts: Options, sut_cores_n: int) -> list[str]:
    """One plan per connected worker (its slot); the worker ids in slot order."""
    clients = runner.clients.ready + runner.clients.running + runner.clients.spawning
    ids = sorted((c.id for c in clients), key=runner.get_worker_index)
    if not ids:
        raise TargetUnavailable("no workers connected; start workers or use --expect-workers")
    options = options_for_workers(opts)
    for slot, cid in enumerate(ids):
        msg = PlanMessage(replace(plan, slot=slot, slots=len(ids)), options, sut_cores_n)
        runner.send_message(PlanMessage.NAME, msg.to_wire(), client_id=cid)
    return ids


class Finals:
    """Master: the load processes that got a plan, and those whose final report is in."""

    def __init__(self) -> None:
        self.expected: list[str] = []
        self.received: set[str] = set()
        self._all_in = gevent.event.Event()

    def expect(self, ids: list[str]) -> None:
        self.expected = list(ids)
        self.received = set()
        self._all_in.clear()

    def got(self, client_id: str) -> None:
        self.received.add(client_id)
        if self.received >= set(self.expected):
            self._all_in.set()

    def missing(self) -> set[str]:
        return set(self.expected) - self.received

    def request(self, runner: MasterRunner, timeout: float) -> set[str]:
        """Ask every worker still owing its final report, wait up to ``timeout``; return
        the ones that never answered. In headless mode Locust's master quits without
        sending "stop" to the workers, so the harness asks explicitly."""
        for cid in self.missing():
            try:
                runner.send_message(FinishMessage.NAME, FinishMessage().to_wire(), client_id=cid)
            except Exception as exc:  # a worker already gone: it is reported as missing
                log.debug("harness: %s to %s failed: %s", FinishMessage.NAME, cid, exc)
        if self.missing():
            self._all_in.wait(timeout)
        return self.missing()


# -- a load process (worker or local) -----------------------------------------------------


class LoadProcess:
    """This process's engine: built from the plan, drained into reports and a final."""

    def __init__(
        self, env: Environment, opts: Options, scenario: Scenario, is_worker: bool
    ) -> None:
        self.env = env
        self.opts = opts
        self.scenario = scenario
        self.is_worker = is_worker
        self.lifecycle = Lifecycle.worker()
        self.engine: Engine | None = None
        self.engine_ready = gevent.event.Event()
        self._cpu_at_plan = 0.0
        self.conns: ConnCounter | None = None
        self._conns_loop: gevent.Greenlet | None = None

    def _count_conns(self, base_url: str) -> None:
        """Count this process's own connections to the server from now on (one counter
        per plan; harness.load.own_conns says why) — where the sampler may not match them:
        on a worker (another host, or started by hand) and when ``harness agent`` samples
        the server. A local runner beside a local sampler is in its measured tree."""
        if self._conns_loop is not None:
            self._conns_loop.kill(block=False)
            self._conns_loop = None
        self.conns = None
        if not (self.is_worker or self.opts.agent_url):
            return
        self.conns = ConnCounter(base_url)
        pool = gevent.get_hub().threadpool
        self._conns_loop = gevent.spawn(self.conns.run, gevent.sleep, offload=pool.apply)

    def drain_conns(self, final: bool = False) -> dict[str, Any] | None:
        """The connection counts since the last drain; ``final`` stops the counting."""
        if self.conns is None:
            return None
        if final and self._conns_loop is not None:
            self._conns_loop.kill(block=False)
            self._conns_loop = None
            self.conns.poll()  # the count as the load stops
        return self.conns.drain()

    def wait_engine(self, timeout: float = 60.0) -> Engine:
        if not self.engine_ready.wait(timeout) or self.engine is None:
            raise TargetUnavailable(
                f"no load plan from the master within {timeout:g} s; is the master running "
                f"the same locustfile and scenario?"
            )
        return self.engine

    def on_plan_message(self, data: Any) -> None:
        """Worker: a ``harness_plan`` arrived; a plan it cannot use goes back as an error."""
        try:
            msg = PlanMessage.from_wire(data)
            # A worker's own command line need not repeat the harness options: take the
            # master's, so every process runs the very same scenario.
            self.opts = msg.options
            self.scenario = scenario_for(self.opts).with_cores(msg.sut_cores_n)
            self.build(msg.plan)
        except HarnessError as exc:
            # e.g. the scenario path does not exist on this worker's machine: tell the
            # master (its results carry the error) instead of idling until a timeout
            log.error("harness: %s", exc)
            self.lifecycle.advance(RunState.FAILED)
            final = FinalMessage(error=ErrorInfo.from_exception(exc, prefix="worker: "))
            self.env.runner.send_message(FinalMessage.NAME, final.to_wire())

    def build(self, plan: Plan) -> Engine:
        """The engine for ``plan`` (replacing an earlier one)."""
        if self.engine is not None:
            self.engine.close()
        self._cpu_at_plan = target.cpu_s()
        http.configure(http.client_for(plan.base_url, self.opts))  # headers, TLS
        self._count_conns(plan.base_url)
        load = self.scenario.load
        self.engine = Engine(
            self.scenario,
            plan,
            Recording(load.window_s, -(-load.first_requests // plan.slots)),
            fire_request=self.env.events.request.fire,
        )
        self.lifecycle.advance(RunState.READY)
        self.engine_ready.set()
        return self.engine

    def report(self, *, encoded: bool = True) -> ReportMessage | None:
        """Locust's periodic report: what was recorded since the last one (``encoded``
        False: for this process's own merge, ``Recording.drain``)."""
        e = self.engine
        if e is None or e.recording.closed:
            return None
        return ReportMessage(
            e.recording.drain(e.now(), encoded=encoded),
            target.cpu_s() - self._cpu_at_plan,
            self.drain_conns(),
        )

    def final(self, *, encoded: bool = True) -> FinalMessage:
        """Stop scheduling, wait for the requests out, drain the rest and close
        (``encoded`` as in ``report``)."""
        e = self.engine
        if e is None or e.recording.closed:
            return FinalMessage()
        grace = self.scenario.load.request_timeout_s + 1.0
        left = e.wait_in_flight(grace)
        if left:
            log.warning("harness: %d requests still in flight after %.1f s", left, grace)
        delta = e.recording.drain(e.now(), final=True, encoded=encoded)
        cpu_s = target.cpu_s() - self._cpu_at_plan
        conns = self.drain_conns(final=True)
        e.close()
        return FinalMessage(recording=delta, cpu_s=cpu_s, conns=conns)

    def send_final(self) -> None:
        """Worker (at test_stop or on ``harness_finish``): send the final report once."""
        if not self.lifecycle.advance_if(RunState.DRAINING):
            return  # already draining, reported, or failed (the error was the final)
        final = self.final()
        self.lifecycle.advance(RunState.REPORTED)
        self.env.runner.send_message(FinalMessage.NAME, final.to_wire())

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
