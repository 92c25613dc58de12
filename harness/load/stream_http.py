"""One streamed HTTP exchange, read as it arrives, for the LLM load user.

``exchange_stream`` sends a pre-built request on a ``harness.load.http.Connection`` (its
keep-alive socket, TLS and headers; ``Connection.ready_socket`` is the one hook it uses)
and hands the answer to a ``StreamRecorder`` (``harness.protocols.openai_stream``) piece
by piece: the status when the head is complete, then every body piece **as it was
read**, timed by the ``clock`` reading taken right after the ``recv`` that returned it.
Framing is decoded by geventhttpclient's C parser (llhttp) incrementally, so a chunked
body, a Content-Length body and a body read to the close all reach the recorder the
moment their bytes do; nothing is buffered to a block size first.

What it guarantees:

- **A cut stream is never a success.** A connection closed before the terminating chunk
  (chunked) or before Content-Length bytes is a ``transport_error`` ("truncated: ...");
  bytes read before the close are fed first, and an unterminated last line is passed on
  at close, so the recorder can classify it (``truncated_at_close``).
- **Two timers, two reasons.** ``deadline_s`` bounds the whole exchange from the moment
  it is sent (connect included); ``stall_s`` bounds the time without one byte read. The
  one that fires ends the stream as failed with its own problem code
  (``ProblemCode.DEADLINE`` or ``ProblemCode.STALL``).
- **A client abort is a real hang-up.** With ``abort_after`` = N, once N token-bearing
  events have been read (and no finish reason yet), the socket is closed — the server
  sees its client disconnect — and the record is ``aborted`` (not failed).
- **A connection is reused only after a clean end**: the message complete, the server
  not asking to close, no byte after it. Any failure, timer, error or cancellation
  (GreenletExit) closes it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from geventhttpclient.response import HTTPParseError, HTTPResponse

from harness.load import http
from harness.protocols.openai_stream import Problem, ProblemCode, StreamRecord, StreamRecorder

RECV_SIZE = 65536
STREAM_HEADERS = (("Accept", "text/event-stream"), ("Accept-Encoding", "identity"))


def stream_client(client: http.Client) -> http.Client:
    """``client`` with ``Accept: text/event-stream`` and ``Accept-Encoding: identity``
    added (a value the user gave for either is kept): a compressed stream cannot be read
    as it arrives."""
    given = {k.lower() for k, _ in client.headers}
    extra = tuple((k, v) for k, v in STREAM_HEADERS if k.lower() not in given)
    return replace(client, headers=client.headers + extra)


@dataclass(frozen=True)
class StreamLimits:
    """``deadline_s``: the whole exchange, from its send; ``stall_s``: without a byte."""

    deadline_s: float = 300.0
    stall_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("deadline_s", "stall_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} has value {value!r}; expected a duration > 0 s")


class _Answer(HTTPResponse):
    """The parser's callbacks, collecting instead of buffering: the body pieces of the
    current ``feed`` (handed on right after it), the head's status, the message's end
    and any byte that began another message after it."""

    def __init__(self, method: str) -> None:
        super().__init__(method=method)
        self.pieces: list[bytes] = []
        self.ended = False
        self.extra = False

    def _on_message_begin(self) -> None:
        if self.ended:
            self.extra = True  # bytes after the answer: never reuse the connection
            return
        super()._on_message_begin()

    def _on_body(self, buf: bytearray) -> None:
        if not self.ended:
            self.pieces.append(bytes(buf))

    def _on_message_complete(self) -> None:
        super()._on_message_complete()
        if self.headers_complete and self.get_code() >= 200:
            self.ended = True


def exchange_stream(
    conn: http.Connection,
    raw: bytes,
    limits: StreamLimits,
    *,
    intended_at: float | None = None,
    method: str = "POST",
    clock: Callable[[], float] = time.perf_counter,
    abort_after: int | None = None,
    **recorder_options: Any,
) -> StreamRecord:
    """Send ``raw`` (head and body) on ``conn`` and record the streamed answer.

    ``intended_at`` (``clock``'s time; default: the send) is what every duration of the
    record counts from; ``recorder_options`` go to ``StreamRecorder`` (``expected``,
    ``count_tokens``, ``usage_requested``, ``prompt_tokens``). ``abort_after``: close
    the connection after that many token-bearing events (a client that hangs up; None:
    read to the end). Never raises for what the server or the network did: each ends in
    the record's problems. A cancellation (GreenletExit) closes the connection and
    propagates."""
    sent_at = clock()
    recorder = StreamRecorder(sent_at, intended_at=intended_at, **recorder_options)
    deadline_at = sent_at + limits.deadline_s
    answer = _Answer(method)
    headed = False
    clean = False
    problem: Problem | str | None = None
    aborted = False
    at = sent_at
    try:
        sock = conn.ready_socket()
        sock.settimeout(max(deadline_at - clock(), 1e-6))
        sock.sendall(raw)
        while not answer.ended:
            left = deadline_at - clock()
            wait = min(limits.stall_s, left)
            if wait <= 0:
                at = clock()
                problem = _deadline(limits)
                break
            sock.settimeout(wait)
            try:
                data = sock.recv(RECV_SIZE)
            except TimeoutError:
                at = clock()
                problem = _deadline(limits) if wait >= left else _stall(limits)
                break
            at = clock()
            if not data:
                problem = _closed_early(answer, recorder, at, headed)
                break
            answer.feed(data)
            if not headed and answer.headers_complete and answer.get_code() >= 200:
                headed = True
                recorder.headers(answer.get_code(), at)
            if answer.pieces:
                for piece in answer.pieces:
                    recorder.feed(piece, at)
                answer.pieces.clear()
            if (
                abort_after is not None
                and not answer.ended
                and recorder.finish_reason is None
                and len(recorder.token_times) >= abort_after
            ):
                aborted = True  # the finally closes the socket: the server sees it now
                break
        else:
            clean = not answer.extra and not answer.should_close()
            sock.settimeout(None)
    except http.TLSFailed as exc:
        at, problem = clock(), str(exc)
    except TimeoutError:  # connecting or sending
        at = clock()
        problem = _deadline(limits) if at >= deadline_at else "connection failed: timed out"
    except HTTPParseError as exc:
        at, problem = clock(), f"invalid HTTP answer: {exc}"
    except OSError as exc:
        at, problem = clock(), f"connection failed: {exc or type(exc).__name__}"
    finally:
        if not clean:
            conn.close()
    return recorder.finish(at, transport_error=problem, aborted=aborted)


def _deadline(limits: StreamLimits) -> Problem:
    return Problem(
        ProblemCode.DEADLINE, f"the stream was not over {limits.deadline_s:g} s after its send"
    )


def _stall(limits: StreamLimits) -> Problem:
    return Problem(ProblemCode.STALL, f"no byte for {limits.stall_s:g} s")


def _closed_early(answer: _Answer, recorder: StreamRecorder, at: float, headed: bool) -> str | None:
    """The server closed the connection: the end of a body read to the close (None), or
    a truncated answer (its reason). Pieces the end of input completes are fed first."""
    if not headed:
        return "truncated: the connection closed before the answer's head"
    with contextlib.suppress(HTTPParseError):
        answer.feed(b"")  # ends a body read to the close; an incomplete one raises
    for piece in answer.pieces:
        recorder.feed(piece, at)
    answer.pieces.clear()
    if answer.ended:
        return None
    framing = "its terminating chunk" if answer.get("transfer-encoding") else "Content-Length bytes"
    return f"truncated: the connection closed before {framing}"
