"""The streamed exchange (harness/load/stream_http.py) against a scripted in-test server
that plants the measurement traps: a role chunk at accept, N tokens per event, \\r\\n line
ends, pieces cut inside an event, a connection closed mid-stream, a stall, a body that
ends without its blank line. The server notes the clock when it writes each piece (one
process, one clock), so each test checks that TTFT is the time the first token's event
was written, moved by less than one event's time."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import gevent
import pytest
from gevent.server import StreamServer

from harness.load import http
from harness.load.stream_http import StreamLimits, exchange_stream, stream_client
from harness.protocols.openai_stream import ProblemCode, StreamRecord
from harness.testing.llm_streams import DONE_EVENT, chunk_event
from harness.testing.raw_http import requests_on

GAP_S = 0.02  # the time between two events the server writes
LIMITS = StreamLimits(deadline_s=5.0, stall_s=2.0)
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class Script:
    """What the server does per connection: ("send", bytes) | ("sleep", s) | ("close",).
    ``sent`` gets (perf_counter after the write, bytes) for every send."""

    steps: Sequence[tuple]
    sent: list[tuple[float, bytes]] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)


def token_stream(tokens: Sequence[str], *, sep: bytes = b"\n\n", per_event: int = 1) -> list[bytes]:
    """The events of a clean chat stream: role, one event per item of ``tokens`` (each
    ``per_event`` tokens), finish, usage, DONE."""
    events = [chunk_event(role="assistant", content="", sep=sep)]
    events += [chunk_event(t, sep=sep) for t in tokens]
    events += [
        chunk_event(finish_reason="length", sep=sep),
        chunk_event(usage=(5, per_event * len(tokens)), sep=sep),
        DONE_EVENT.replace(b"\n\n", sep),
    ]
    return events


def chunked_script(events: Sequence[bytes], *, end: bool = True) -> list[tuple]:
    steps: list[tuple] = [("send", SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")]
    for event in events:
        steps += [("sleep", GAP_S), ("send", chunked(event))]
    if end:
        steps.append(("send", b"0\r\n\r\n"))
    return steps


@contextmanager
def serving(*scripts: Script) -> Iterator[http.Connection]:
    """A server playing ``scripts[i]`` on its i-th connection; a Connection to it."""
    queue = list(scripts)

    def handle(sock, _addr) -> None:
        script = queue.pop(0)
        head, _body = next(requests_on(sock), (None, None))
        if head is None:
            return
        script.requests.append(head)
        for step in script.steps:
            if step[0] == "send":
                sock.sendall(step[1])
                script.sent.append((time.perf_counter(), step[1]))
            elif step[0] == "sleep":
                gevent.sleep(step[1])
            else:
                break
        else:
            if queue:  # keep-alive: the next request on this connection plays the next script
                return handle(sock, _addr)
            gevent.sleep(10)
        sock.close()

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    conn = http.Connection("127.0.0.1", server.server_port)
    try:
        yield conn
    finally:
        conn.close()
        server.stop(timeout=1)


def request_bytes(port: int) -> bytes:
    body = b'{"model":"m","messages":[],"stream":true}'
    head = http.build_head(
        "POST", "/v1/chat/completions", "127.0.0.1", port, len(body), stream_client(http.Client())
    )
    return head + body


def run(conn: http.Connection, limits: StreamLimits = LIMITS) -> StreamRecord:
    return exchange_stream(conn, request_bytes(conn.port), limits, count_tokens=None)


def sent_at(script: Script, needle: bytes) -> float:
    """When the server wrote the first piece holding ``needle``."""
    return next(t for t, data in script.sent if needle in data)


def assert_ttft_at(rec: StreamRecord, written: float) -> None:
    """The first token-bearing event was read after it was written, by less than one
    event's time."""
    got = rec.intended_at + rec.ttft_s
    assert 0.0 <= got - written < GAP_S, (got - written, GAP_S)


def test_a_clean_chunked_stream_is_read_as_it_arrives_and_the_connection_kept() -> None:
    tokens = [" ab", " cd", " ef", " gh"]
    script = Script(chunked_script(token_stream(tokens)))
    again = Script(chunked_script(token_stream(tokens)))
    with serving(script, again) as conn:
        rec = run(conn)
        assert not rec.problems and not rec.failed
        assert rec.text == "".join(tokens) and rec.output_tokens == 4 and rec.done
        assert len(rec.token_times_s) == 4
        # every token event timed when its write arrived, not when the body ended
        for t, token in zip(rec.token_times_s, tokens, strict=True):
            got = rec.intended_at + t
            written = sent_at(script, token.encode())
            assert 0.0 <= got - written < GAP_S
        assert rec.end_s - rec.token_times_s[0] >= 6 * GAP_S * 0.9
        sock = conn.sock
        assert sock is not None  # reused: the message ended cleanly
        rec2 = run(conn)
        assert not rec2.problems and conn.sock is sock
    assert b"accept: text/event-stream" in script.requests[0].lower()
    assert b"accept-encoding: identity" in script.requests[0].lower()


def test_a_role_chunk_at_accept_does_not_move_the_ttft() -> None:
    events = token_stream([" ab", " cd"])
    steps = [("send", SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(events[0]))]
    steps += [("sleep", 0.1)]  # the prefill, after the role chunk went out
    steps += chunked_script(events[1:])[1:]
    script = Script(steps)
    with serving(script) as conn:
        rec = run(conn)
    assert not rec.problems
    assert_ttft_at(rec, sent_at(script, b" ab"))
    assert rec.ttft_s - rec.first_event_s >= 0.1 * 0.9


def test_n_tokens_per_event_crlf_lines_and_pieces_cut_inside_an_event() -> None:
    tokens = [" ab cd ef", " gh ij kl", " mn op qr"]
    body = b"".join(token_stream(tokens, sep=b"\r\n\r\n", per_event=3))
    first = body.index(b" ab cd ef")
    # cut inside the first token's data line, inside a \r\n pair, and mid-JSON elsewhere
    cuts = [first - 7, first + 4, body.index(b"\r\n", first) + 1, len(body) // 2 + 3, len(body)]
    pieces = [body[a:b] for a, b in zip([0, *cuts], cuts, strict=False)]
    steps: list[tuple] = [("send", SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")]
    for piece in pieces:
        steps += [("sleep", GAP_S), ("send", chunked(piece))]
    steps.append(("send", b"0\r\n\r\n"))
    script = Script(steps)
    with serving(script) as conn:
        rec = exchange_stream(conn, request_bytes(conn.port), LIMITS)  # the tokenizer counts
    assert not rec.problems and rec.text == "".join(tokens)
    assert rec.token_counts == (3, 3, 3) and rec.output_tokens == 9
    # the first token event is complete only with the piece holding its blank line
    completing = next(t for t, data in script.sent if data == chunked(pieces[3]))
    assert_ttft_at(rec, completing)


def test_a_connection_closed_mid_stream_is_a_truncated_transport_failure() -> None:
    events = token_stream([" ab", " cd", " ef"])
    script = Script([*chunked_script(events[:3], end=False), ("sleep", GAP_S), ("close",)])
    with serving(script) as conn:
        rec = run(conn)
        assert conn.sock is None  # never reused
    assert rec.failed
    transport = [p for p in rec.problems if p.code == ProblemCode.TRANSPORT_ERROR]
    assert transport and "truncated" in transport[0].detail
    assert "terminating chunk" in transport[0].detail
    assert rec.text == " ab cd"
    assert_ttft_at(rec, sent_at(script, b" ab"))


def test_a_content_length_body_cut_short_is_truncated_too() -> None:
    body = b"".join(token_stream([" ab", " cd"]))
    head = SSE_HEAD + b"Content-Length: %d\r\n\r\n" % (len(body) + 40)
    script = Script([("send", head + body), ("sleep", GAP_S), ("close",)])
    with serving(script) as conn:
        rec = run(conn)
    assert rec.failed and rec.text == " ab cd" and rec.done
    assert any("Content-Length" in p.detail for p in rec.problems)


def test_a_body_read_to_the_close_without_its_last_blank_line_is_whole_but_reported() -> None:
    body = b"".join(token_stream([" ab", " cd"]))[: -len(b"\n\n")]  # "data: [DONE]" unended
    script = Script([("send", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body), ("close",)])
    with serving(script) as conn:
        rec = run(conn)
        assert conn.sock is None
    assert not rec.failed and rec.done and rec.text == " ab cd"
    assert rec.codes() == {ProblemCode.TRUNCATED_AT_CLOSE}


def test_an_unterminated_token_line_at_a_cut_is_passed_on_to_the_recorder() -> None:
    events = token_stream([" ab", " cd"])
    cut = chunked(events[1] + events[2][:-2])  # the second token's event without "\n\n"
    steps = [*chunked_script(events[:1], end=False), ("send", cut), ("close",)]
    with serving(Script(steps)) as conn:
        rec = run(conn)
    assert rec.failed and rec.text == " ab cd"  # the unended event was read
    assert {ProblemCode.TRANSPORT_ERROR, ProblemCode.TRUNCATED_AT_CLOSE} <= rec.codes()


def test_the_stall_timer_and_the_deadline_end_a_stream_with_their_own_reasons() -> None:
    events = token_stream([" ab", " cd"])
    stalled = Script([*chunked_script(events[:2], end=False), ("sleep", 5.0)])
    with serving(stalled) as conn:
        start = time.perf_counter()
        rec = run(conn, StreamLimits(deadline_s=3.0, stall_s=0.15))
        took = time.perf_counter() - start
        assert conn.sock is None
    assert rec.failed and ProblemCode.STALL in rec.codes()
    assert ProblemCode.DEADLINE not in rec.codes() and rec.text == " ab"
    assert took < 1.0  # the stall timer, not the deadline, ended it

    # keep-alive comments every 50 ms reset the stall timer: only the deadline ends it
    trickle = [("sleep", 0.05), ("send", chunked(b": ping\n\n"))] * 40
    busy = Script([*chunked_script(events[:2], end=False), *trickle])
    with serving(busy) as conn:
        rec = run(conn, StreamLimits(deadline_s=0.5, stall_s=0.15))
    assert rec.failed and rec.codes() & {ProblemCode.DEADLINE, ProblemCode.STALL} == {
        ProblemCode.DEADLINE
    }
    assert rec.comments >= 5 and 0.5 <= rec.end_s < 0.5 + 0.15


def test_an_error_status_is_recorded_with_its_body_and_a_refused_connect_fails() -> None:
    body = b'{"error":{"message":"queue full","code":429}}'
    head = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\n\r\n" % len(body)
    with serving(Script([("send", head + body)])) as conn:
        rec = run(conn)
        assert conn.sock is not None  # a whole answer: the connection stays usable
    assert rec.failed and rec.status == 429 and ProblemCode.HTTP_ERROR in rec.codes()
    assert "queue full" in rec.problems[0].detail

    server = StreamServer(("127.0.0.1", 0), lambda s, a: None)
    server.start()
    port = server.server_port
    server.stop()
    conn = http.Connection("127.0.0.1", port)
    rec = run(conn)
    assert rec.failed and rec.status is None and ProblemCode.TRANSPORT_ERROR in rec.codes()


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_limits_refuse_a_duration_that_is_not_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="stall_s"):
        StreamLimits(stall_s=bad)
