"""A streaming Locust user for OpenAI-compatible servers, and the per-process engine it uses.

``StreamingUser`` sends chat (or completions) requests with ``stream: true`` and
``stream_options.include_usage`` and reads each answer as it arrives
(``harness.load.stream_http``). Each request belongs to a traffic class
(``StreamSettings.classes``; by default one, ``traffic_class``): it draws its class by
share from a generator seeded per (worker, user), like its arrivals, and carries the
class's ``priority`` in its body (vLLM's and SGLang's field; left out when None). Per
stream it fires **one** Locust request event —
name ``"{api} [{class}]"``, ``response_time`` the end-to-end time in ms, ``response_length``
the output tokens, an exception carrying the first failing problem when the record
``failed`` — and records the stream into the process's ``StreamStats`` (TTFT, TPOT,
inter-token, end-to-end and longest-gap HDR histograms per class).

Open loop (``rate_per_user`` > 0): each user walks its own Poisson arrival schedule
(``harness.load.arrivals``) and spawns each send into the process's bounded pool, so a
slow server does not slow the schedule; latency counts from the **intended** send time,
and a send that finds the pool full is counted ``dropped``. Closed loop
(``rate_per_user`` = 0): each user sends back to back on its own connection, latency
from its actual send.

The engine belongs to the process, not to a user: streams already sent keep running when
Locust stops the users, and ``finish`` waits for them (at most the stream deadline)
before the statistics are final. When the target is the reference server (its
``/v1/models`` says ``owned_by: harness_reference_server``) every stream is checked against the
server's own oracle (``reference_expectation``) unless ``verify`` is False, and tokens
are counted with its tokenizer; any other server is read one token per event.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.lock
import gevent.pool
from locust import User, task

from harness.load import arrivals, http
from harness.load.llm_workload_text import text_of, words
from harness.load.stream_http import StreamLimits, exchange_stream, stream_client
from harness.load.stream_recording import StreamStats
from harness.protocols import openai
from harness.protocols.openai_stream import FAILURES, Expectation, StreamRecord

log = logging.getLogger("harness.load.stream")

REFERENCE_OWNER = "harness_reference_server"


@dataclass(frozen=True)
class StreamClass:
    """One traffic class: its share of the requests and the ``priority`` its bodies carry
    (None: the field is left out)."""

    name: str
    share: float = 1.0
    priority: int | None = None


def parse_classes(text: str) -> tuple[StreamClass, ...]:
    """``NAME:SHARE[:PRIORITY],...`` (e.g. ``high:0.2:1,low:0.8:2``) → the classes;
    ValueError naming the fix for a malformed item, a repeated name, a share outside
    [0, 1] or shares that do not sum to 1."""
    out: list[StreamClass] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        parts = item.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise ValueError
            share = float(parts[1])
            priority = int(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ValueError(
                f"--llm-classes has item {item!r}; write NAME:SHARE[:PRIORITY], e.g. "
                "high:0.2:1,low:0.8:2"
            ) from None
        if not 0 <= share <= 1:
            raise ValueError(f"--llm-classes: class {parts[0]!r} has share {share:g}; use [0, 1]")
        if any(c.name == parts[0] for c in out):
            raise ValueError(f"--llm-classes names class {parts[0]!r} twice")
        out.append(StreamClass(parts[0], share, priority))
    if not out:
        raise ValueError("--llm-classes is empty; write NAME:SHARE[:PRIORITY],...")
    total = sum(c.share for c in out)
    if abs(total - 1) > 1e-6:
        raise ValueError(f"--llm-classes: the shares sum to {total:g}; they must sum to 1")
    return tuple(out)


@dataclass(frozen=True)
class StreamSettings:
    """What to send and how: the workload, the loop, the limits."""

    base_url: str
    model: str | None = None  # None: the first model of /v1/models
    api: str = "chat"  # "chat" or "completions"
    max_tokens: int = 64
    prompt_tokens: int = 32  # words of the prompt (each one token for the reference tokenizer)
    rate_per_user: float = 1.0  # requests/s per user; 0: closed loop
    limits: StreamLimits = field(default_factory=StreamLimits)
    verify: bool | None = None  # None: when the target is the reference server
    max_in_flight: int = 1000  # per process, open loop
    traffic_class: str = "default"  # the one class when ``classes`` is empty
    classes: tuple[StreamClass, ...] = ()  # drawn by share per request
    prompts: int = 32  # distinct request bodies, cycled
    seed: int = 1

    def __post_init__(self) -> None:
        if self.api not in ("chat", "completions"):
            raise ValueError(f"api has value {self.api!r}; expected 'chat' or 'completions'")
        if self.max_tokens < 1 or self.prompt_tokens < 1 or self.prompts < 1:
            raise ValueError("max_tokens, prompt_tokens and prompts must each be at least 1")
        if not self.rate_per_user >= 0:
            raise ValueError(f"rate_per_user has value {self.rate_per_user!r}; expected ≥ 0")
        if self.classes and abs(sum(c.share for c in self.classes) - 1) > 1e-6:
            raise ValueError("the classes' shares must sum to 1")

    @property
    def traffic_classes(self) -> tuple[StreamClass, ...]:
        """The classes requests are drawn from: ``classes``, else ``traffic_class`` alone."""
        return self.classes or (StreamClass(self.traffic_class),)


@dataclass(frozen=True)
class Prepared:
    """One request, ready to send: its bytes, its expected answer, its prompt tokens."""

    raw: bytes
    expected: Expectation | None
    prompt_tokens: int | None


class StreamFailed(Exception):
    """What Locust's stats see for a stream that failed (its first failing problem)."""


def discover(base_url: str, client: http.Client) -> tuple[str, bool]:
    """(the first served model's id, whether the server is the reference server), from
    ``GET /v1/models``; ConnectionFailed / ValueError when it does not answer one."""
    status, body = http.request(base_url.rstrip("/") + "/v1/models", client=client)
    if status != 200:
        raise ValueError(f"GET /v1/models answered HTTP {status}: {body[:200]!r}")
    models = json.loads(body).get("data") or []
    if not models:
        raise ValueError("GET /v1/models lists no model")
    return str(models[0]["id"]), models[0].get("owned_by") == REFERENCE_OWNER


def prepare(
    settings: StreamSettings,
    model: str,
    verify: bool,
    client: http.Client,
    priority: int | None = None,
) -> list[Prepared]:
    """``settings.prompts`` request bodies (prompts of ``prompt_tokens`` words drawn from
    the reference vocabulary, one seed each, ``ignore_eos`` so every answer runs to
    ``max_tokens``, ``priority`` when not None), with the reference server's expected
    answer when ``verify`` (the priority does not change it)."""
    host, port, prefix = http.split_url(settings.base_url)
    chat = settings.api == "chat"
    path = prefix + (openai.CHAT_PATH if chat else openai.COMPLETIONS_PATH)
    rng = random.Random(f"harness-llm-prompts/{settings.seed}")
    out = []
    for i in range(settings.prompts):
        text = text_of(words(rng, settings.prompt_tokens))
        gen = openai.Generation(
            max_tokens=settings.max_tokens, seed=i, ignore_eos=True, priority=priority
        )
        body = (
            openai.chat_body(model, [{"role": "user", "content": text}], gen)
            if chat
            else openai.completion_body(model, text, gen)
        )
        data = openai.encode_body(body)
        raw = http.build_head("POST", path, host, port, len(data), client) + data
        expected = prompt = None
        if verify:
            completion = openai.reference_expectation(body)
            expected, prompt = Expectation.from_completion(completion), completion.prompt_tokens
        out.append(Prepared(raw, expected, prompt))
    return out


class StreamEngine:
    """One process's streaming load: requests, connections, the open-loop pool, stats."""

    def __init__(
        self,
        settings: StreamSettings,
        fire_request: Callable[..., None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.fire_request = fire_request
        self.clock = clock
        self.client = stream_client(http.Client.for_target(settings.base_url))
        model, reference = discover(settings.base_url, self.client)
        self.model = settings.model or model
        self.reference = reference
        self.verify = reference if settings.verify is None else settings.verify
        if self.verify and not reference:
            raise ValueError(
                "verify is on but the target is not the reference server: its answers "
                "cannot be predicted (leave verify unset or off)"
            )
        classes = settings.traffic_classes
        self.requests = {
            c.name: prepare(settings, self.model, self.verify, self.client, c.priority)
            for c in classes
        }
        self.default_class = classes[0].name
        self._shares = [c.share for c in classes]
        self._class_names = [c.name for c in classes]
        host, port, _ = http.split_url(settings.base_url)
        self.host, self.port = host, port
        self.conns = http.ConnectionPool(host, port, client=self.client)
        self.pool = gevent.pool.Pool(max(1, settings.max_in_flight))
        self.stats = StreamStats()
        self.names = {c.name: f"{settings.api} [{c.name}]" for c in classes}
        self._seq = itertools.count()
        self._users = itertools.count()
        self.stopping = False
        # the reference tokenizer for the reference server; else one token per event
        self._options: dict[str, Any] = {} if reference else {"count_tokens": None}

    def user_index(self) -> int:
        return next(self._users)

    def arrival_rng(self, worker_index: int, user_index: int) -> random.Random:
        """An independent, reproducible arrival stream per (worker, user)."""
        return random.Random(
            f"harness-llm-arrivals/{self.settings.seed}/{worker_index}/{user_index}"
        )

    def class_picker(self, worker_index: int, user_index: int) -> Callable[[], str]:
        """An independent, reproducible draw of each request's class per (worker, user)."""
        pick = arrivals.class_picker(
            self._shares,
            random.Random(f"harness-llm-classes/{self.settings.seed}/{worker_index}/{user_index}"),
        )
        names = self._class_names
        return lambda: names[pick()]

    def send(
        self, intended_at: float, conn: http.Connection | None = None, cls: str | None = None
    ) -> StreamRecord:
        """One stream of class ``cls`` (default: the first class), recorded and reported;
        on a pooled connection when ``conn`` is None."""
        cls = cls or self.default_class
        pool = self.requests[cls]
        req = pool[next(self._seq) % len(pool)]
        own = conn is None
        if own:
            conn = self.conns.acquire()
        try:
            rec = exchange_stream(
                conn,
                req.raw,
                self.settings.limits,
                intended_at=intended_at,
                clock=self.clock,
                expected=req.expected,
                prompt_tokens=req.prompt_tokens,
                **self._options,
            )
        except BaseException:
            self.stats.cancelled(cls)  # the user or the pool was killed mid-stream
            raise
        finally:
            if own:
                self.conns.release(conn)
        self.stats.record(cls, rec, verified=req.expected is not None)
        if self.fire_request is not None:
            failure = next((p for p in rec.problems if p.code in FAILURES), None)
            self.fire_request(
                request_type="POST",
                name=self.names[cls],
                response_time=rec.end_s * 1000.0,
                response_length=rec.output_tokens,
                exception=None if failure is None else StreamFailed(str(failure)),
                context={"ttft_ms": None if rec.ttft_s is None else rec.ttft_s * 1000.0},
            )
        return rec

    def spawn(self, intended_at: float, cls: str | None = None) -> None:
        """An open-loop send of class ``cls`` at its intended time: into the pool, or
        ``dropped``."""
        cls = cls or self.default_class
        if self.pool.full():
            self.stats.dropped(cls)
            if self.fire_request is not None:
                self.fire_request(
                    request_type="POST",
                    name=self.names[cls],
                    response_time=0.0,
                    response_length=0,
                    exception=StreamFailed("dropped: the in-flight cap was reached"),
                    context={},
                )
            return
        self.pool.spawn(self.send, intended_at, None, cls)

    def run_open(self, rng: random.Random, pick: Callable[[], str] | None = None) -> None:
        """Walk one user's Poisson schedule at ``rate_per_user`` (arrivals drawn from
        ``rng``, each request's class from ``pick``: default, the first class) until
        stopped."""
        segment = arrivals.Segment(0.0, float("inf"), self.settings.rate_per_user)
        origin = self.clock()
        for t in arrivals.poisson_offsets([segment], rng):
            due = origin + t
            delay = due - self.clock()
            if delay > 0:
                gevent.sleep(delay)
            if self.stopping:
                return
            self.spawn(due, None if pick is None else pick())

    def run_closed(self, pick: Callable[[], str] | None = None) -> None:
        """Send back to back on one connection of this user's (each request's class from
        ``pick``) until stopped."""
        conn = http.Connection(self.host, self.port, client=self.client)
        try:
            while not self.stopping:
                rec = self.send(self.clock(), conn, None if pick is None else pick())
                if rec.status is None:
                    gevent.sleep(0.05)  # no answer at all: do not spin on a refused connect
        finally:
            conn.close()

    def finish(self, grace_s: float | None = None) -> dict[str, Any]:
        """Stop sending, wait for the streams out (at most ``grace_s``, default the stream
        deadline; those still out then are killed and counted ``cancelled``), and return
        this process's statistics as a ``StreamStats.drain()`` delta."""
        self.stopping = True
        self.pool.join(timeout=self.settings.limits.deadline_s if grace_s is None else grace_s)
        self.pool.kill(block=True, timeout=5.0)
        self.conns.close()
        return self.stats.drain()


class StreamingUser(User):
    """Runs the process's ``StreamEngine``: open loop when its rate per user is > 0, else
    closed loop. A locustfile sets ``engine_factory`` (called once per process)."""

    abstract = True
    engine_factory: Callable[[Any], StreamEngine] | None = None
    _engines: dict[int, StreamEngine] = {}
    _building = gevent.lock.BoundedSemaphore()

    def engine(self) -> StreamEngine:
        """The process's engine, built by the first user that asks (the others wait)."""
        env = self.environment
        with StreamingUser._building:
            engine = StreamingUser._engines.get(id(env))
            if engine is None:
                factory = type(self).engine_factory
                if factory is None:
                    raise RuntimeError("StreamingUser.engine_factory is not set by the locustfile")
                engine = StreamingUser._engines[id(env)] = factory(env)
        return engine

    @classmethod
    def forget_engine(cls, environment: Any) -> None:
        """Drop ``environment``'s engine (finished); the next user builds a new one."""
        StreamingUser._engines.pop(id(environment), None)

    @classmethod
    def engine_of(cls, environment: Any) -> StreamEngine | None:
        """The engine of ``environment``'s process, if a user built one."""
        return StreamingUser._engines.get(id(environment))

    @task
    def stream(self) -> None:
        engine = self.engine()
        worker = getattr(self.environment.runner, "worker_index", 0) or 0
        user = engine.user_index()
        pick = engine.class_picker(worker, user)
        if engine.settings.rate_per_user > 0:
            engine.run_open(engine.arrival_rng(worker, user), pick)
        else:
            engine.run_closed(pick)
        while True:  # stopped: idle until Locust stops the user (returning would loop)
            gevent.sleep(1.0)
