"""One OpenAI-compatible stream, recorded: its timings, its tokens and what is wrong with it.

A client feeds ``StreamRecorder`` what it reads — the status when the headers arrive,
then the body's bytes as they arrive, each with the time it read them — and calls
``finish`` when the body ends (or the connection fails). ``finish`` returns a
``StreamRecord``. All times are in the caller's clock (one clock for one stream;
``time.perf_counter`` in a load generator); the record's durations are seconds from the
request's **intended** send time, so a client that sends late (a busy generator, an
open-loop schedule that fell behind) counts its lateness in every latency, as MLPerf
LoadGen measures from the scheduled time; ``dispatch_delay_s`` says how late it was.

What the record guarantees (docs/llm-metrics.md defines each and compares them with
vLLM, SGLang, GuideLLM, AIPerf and MLPerf):

- ``headers_s``: time to the response headers; ``first_event_s``: to the first event of
  any kind (a role chunk included); ``ttft_s``: to the first **token-bearing** event
  (``harness.protocols.openai``: non-empty content, reasoning, tool-call or refusal text;
  a role chunk or an empty delta is not a token); ``end_s``: to the end of the body.
- ``token_times_s`` / ``token_counts``: each token-bearing event's time and token count.
  An event's count is the server tokenizer's count of its text (``count_tokens``; the
  reference server's is the default), at least 1; without a tokenizer (``None``) every
  event counts 1 (``event_tokens_from``). ``output_tokens`` is ``usage.completion_tokens``
  when the server sent it, else the sum of the events' counts (``tokens_from``:
  ``"usage"``, ``"tokenizer"`` or ``"events"``).
- ``max_gap_s``: the longest time between two consecutive token-bearing events.
- ``problems``: every ``Problem`` found, each a code of ``ProblemCode`` and a sentence.
  ``failed`` is True when one of them means the request did not get a whole answer (an
  error status or object, a broken connection, a malformed event, a stream cut before
  its finish reason — truncated — or one that never sent a token): such a request is
  non-conforming for goodput. A body that ends inside an event after the finish reason
  (a ``data: [DONE]`` without its blank line) is reported (``truncated_at_close``) but
  the answer was whole.
- ``aborted``: the **client** closed the connection on purpose after some token events
  (a load that simulates users hanging up): the stream is neither failed nor whole; its
  missing finish reason, ``[DONE]`` and ``usage`` are not problems, its text is checked
  as a prefix of the expected answer.
- A stream the **client's** deadline or stall timer ended (``deadline`` / ``stall``) failed
  — it is non-conforming, a load outcome the latency and goodput checks judge — but the
  server did not end it: like an aborted one, its missing finish reason and ``[DONE]``
  and the event it was cut in are not further problems, its text is checked as a prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from harness.protocols.openai import Chunk, Usage, read_chunk
from harness.protocols.sse import SSEEvent, SSEParser
from harness_reference_server.llm.tokens import Completion, count_tokens

TokenCounter = Callable[[str], int]
_ERROR_BODY_LIMIT = 2048


class ProblemCode(StrEnum):
    """What can be wrong with a stream, declared once."""

    HTTP_ERROR = "http_error"  # the status is not 2xx
    TRANSPORT_ERROR = "transport_error"  # the connection failed (the caller says how)
    DEADLINE = "deadline"  # the client's end-to-end deadline ended the stream
    STALL = "stall"  # the client's stall timer ended the stream (no byte for too long)
    ERROR_IN_STREAM = "error_in_stream"  # an error object after the headers (under a 200)
    NO_FINISH_REASON = "no_finish_reason"  # the stream ended without a finish_reason
    TRUNCATED_AT_CLOSE = "truncated_at_close"  # the body ended inside an event
    NO_TOKENS = "no_tokens"  # not one token-bearing event
    MALFORMED_EVENT = "malformed_event"  # an event that is not a JSON object
    NO_DONE = "no_done"  # no data: [DONE]
    DATA_AFTER_DONE = "data_after_done"  # events after data: [DONE]
    NO_USAGE = "no_usage"  # include_usage was asked, no usage came
    USAGE_MISMATCH = "usage_mismatch"  # usage.completion_tokens is not the tokens sent
    WRONG_TEXT = "wrong_text"  # the text is not the expected completion's
    WRONG_FINISH_REASON = "wrong_finish_reason"  # not the expected completion's


# the client's own timers: a stream they end is a failure, but not one the server's
# stream is to blame for beyond being late (no finish reason or [DONE] to expect)
CLIENT_CUTS = frozenset({ProblemCode.DEADLINE, ProblemCode.STALL})

# the problems that leave a request without a whole answer: non-conforming for goodput
FAILURES = frozenset(
    {
        ProblemCode.HTTP_ERROR,
        ProblemCode.TRANSPORT_ERROR,
        ProblemCode.DEADLINE,
        ProblemCode.STALL,
        ProblemCode.ERROR_IN_STREAM,
        ProblemCode.NO_FINISH_REASON,
        ProblemCode.NO_TOKENS,
        ProblemCode.MALFORMED_EVENT,
    }
)


@dataclass(frozen=True, slots=True)
class Problem:
    code: ProblemCode
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


@dataclass(frozen=True)
class Expectation:
    """The answer a stream must carry: the reference server's (``from_completion``, its
    oracle) or a golden answer recorded from a clean stream at temperature 0
    (``golden``). A field left None is not checked."""

    text: str
    finish_reason: str | None = None
    completion_tokens: int | None = None

    @classmethod
    def from_completion(cls, completion: Completion) -> Expectation:
        return cls(completion.text, completion.finish_reason, completion.completion_tokens)

    @classmethod
    def golden(cls, record: StreamRecord) -> Expectation:
        """The answer ``record`` carried, to check later streams of the same request
        against; ValueError if the record has any problem (a golden answer must be clean)."""
        if record.problems:
            raise ValueError(
                "a golden answer needs a clean stream; this one has: "
                + "; ".join(str(p) for p in record.problems)
            )
        tokens = record.usage.completion_tokens if record.usage else None
        return cls(record.text, record.finish_reason, tokens)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able form (a golden answer kept in a file); ``from_dict`` reads it."""
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Expectation:
        """The expectation ``as_dict`` wrote; ValueError naming the field that is wrong."""
        if not isinstance(doc, dict):
            raise ValueError(f"an expected answer has value {doc!r}; expected an object")
        text, reason, tokens = (doc.get(k) for k in ("text", "finish_reason", "completion_tokens"))
        if not isinstance(text, str):
            raise ValueError(f"an expected answer's 'text' has value {text!r}; expected a string")
        if reason is not None and not isinstance(reason, str):
            raise ValueError(
                f"an expected answer's 'finish_reason' has value {reason!r}; expected a string or null"
            )
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
            raise ValueError(
                f"an expected answer's 'completion_tokens' has value {tokens!r}; "
                "expected an integer or null"
            )
        return cls(text, reason, tokens)


@dataclass(frozen=True)
class StreamRecord:
    """One stream, recorded (see the module docstring for each field's guarantee)."""

    intended_at: float  # the caller's clock
    dispatch_delay_s: float
    status: int | None
    headers_s: float | None
    first_event_s: float | None
    ttft_s: float | None
    end_s: float
    token_times_s: tuple[float, ...]
    token_counts: tuple[int, ...]
    output_tokens: int
    tokens_from: str  # "usage", "tokenizer" or "events"
    event_tokens_from: str  # "tokenizer" or "events"
    prompt_tokens: int | None
    finish_reason: str | None
    usage: Usage | None
    done: bool
    events: int  # data events, [DONE] included
    comments: int  # SSE comment lines (keep-alives)
    text: str  # the content (chat) or text (completions) streamed
    problems: tuple[Problem, ...]
    aborted: bool = False  # the client hung up on purpose mid-stream (see the docstring)

    @property
    def failed(self) -> bool:
        """The request got no whole answer: non-conforming, whatever its timings."""
        return any(p.code in FAILURES for p in self.problems)

    @property
    def max_gap_s(self) -> float | None:
        """The longest time between consecutive token-bearing events (None: < 2)."""
        t = self.token_times_s
        return max((b - a for a, b in zip(t, t[1:], strict=False)), default=None)

    def codes(self) -> set[ProblemCode]:
        return {p.code for p in self.problems}


class StreamRecorder:
    """Records one stream as it is read; ``finish`` returns its ``StreamRecord``.

    ``sent_at`` is when the request was written; ``intended_at`` when it should have been
    (default: ``sent_at``). ``expected``: the answer to check the text against (None: not
    checked). ``count_tokens``: the server's tokenizer (None: one token per event).
    ``usage_requested``: the request asked for ``include_usage`` (its absence is then a
    problem). ``prompt_tokens``: the prompt's token count when the server's usage does
    not say it."""

    def __init__(
        self,
        sent_at: float,
        *,
        intended_at: float | None = None,
        expected: Expectation | None = None,
        count_tokens: TokenCounter | None = count_tokens,
        usage_requested: bool = True,
        prompt_tokens: int | None = None,
    ) -> None:
        self.intended_at = sent_at if intended_at is None else intended_at
        self.sent_at = sent_at
        self.expected = expected
        self.count_tokens = count_tokens
        self.usage_requested = usage_requested
        self.prompt_tokens = prompt_tokens
        self.parser = SSEParser()
        self.status: int | None = None
        self.headers_at: float | None = None
        self.first_event_at: float | None = None
        self.token_times: list[float] = []
        self.token_counts: list[int] = []
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.done = False
        self.events = 0
        self.errors: list[str] = []
        self.malformed: list[str] = []
        self.after_done = 0
        self._error_body = b""

    def headers(self, status: int, at: float) -> None:
        """The response's status line and headers arrived at ``at``."""
        self.status, self.headers_at = status, at

    @property
    def ok_status(self) -> bool:
        return self.status is None or 200 <= self.status < 300

    def feed(self, data: bytes, at: float) -> None:
        """Body bytes read at ``at`` (any split)."""
        if not self.ok_status:
            if len(self._error_body) < _ERROR_BODY_LIMIT:
                self._error_body += data[: _ERROR_BODY_LIMIT - len(self._error_body)]
            return
        for event in self.parser.feed(data, at):
            self.event(event)

    def event(self, event: SSEEvent) -> None:
        """One parsed event (``feed`` calls it; a caller with its own parser may too)."""
        self.events += 1
        if self.first_event_at is None:
            self.first_event_at = event.at
        if self.done:
            self.after_done += 1
            return
        self.chunk(read_chunk(event.data, event.event), event.at)

    def chunk(self, chunk: Chunk, at: float) -> None:
        """One chunk read at ``at`` (``event`` calls it)."""
        if chunk.done:
            self.done = True
            return
        if chunk.error is not None:
            self.errors.append(chunk.error)
            return
        if chunk.malformed is not None:
            self.malformed.append(chunk.malformed)
            return
        if chunk.token_bearing:
            text = chunk.output_text
            count = 1 if self.count_tokens is None else max(1, self.count_tokens(text))
            self.token_times.append(at)
            self.token_counts.append(count)
            self.text.append(chunk.content)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    def finish(
        self, at: float, transport_error: str | Problem | None = None, aborted: bool = False
    ) -> StreamRecord:
        """The body ended at ``at`` (or the connection failed: ``transport_error``, a
        sentence recorded as ``transport_error``, or a ``Problem`` recorded as given — a
        client's deadline or stall timer; or the client closed it on purpose: ``aborted``,
        what was read so far is judged as the start of an answer)."""
        # a stream the client ended (on purpose, or at its deadline or stall timer): what
        # the server did not get to send is not the server's problem
        cut_by_client = aborted or (
            isinstance(transport_error, Problem) and transport_error.code in CLIENT_CUTS
        )
        truncated = self.parser.close(at) if self.ok_status and not cut_by_client else None
        if truncated is not None:
            malformed = len(self.malformed)
            self.event(truncated)
            del self.malformed[malformed:]  # a cut event's JSON is cut too: truncation says it
        ended_mid_event = self.parser.ended_mid_event
        problems = self._problems(
            transport_error, ended_mid_event and not cut_by_client, cut_by_client
        )
        counted = sum(self.token_counts)
        usage_tokens = self.usage.completion_tokens if self.usage else None
        t0 = self.intended_at
        return StreamRecord(
            intended_at=t0,
            dispatch_delay_s=self.sent_at - t0,
            status=self.status,
            headers_s=None if self.headers_at is None else self.headers_at - t0,
            first_event_s=None if self.first_event_at is None else self.first_event_at - t0,
            ttft_s=self.token_times[0] - t0 if self.token_times else None,
            end_s=at - t0,
            token_times_s=tuple(t - t0 for t in self.token_times),
            token_counts=tuple(self.token_counts),
            output_tokens=counted if usage_tokens is None else usage_tokens,
            tokens_from="usage" if usage_tokens is not None else self._event_source(),
            event_tokens_from=self._event_source(),
            prompt_tokens=(
                self.usage.prompt_tokens
                if self.usage and self.usage.prompt_tokens is not None
                else self.prompt_tokens
            ),
            finish_reason=self.finish_reason,
            usage=self.usage,
            done=self.done,
            events=self.events,
            comments=self.parser.comments,
            text="".join(self.text),
            problems=tuple(problems),
            aborted=aborted,
        )

    def _event_source(self) -> str:
        return "events" if self.count_tokens is None else "tokenizer"

    def _problems(
        self,
        transport_error: str | Problem | None,
        ended_mid_event: bool,
        cut_by_client: bool = False,
    ) -> list[Problem]:
        out: list[Problem] = []

        def add(code: ProblemCode, detail: str) -> None:
            out.append(Problem(code, detail))

        if not self.ok_status:
            body = self._error_body.decode("utf-8", "replace")
            add(ProblemCode.HTTP_ERROR, f"HTTP {self.status}: {body[:200]}")
            return out
        if isinstance(transport_error, Problem):
            out.append(transport_error)
        elif transport_error is not None:
            add(ProblemCode.TRANSPORT_ERROR, transport_error)
        for message in self.errors:
            add(ProblemCode.ERROR_IN_STREAM, f"an error object under HTTP 200: {message}")
        for reason in self.malformed:
            add(ProblemCode.MALFORMED_EVENT, reason)
        if ended_mid_event:
            add(ProblemCode.TRUNCATED_AT_CLOSE, "the body ended inside an event (no blank line)")
        if self.finish_reason is None and not self.errors and not cut_by_client:
            add(ProblemCode.NO_FINISH_REASON, "the stream ended without a finish_reason")
        if not self.token_times and not self.errors:
            add(ProblemCode.NO_TOKENS, "not one token-bearing event")
        if not self.done and not cut_by_client:
            add(ProblemCode.NO_DONE, "the stream ended without data: [DONE]")
        if self.after_done:
            add(ProblemCode.DATA_AFTER_DONE, f"{self.after_done} events after data: [DONE]")
        self._usage_problems(add)
        self._expectation_problems(add)
        return out

    def _usage_problems(self, add: Callable[[ProblemCode, str], None]) -> None:
        sent = self.usage.completion_tokens if self.usage else None
        if sent is None:
            if self.usage_requested and not self.errors and self.finish_reason is not None:
                add(ProblemCode.NO_USAGE, "include_usage was asked; no usage chunk came")
            return
        counted, events = sum(self.token_counts), len(self.token_counts)
        if self.count_tokens is not None and sent != counted:
            add(
                ProblemCode.USAGE_MISMATCH,
                f"usage.completion_tokens is {sent}; the stream carried {counted} tokens",
            )
        elif self.count_tokens is None and sent < events:
            add(
                ProblemCode.USAGE_MISMATCH,
                f"usage.completion_tokens is {sent}, fewer than the {events} token-bearing events",
            )
        expected = self.expected.completion_tokens if self.expected else None
        if (
            expected is not None
            and self.count_tokens is None
            and self.finish_reason is not None
            and sent != expected
        ):
            add(
                ProblemCode.USAGE_MISMATCH,
                f"usage.completion_tokens is {sent}; the expected answer has {expected}",
            )

    def _expectation_problems(self, add: Callable[[ProblemCode, str], None]) -> None:
        if self.expected is None:
            return
        got, want = "".join(self.text), self.expected.text
        whole = self.finish_reason is not None and not self.errors
        if (got != want) if whole else not want.startswith(got):
            at = next(
                (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)),
            )
            add(
                ProblemCode.WRONG_TEXT,
                f"the text differs from the expected completion at character {at}: "
                f"got {got[at : at + 24]!r}, expected {want[at : at + 24]!r} "
                f"({len(got)} vs {len(want)} characters)",
            )
        want_reason = self.expected.finish_reason
        if whole and want_reason is not None and self.finish_reason != want_reason:
            add(
                ProblemCode.WRONG_FINISH_REASON,
                f"finish_reason is {self.finish_reason!r}; expected {want_reason!r}",
            )
