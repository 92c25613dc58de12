"""The streaming user's Locust wiring: its options, and its statistics gathered at the end.

A locustfile imports ``LLMUser`` from here (``locustfiles/llm.py``); importing registers
the ``--llm-*`` options and the listeners below on ``locust.events``.

At the end of a test (``test_stop``): standalone, the process's engine stops sending,
waits for its streams out and its statistics are final. Distributed, the master asks
every worker for its final statistics (message ``llm_streams_stop``); each worker stops
sending, waits for its streams out (at most the stream deadline) and answers with its
``StreamStats.drain()`` delta (``llm_streams_final``); the master merges the histograms
exactly and waits for every worker asked (at most the deadline and 10 s more; a worker
that did not answer is named in the summary's ``missing_workers``). The master (or the
standalone process) then logs the summary as one JSON line and writes it to
``--llm-summary`` when given.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import gevent
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from harness.load.stream_http import StreamLimits
from harness.load.stream_recording import StreamStats
from harness.load.stream_user import StreamEngine, StreamingUser, StreamSettings, parse_classes

__all__ = ["LLMUser"]

log = logging.getLogger("harness.load.stream")

STOP_MESSAGE = "llm_streams_stop"
FINAL_MESSAGE = "llm_streams_final"
ANSWER_MARGIN_S = 10.0


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    group = parser.add_argument_group("llm streams", "the streaming LLM user (locustfiles/llm.py)")
    group.add_argument("--llm-model", default=None, help="model name (default: /v1/models' first)")
    group.add_argument("--llm-api", default="chat", choices=["chat", "completions"])
    group.add_argument("--llm-max-tokens", type=int, default=64, help="output tokens per request")
    group.add_argument("--llm-prompt-tokens", type=int, default=32, help="prompt words per request")
    group.add_argument(
        "--llm-rate",
        type=float,
        default=1.0,
        help="requests/s per user, Poisson arrivals (open loop); 0: closed loop, back to back",
    )
    group.add_argument("--llm-deadline", type=float, default=120.0, help="per-stream deadline, s")
    group.add_argument(
        "--llm-stall", type=float, default=30.0, help="stall timer: s without a byte"
    )
    group.add_argument(
        "--llm-verify",
        default="auto",
        choices=["auto", "on", "off"],
        help="check every stream against the reference server's output (auto: when it is one)",
    )
    group.add_argument(
        "--llm-classes",
        default="",
        help="traffic classes NAME:SHARE[:PRIORITY],... (e.g. high:0.2:1,low:0.8:2): each "
        "request draws one by share and sends its priority (vLLM's field; lower first)",
    )
    group.add_argument("--llm-summary", default=None, help="write the JSON summary to this file")


def settings_from(environment: Any) -> StreamSettings:
    o = environment.parsed_options
    if not environment.host:
        raise ValueError(
            "no --host given: pass the server's URL, e.g. --host http://127.0.0.1:8000"
        )
    return StreamSettings(
        base_url=environment.host,
        model=o.llm_model,
        api=o.llm_api,
        max_tokens=o.llm_max_tokens,
        prompt_tokens=o.llm_prompt_tokens,
        rate_per_user=o.llm_rate,
        limits=StreamLimits(deadline_s=o.llm_deadline, stall_s=o.llm_stall),
        verify={"auto": None, "on": True, "off": False}[o.llm_verify],
        classes=parse_classes(o.llm_classes) if o.llm_classes else (),
    )


def _build(environment: Any) -> StreamEngine:
    return StreamEngine(settings_from(environment), fire_request=environment.events.request.fire)


class LLMUser(StreamingUser):
    """Streams chat or completions from ``--host`` (see ``harness.load.stream_user``)."""

    engine_factory = staticmethod(_build)


class _Gathered:
    """The master's merge of the workers' finals (or the standalone process's own)."""

    def __init__(self) -> None:
        self.stats = StreamStats()
        self.answered: set[str] = set()
        self.summary: dict[str, Any] | None = None


_gathered: dict[int, _Gathered] = {}


def _final_delta(environment: Any) -> dict[str, Any]:
    engine = StreamingUser.engine_of(environment)
    return {} if engine is None else engine.finish()


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if not hasattr(environment.parsed_options or object(), "llm_api"):
        return
    if environment.parsed_options.llm_classes:
        try:  # bad input stops the run before any load, naming the fix
            parse_classes(environment.parsed_options.llm_classes)
        except ValueError as exc:
            log.error("%s", exc)
            sys.exit(2)
    runner = environment.runner
    _gathered[id(environment)] = _Gathered()
    if isinstance(runner, WorkerRunner):

        def on_stop(environment: Any, msg: Any, **_: Any) -> None:
            environment.runner.send_message(FINAL_MESSAGE, _final_delta(environment))

        runner.register_message(STOP_MESSAGE, on_stop, concurrent=True)
    elif isinstance(runner, MasterRunner):

        def on_final(environment: Any, msg: Any, **_: Any) -> None:
            gathered = _gathered[id(environment)]
            gathered.stats.merge(msg.data or {})
            gathered.answered.add(msg.node_id)

        runner.register_message(FINAL_MESSAGE, on_final)


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    """A new test (the web UI's next run): a fresh engine and fresh statistics."""
    if id(environment) in _gathered:
        StreamingUser.forget_engine(environment)
        _gathered[id(environment)] = _Gathered()


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_: Any) -> None:
    gathered = _gathered.get(id(environment))
    runner = environment.runner
    if gathered is None or isinstance(runner, WorkerRunner) or gathered.summary is not None:
        return
    missing: list[str] = []
    if isinstance(runner, MasterRunner):
        asked = [c.id for c in runner.clients.all]
        for client_id in asked:
            runner.send_message(STOP_MESSAGE, None, client_id)
        wait_s = environment.parsed_options.llm_deadline + ANSWER_MARGIN_S
        with gevent.Timeout(wait_s, False):
            while not gathered.answered.issuperset(asked):
                gevent.sleep(0.05)
        missing = sorted(set(asked) - gathered.answered)
    else:
        gathered.stats.merge(_final_delta(environment))
    summary = {**gathered.stats.summary(), "missing_workers": missing}
    gathered.summary = summary
    text = json.dumps(summary, sort_keys=True)
    log.info("llm streams summary: %s", text)
    path = environment.parsed_options.llm_summary
    if path:
        Path(path).write_text(text + "\n")
