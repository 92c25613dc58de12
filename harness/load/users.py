"""Open-loop and closed-loop Locust users, and the per-process engine they share.

Open loop: one scheduler per process walks this worker's share of the
arrival schedule, sleeps until each intended send time t_i, and spawns the send into a
bounded gevent pool; a full pool means the request is counted ``dropped`` (never
silently skipped). Latency is measured from t_i, so a stalled server shows up as the
queueing delay it causes. Dispatch lag (actual send − t_i) is recorded to prove the
generator kept up.

Closed loop: N users, no think time, each with its own keep-alive connection; latency
from the actual send. Used for concurrency sweeps and calibration.

The engine lives in the process, not in a user: when Locust stops or replaces a user,
requests already sent keep running in the engine's pool and are still accounted for.
Both kinds fire ``events.request`` so Locust's UI and stats keep working; the harness's
own numbers come from the ``Recording`` (exact HDR), never from Locust's stats.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event
import gevent.pool
from locust import User, task

from harness import protocols
from harness.load import arrivals, http
from harness.load.integrity import Golden, golden_from_wire
from harness.load.payloads import ClassParams, PayloadPool, make_id
from harness.load.recording import Recording
from harness.load.scenario import Scenario, Stage
from harness.load.stream_exchange import StreamExchange, client_aborts_of


@dataclass(frozen=True)
class Plan:
    """Everything a process needs to generate its share of the load (sent by the master)."""

    origin_unix: float  # t = 0 of the scenario, shared by every worker
    slot: int  # this process's index among the load processes, 0 … slots − 1
    slots: int
    base_url: str
    model: str
    capacity_rps: float | None
    inputs: Sequence[Any]  # the pool's inputs, as the protocol built them
    golden: Mapping[str, Any] | None  # integrity.golden_to_wire(), None = not verifying
    protocol: str = protocols.DEFAULT  # its name (--protocol): every process speaks it

    def to_wire(self) -> dict[str, Any]:
        return {
            "origin_unix": self.origin_unix,
            "slot": self.slot,
            "slots": self.slots,
            "base_url": self.base_url,
            "model": self.model,
            "capacity_rps": self.capacity_rps,
            "inputs": list(self.inputs),
            "golden": self.golden,
            "protocol": self.protocol,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


class RequestFailed(Exception):
    """What Locust's stats see for a request whose outcome is not ``ok``."""


_FAILURES: dict[str, RequestFailed] = {}


def _failure(outcome: str) -> RequestFailed:
    exc = _FAILURES.get(outcome)
    if exc is None:
        exc = _FAILURES[outcome] = RequestFailed(outcome)
    return exc


class Engine:
    """One process's load generator: schedule, pool, connections, verification, recording."""

    def __init__(
        self,
        scenario: Scenario,
        plan: Plan,
        recording: Recording,
        fire_request: Callable[..., None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = gevent.sleep,
    ) -> None:
        self.scenario = scenario
        self.plan = plan
        self.recording = recording
        self.fire_request = fire_request
        self.clock = clock
        self.sleep = sleep
        load = scenario.load
        self.timeout_s = load.request_timeout_s
        # The scenario's in-flight cap is the total over all load processes.
        self.max_in_flight = max(1, load.max_in_flight // plan.slots)
        self.pool = gevent.pool.Pool(self.max_in_flight)
        host, port, prefix = http.split_url(plan.base_url)
        self.conns = http.ConnectionPool(host, port)
        self.host, self.port = host, port
        self.protocol = protocols.get(plan.protocol)
        classes = [ClassParams(c.name, c.priority, c.timeout_us) for c in scenario.classes]
        self.payloads = PayloadPool(
            host,
            port,
            prefix + self.protocol.infer_path(plan.model),
            plan.inputs,
            classes,
            self.protocol,
        )
        # a multi_turn workload: each pool input is a conversation's first turn, whose
        # later turns this engine builds and sends (``_converse``)
        self.conversations = bool(plan.inputs) and all(
            isinstance(i, dict) and "conversation" in i for i in plan.inputs
        )
        self._request_method = self.protocol.request_method
        # Locust's name per traffic class, built once: "{request_name} [{class}]"
        self._request_names = {
            c.name: f"{self.protocol.request_name} [{c.name}]" for c in scenario.classes
        }
        # a streaming protocol (--protocol openai) reads each answer as it arrives
        self.streams: StreamExchange | None = None
        self.golden: Golden | None = None
        if getattr(self.protocol, "streaming", False):
            oracle = bool(plan.golden) and plan.golden.get("oracle") == "harness_reference_server"
            self.streams = StreamExchange(
                plan.inputs,
                recording,
                self.timeout_s,
                verify=oracle,
                clock=clock,
                aborts=client_aborts_of(scenario),
                seed=load.seed,
                slot=plan.slot,
            )
        elif plan.golden:
            self.golden = golden_from_wire(plan.golden)
        # t = 0 of the scenario on this process's monotonic clock
        self.origin = clock() - (wall() - plan.origin_unix)
        self._seq = itertools.count()
        self._class_names = [c.name for c in scenario.classes]
        self._pick_class = arrivals.class_picker(
            [c.share for c in scenario.classes],
            arrivals.worker_rng(load.seed + 7919, plan.slot),
        )
        segments = scenario.segments(plan.capacity_rps)
        self._arrivals: Iterator[float] = arrivals.schedule(
            segments, load.arrival, seed=load.seed, worker_index=plan.slot, worker_count=plan.slots
        )
        self._pending: float | None = None
        self.finished = gevent.event.Event()
        self.stopping = False  # set when the master asks for the final report

    # -- helpers ---------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the scenario's t = 0."""
        return self.clock() - self.origin

    def stage_at(self, t: float) -> Stage:
        stage = self.scenario.stage_at(t)
        if stage is not None:
            return stage
        stages = self.scenario.stages
        return stages[0] if t < stages[0].start_s else stages[-1]

    def _next_arrival(self) -> float | None:
        if self._pending is not None:
            t, self._pending = self._pending, None
            return t
        return next(self._arrivals, None)

    # -- open loop -----------------------------------------------------------------

    def run_open(self) -> None:
        """Walk this process's schedule until it ends (called from an OpenLoopUser)."""
        pool = self.pool
        rec = self.recording
        while True:
            t = None if self.stopping else self._next_arrival()
            if t is None:
                self.finished.set()
                return
            try:
                delay = t - self.now()
                if delay > 0:
                    self.sleep(delay)
            except BaseException:
                # The user was stopped while waiting: hand the arrival to its successor.
                self._pending = t
                raise
            if self.stopping:
                self._pending = t
                continue
            stage = self.stage_at(t).name
            cls = self._class_names[self._pick_class()]
            rec.scheduled(cls, stage, t)
            if pool.full():
                rec.dropped(cls, stage, t)
                if self.streams is not None:  # goodput counts what was never sent
                    self.streams.dropped(cls, stage)
                if self.fire_request is not None:
                    self._fire(cls, 0.0, 0, "dropped")
                continue
            pool.spawn(self._send, cls, stage, t)

    def _send(self, cls: str, stage: str, t: float) -> None:
        seq = next(self._seq)
        index = seq % len(self.payloads)
        rid = make_id(self.plan.slot, seq)
        raw = self.payloads.raw(cls, index, rid)
        due = self.origin + t
        start = self.clock()
        self.recording.sent(cls, stage, t, (start - due) * 1e6)
        answer = None
        if self.streams is None:
            outcome, length = self._exchange(raw, index, rid, t)
        else:
            outcome, length, answer = self._stream(raw, index, cls, stage, t)
        end = self.clock()
        latency_ms = (end - due) * 1000.0
        self.recording.done(cls, stage, t, outcome, latency_ms * 1000.0)
        if self.fire_request is not None:
            self._fire(cls, latency_ms, length, outcome)
        if self.conversations and outcome == "ok" and answer is not None:
            self._converse(index, answer, cls)

    # -- closed loop ---------------------------------------------------------------

    def closed_once(self, conn: http.Connection) -> bool:
        """One closed-loop request if a closed stage is running; False otherwise."""
        t = self.now()
        stage = self.scenario.stage_at(t)
        if stage is None or stage.kind != "closed" or self.stopping:
            return False
        seq = next(self._seq)
        index = seq % len(self.payloads)
        cls = self._class_names[self._pick_class()]
        rid = make_id(self.plan.slot, seq)
        raw = self.payloads.raw(cls, index, rid)
        rec = self.recording
        rec.scheduled(cls, stage.name, t)
        rec.sent(cls, stage.name, t, None)
        start = self.clock()
        answer = None
        try:
            if self.streams is None:
                outcome, length = self._exchange(raw, index, rid, t, conn)
            else:
                outcome, length, answer = self._stream(raw, index, cls, stage.name, t, conn)
        except BaseException:
            # Locust killed the user mid-request (stage change, stop): account for it.
            rec.done(cls, stage.name, t, "cancelled", (self.clock() - start) * 1e6)
            raise
        latency_ms = (self.clock() - start) * 1000.0
        rec.done(cls, stage.name, t, outcome, latency_ms * 1000.0)
        if self.fire_request is not None:
            self._fire(cls, latency_ms, length, outcome)
        if self.conversations and outcome == "ok" and answer is not None:
            self._converse(index, answer, cls, conn)
        if outcome == "connection":
            # a refused connection returns at once: don't spin while the server is away
            self.sleep(0.05)
        return True

    # -- one exchange, verified ------------------------------------------------------

    def _stream(
        self,
        raw: bytes,
        index: int,
        cls: str,
        stage: str,
        t: float,
        conn: http.Connection | None = None,
    ) -> tuple[str, int, str]:
        """A streaming protocol's request: read as it arrives (``StreamExchange``);
        (outcome, output tokens, the text streamed)."""
        assert self.streams is not None
        own = conn is None
        if own:
            conn = self.conns.acquire()
        try:
            outcome, rec = self.streams.exchange_pool(
                conn, raw, index, cls, stage, self.origin + t, t
            )
        finally:
            if own:
                self.conns.release(conn)
        return outcome, rec.output_tokens, rec.text

    def _converse(
        self, index: int, answer: str, cls: str, conn: http.Connection | None = None
    ) -> None:
        """The later turns of pool input ``index``'s conversation, whose first turn was
        answered ``answer``. Each turn is built from the text streamed for the turn before
        it and is due as soon as that turn ended (no think time): it is scheduled at that
        moment, timed from it, and counted in the stage it falls in, as any request is.
        The conversation ends after a turn that is not ``ok`` (there is no answer to carry
        on), when the load stops, or at the scenario's end (a turn due then is not sent).
        ``conn``: the closed-loop user's connection (open loop: the pool's)."""
        from harness.load.llm_workload import Conversation
        from harness.load.stream_exchange import expectation_of

        streams = self.streams
        assert streams is not None
        spec = self.payloads.inputs[index]["conversation"]
        conv = Conversation(spec["plan"], spec["index"], self.plan.model, turns=spec["turns"])
        conv.next_request(None)  # the first turn: the pool input sent before
        rec = self.recording
        end_s = self.scenario.duration_s
        while not conv.done and not self.stopping:
            t = self.now()
            if t >= end_s:
                return
            stage = self.stage_at(t).name
            inp = self.protocol.turn_input(conv.next_request(answer))
            raw = self.payloads.raw_for(cls, inp, make_id(self.plan.slot, next(self._seq)))
            expected = expectation_of(inp["body"]) if streams.verifying else None
            due = self.origin + t
            own = conn is None
            rec.scheduled(cls, stage, t)
            # the dispatch lag of an open-loop send (a closed-loop one has none)
            rec.sent(cls, stage, t, (self.clock() - due) * 1e6 if own else None)
            c = self.conns.acquire() if own else conn
            try:
                outcome, record = streams.exchange_request(
                    c, raw, expected, inp["prompt_tokens"], cls, stage, due, t
                )
            except BaseException:
                rec.done(cls, stage, t, "cancelled", (self.clock() - due) * 1e6)
                raise
            finally:
                if own:
                    self.conns.release(c)
            latency_ms = (self.clock() - due) * 1000.0
            rec.done(cls, stage, t, outcome, latency_ms * 1000.0)
            if self.fire_request is not None:
                self._fire(cls, latency_ms, record.output_tokens, outcome)
            if outcome != "ok":
                return
            answer = record.text

    def _exchange(
        self, raw: bytes, index: int, rid: str, t: float, conn: http.Connection | None = None
    ) -> tuple[str, int]:
        own = conn is None
        if own:
            conn = self.conns.acquire()
        try:
            status, body = conn.exchange(raw, self.timeout_s)
        except http.RequestTimeout:
            return "timeout", 0
        except http.ConnectionFailed:
            return "connection", 0
        finally:
            if own:
                self.conns.release(conn)
        if status != 200:
            return f"http_{status}", len(body)
        return self.verify(index, rid, body, t), len(body)

    def verify(self, index: int, rid: str, body: bytes, t: float = 0.0) -> str:
        """Outcome of a 200 answer: ok, cross_wired, id_mismatch, drift or bad_response."""
        try:
            echoed, values = self.protocol.parse_answer(body)
        except protocols.BadResponse:
            return "bad_response"
        golden = self.golden
        rec = self.recording
        if golden is None:
            if echoed is not None and echoed != rid:
                rec.integrity_result(
                    "id_mismatch", {"request_id": rid, "echoed_id": echoed, "t": round(t, 3)}
                )
                return "id_mismatch"
            return "ok"
        if golden.own_distance(index, values) is not None and (echoed is None or echoed == rid):
            # its own output and its own id: the common case, judged without a Verdict
            rec.integrity_result("ok")
            return "ok"
        verdict = golden.classify(index, values)
        kind = verdict.kind
        if kind in ("ok", "drift") and echoed is not None and echoed != rid:
            # its own output but someone else's id (or a wrong answer with a wrong id)
            kind = "id_mismatch"
        if kind == "ok":
            rec.integrity_result("ok")
        else:
            rec.integrity_result(
                kind,
                {
                    "sent_input": index,
                    "matched_input": verdict.matched,
                    "distance": verdict.distance,
                    "request_id": rid,
                    "echoed_id": echoed,
                    "t": round(t, 3),
                },
            )
        return kind

    def _fire(self, cls: str, latency_ms: float, length: int, outcome: str) -> None:
        self.fire_request(
            request_type=self._request_method,
            name=self._request_names[cls],
            response_time=latency_ms,
            response_length=length,
            exception=None if outcome == "ok" else _failure(outcome),
            context={"outcome": outcome},
        )

    # -- the end ---------------------------------------------------------------------

    def wait_in_flight(self, grace_s: float) -> int:
        """Stop scheduling, let sent requests finish (at most ``grace_s``); return how
        many are still out."""
        self.stopping = True
        self.pool.join(timeout=grace_s)
        return len(self.pool)

    def close(self) -> None:
        self.pool.kill(block=False)
        self.conns.close()


class _EngineUser(User):
    """Base: finds its process's engine (set up by the plugin) before doing anything."""

    abstract = True

    def engine(self) -> Engine:
        state = getattr(self.environment, "harness", None)
        if state is None:
            raise RuntimeError(
                "the harness plugin is not loaded: run locustfiles/inference.py "
                "(it imports harness.load.plugin)"
            )
        return state.wait_engine()


class OpenLoopUser(_EngineUser):
    """Runs this process's open-loop scheduler; the shape starts one per load process."""

    @task
    def schedule(self) -> None:
        engine = self.engine()
        engine.run_open()
        # Schedule done: idle until the shape stops the test (returning would spin).
        while True:
            gevent.sleep(1.0)


class ClosedLoopUser(_EngineUser):
    """Sends back-to-back on its own connection while a closed-loop stage runs."""

    @task
    def loop(self) -> None:
        engine = self.engine()
        conn = http.Connection(engine.host, engine.port)
        try:
            while True:
                if not engine.closed_once(conn):
                    gevent.sleep(0.05)
        finally:
            conn.close()
