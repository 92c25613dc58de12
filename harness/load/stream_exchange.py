"""One streamed request of a scenario run: read as it arrives, judged, recorded twice.

The load engine (``harness.load.users.Engine``) hands a streaming protocol's request here
(``--protocol openai``). ``StreamExchange.exchange_pool`` reads the answer event by event
(``harness.load.stream_http.exchange_stream``), timed from the request's **intended** send
time like every other request of the run, and

- returns the request's **outcome** for the run's ordinary counters, so every existing
  check (error rate, p99 of end-to-end time, recovery, soak trends) reads a stream as one
  request: ``ok``; ``http_NNN``; ``connection`` (no answer); ``timeout`` (the run's
  ``request_timeout_s`` ended it); ``stall`` (no byte for ``stall_s``); ``truncated``
  (the stream ended without its finish reason or ended inside an event);
  ``error_in_stream`` (an error object under a 200); ``no_tokens``; ``bad_response``
  (an event that is not JSON); ``cross_wired`` (the tokens are not this request's: with
  the reference server's oracle only); ``aborted`` (the scenario's client aborts,
  ``harness.load.stream_aborts``, hung up on it mid-stream: neither ok nor failed);
- records the stream into the recording's token statistics by traffic class and by stage
  (``Recording.tokens``): TTFT, TPOT, inter-token gaps, tokens in and out, and every
  problem code seen — a wrong ``usage``, a missing ``[DONE]`` or usage chunk, data after
  ``[DONE]`` are counted there (``llm.stream_integrity``) without failing the request.
  ``usage`` is wrong when it differs from the reference tokenizer's count of the text
  (with ``verify``: the reference server) or, from any other server, when it is below
  its token-bearing events (it may merge tokens into one event; its tokenizer is not ours);
- with ``expected`` (the reference server's oracle, one per pool input) checks the text,
  finish reason and ``usage`` of every stream, and counts the run's integrity results
  (``ok`` / ``cross_wired``) as the V2 golden check does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.load import http
from harness.load.recording import Recording
from harness.load.stream_aborts import ClientAborts, client_aborts
from harness.load.stream_http import StreamLimits, exchange_stream
from harness.load.stream_recording import stage_class_key
from harness.protocols.openai_stream import Expectation, ProblemCode, StreamRecord

# the outcome a failed stream counts as, by its first failing problem (in this order)
_OUTCOMES: tuple[tuple[ProblemCode, str], ...] = (
    (ProblemCode.DEADLINE, "timeout"),
    (ProblemCode.STALL, "stall"),
    (ProblemCode.ERROR_IN_STREAM, "error_in_stream"),
    (ProblemCode.MALFORMED_EVENT, "bad_response"),
    (ProblemCode.TRUNCATED_AT_CLOSE, "truncated"),
    (ProblemCode.NO_FINISH_REASON, "truncated"),
    (ProblemCode.TRANSPORT_ERROR, "truncated"),
    (ProblemCode.NO_TOKENS, "no_tokens"),
)
# the stall timer when the run's timeout is longer: a stream without one byte for this
# long is stalled whatever its length (vLLM's own keep-alive is far shorter)
STALL_S = 30.0


def expectations(inputs: Sequence[Mapping[str, Any]]) -> list[Expectation]:
    """The reference server's answer to each pool input (its oracle)."""
    return [expectation_of(i["body"]) for i in inputs]


def client_aborts_of(scenario: Any) -> ClientAborts | None:
    """The client aborts of ``scenario``'s ``[llm]`` table (None: none, or no table)."""
    if not scenario.llm:
        return None
    from harness.load.llm_workload import config_from_table

    cfg = config_from_table(dict(scenario.llm), scenario.source)
    return client_aborts(cfg.abort_share, cfg.abort_after, cfg.abort_stages)


def outcome_of(rec: StreamRecord) -> str:
    """The run's outcome for one stream (see the module docstring)."""
    if rec.status is None:
        return "connection"
    if rec.status != 200:
        return f"http_{rec.status}"
    codes = rec.codes()
    for code, outcome in _OUTCOMES:
        if code in codes:
            return outcome
    if ProblemCode.WRONG_TEXT in codes:
        return "cross_wired"
    return "aborted" if rec.aborted else "ok"


class StreamExchange:
    """The streaming half of one load process's engine."""

    def __init__(
        self,
        inputs: Sequence[Mapping[str, Any]],
        recording: Recording,
        timeout_s: float,
        verify: bool,
        clock: Callable[[], float] = time.perf_counter,
        aborts: ClientAborts | None = None,
        seed: int = 1,
        slot: int = 0,
    ) -> None:
        self.recording = recording
        # which streams hang up mid-stream, after how many token events (None: none do)
        self._abort_after = None if aborts is None else aborts.picker(seed, slot)
        self.clock = clock
        self.limits = StreamLimits(deadline_s=timeout_s, stall_s=min(timeout_s, STALL_S))
        self.prompt_tokens = [i.get("prompt_tokens") for i in inputs]
        self.expected: list[Expectation] | None = expectations(inputs) if verify else None
        # the reference server's tokenizer counts its events; any other server's tokens are
        # its own (its usage is then checked against the token-bearing events, one each)
        self.recorder_options: dict[str, Any] = {} if verify else {"count_tokens": None}
        if not all(i.get("include_usage", True) for i in inputs):
            # the workload did not ask for usage (include_usage = false): none is no problem
            self.recorder_options["usage_requested"] = False

    def dropped(self, cls: str, stage: str) -> None:
        """A request the in-flight cap kept from being sent: not a whole answer
        (``llm.goodput`` and the p99 checks count it)."""
        for key, name in (
            ("class", cls),
            ("stage", stage),
            ("stage_class", stage_class_key(stage, cls)),
        ):
            self.recording.tokens[key].dropped(name)

    def exchange_pool(
        self,
        conn: http.Connection,
        raw: bytes,
        index: int,
        cls: str,
        stage: str,
        due: float,
        t: float,
    ) -> tuple[str, StreamRecord]:
        """Send pool input ``index`` (``raw``) on ``conn``, read its stream, record it:
        (outcome, the stream's record; its text starts a conversation's next turn)."""
        expected = self.expected[index] if self.expected is not None else None
        return self.exchange_request(
            conn, raw, expected, self.prompt_tokens[index], cls, stage, due, t, index
        )

    @property
    def verifying(self) -> bool:
        """Whether each stream is held to the reference server's oracle."""
        return self.expected is not None

    def exchange_request(
        self,
        conn: http.Connection,
        raw: bytes,
        expected: Expectation | None,
        prompt_tokens: int | None,
        cls: str,
        stage: str,
        due: float,
        t: float,
        index: int | None = None,
    ) -> tuple[str, StreamRecord]:
        """Send ``raw`` on ``conn``, read its stream, record it: (outcome, the stream's
        record). ``expected`` and ``prompt_tokens`` are this request's (a conversation's
        later turn is in no pool); ``index`` names its pool input in integrity details."""
        rec = exchange_stream(
            conn,
            raw,
            self.limits,
            intended_at=due,
            clock=self.clock,
            expected=expected,
            prompt_tokens=prompt_tokens,
            abort_after=None if self._abort_after is None else self._abort_after(stage),
            **self.recorder_options,
        )
        outcome = outcome_of(rec)
        tokens = self.recording.tokens
        tokens["class"].record(cls, rec, verified=expected is not None)
        tokens["stage"].record(stage, rec, verified=expected is not None)
        tokens["stage_class"].record(
            stage_class_key(stage, cls), rec, verified=expected is not None
        )
        self.recording.stream_ended(cls, t, rec)
        if expected is not None and rec.status == 200 and not rec.failed:
            if outcome == "cross_wired":
                self.recording.integrity_result(
                    "cross_wired",
                    {"sent_input": index, "t": round(t, 3), "text_start": rec.text[:80]},
                )
            else:
                self.recording.integrity_result("ok")
        return outcome, rec


def expectation_of(body: Mapping[str, Any]) -> Expectation:
    """The reference server's answer to one request body (its oracle)."""
    from harness.protocols.openai import reference_expectation

    return Expectation.from_completion(reference_expectation(body))
