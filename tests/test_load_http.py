"""The load client's HTTP exchanges: it never reads a late answer as the next request's,
and it reads each answer as HTTP frames it — its status, its body, and whether the
connection may carry the next request — whether the head is read directly (one
Content-Length) or left to geventhttpclient's parser (anything else)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import gevent
import pytest
from gevent.server import StreamServer

from harness.errors import ConfigError
from harness.load import http, http_framing
from harness.testing.raw_http import requests_on


def _server(answer: Callable[[int], bytes], delays=None, split: int | None = None):
    """A keep-alive HTTP server answering its k-th request (on any connection) with
    ``answer(k)`` as given, after ``delays[k]`` seconds, in two writes split at byte
    ``split`` when set."""
    counter = itertools.count()
    delays = delays or {}

    def handle(sock, _addr):
        for _request in requests_on(sock):
            k = next(counter)
            gevent.sleep(delays.get(k, 0.0))
            raw = answer(k)
            try:
                if split is None:
                    sock.sendall(raw)
                else:
                    sock.sendall(raw[:split])
                    gevent.sleep(0.02)
                    sock.sendall(raw[split:])
            except OSError:
                return

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    return server


def _serve(delays: dict[int, float]):
    """Request k is answered with body b"answer-k" after delays[k] seconds."""

    def answer(k: int) -> bytes:
        body = f"answer-{k}".encode()
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    return _server(answer, delays)


def _answering(*answers: bytes, split: int | None = None):
    """Request k is answered with ``answers[k]`` byte for byte."""
    return _server(lambda k: answers[k], split=split)


def _raw(port: int) -> bytes:
    body = b"{}"
    return http.build_head("POST", "/x", "127.0.0.1", port, len(body)) + body


def test_timeout_closes_the_connection_so_the_late_answer_is_never_read() -> None:
    server = _serve({0: 0.5})
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        with pytest.raises(http.RequestTimeout):
            conn.exchange(_raw(server.server_port), timeout=0.1)
        assert conn.sock is None  # closed, not returned for reuse
        gevent.sleep(0.6)  # the late answer to request 0 has been sent by now
        status, body = conn.exchange(_raw(server.server_port), timeout=2.0)
        assert (status, body) == (200, b"answer-1")
    finally:
        server.stop()


def test_keep_alive_reuses_one_connection() -> None:
    server = _serve({})
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        first = conn.exchange(_raw(server.server_port), timeout=2.0)
        sock = conn.sock
        second = conn.exchange(_raw(server.server_port), timeout=2.0)
        assert first == (200, b"answer-0") and second == (200, b"answer-1")
        assert conn.sock is sock
    finally:
        server.stop()


def test_refused_connection_is_a_connection_failure() -> None:
    server = _serve({})
    port = server.server_port
    server.stop()
    with pytest.raises(http.ConnectionFailed):
        http.Connection("127.0.0.1", port).exchange(_raw(port), timeout=1.0)


def test_only_http_urls() -> None:
    assert http.split_url("http://127.0.0.1:8000/prefix/") == ("127.0.0.1", 8000, "/prefix")
    assert http.split_url("https://example.com") == ("example.com", 443, "")
    with pytest.raises(ConfigError, match="--host"):
        http.split_url("ftp://example.com")


@pytest.mark.parametrize(
    ("answer", "expected", "reused"),
    [
        # read from the head: one Content-Length
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", (200, b"hello"), True),
        (b"HTTP/1.1 503\r\ncontent-length: 4\r\n\r\nbusy", (503, b"busy"), True),
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
            (200, b"hi"),
            False,
        ),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", (200, b"hi"), False),
        (
            b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nhi",
            (200, b"hi"),
            True,
        ),
        # left to geventhttpclient's parser: chunked, and no body
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            (200, b"hello"),
            True,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", (204, b""), True),
    ],
)
@pytest.mark.parametrize("split", [None, 1 / 3, 2 / 3], ids=["whole", "cut-at-1/3", "cut-at-2/3"])
def test_answers_are_framed_as_http_says(answer, expected, reused, split) -> None:
    """In one piece or in two (cut in its head, or in its body), an answer is its status
    and body, and the connection is kept only when HTTP says it may be."""
    cut = None if split is None else max(1, int(len(answer) * split))
    server = _answering(answer, answer, split=cut)
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        assert conn.exchange(_raw(server.server_port), timeout=2.0) == expected
        assert (conn.sock is not None) == reused
        if reused:  # and the next answer on it is read as well
            assert conn.exchange(_raw(server.server_port), timeout=2.0) == expected
    finally:
        server.stop()


def test_an_answer_cut_short_waits_for_the_deadline_and_closes() -> None:
    server = _answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        with pytest.raises(http.RequestTimeout):
            conn.exchange(_raw(server.server_port), timeout=0.2)
        assert conn.sock is None
    finally:
        server.stop()


def test_garbage_is_an_invalid_http_answer() -> None:
    server = _answering(b"SPDY/3 nonsense\r\n\r\n")
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        with pytest.raises(http.ConnectionFailed):
            conn.exchange(_raw(server.server_port), timeout=2.0)
        assert conn.sock is None
    finally:
        server.stop()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1",  # two lengths
        b"HTTP/1.1 200 OK\r\nContent-Length: x",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n folded",
        b"HTTP/1.1 200 OK",  # no length: read until the server closes
        b"HTTP/1.1 100 Continue",
        b"HTTP/2 200",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 1",
    ],
)
def test_plain_framing_leaves_anything_unusual_to_the_parser(head: bytes) -> None:
    assert http_framing.plain_framing(head + b"\r\n\r\n", len(head), "POST") is None


def test_plain_framing_reads_status_length_and_close() -> None:
    head = b"HTTP/1.1 429 Too Many\r\nconnection: keep-alive, close\r\nContent-Length:  12 "
    assert http_framing.plain_framing(head, len(head), "POST") == (429, 12, True)
    assert http_framing.plain_framing(head, len(head), "HEAD") is None


def test_bytes_after_an_answer_end_the_connection() -> None:
    """In the same read as the answer, or after it (then the next liveness check sees
    them): never read as the next request's answer."""
    junk = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhijunk"
    for split in (None, 40):
        server = _answering(junk, junk, split=split)
        try:
            conn = http.Connection("127.0.0.1", server.server_port)
            assert conn.exchange(_raw(server.server_port), timeout=2.0) == (200, b"hi")
            gevent.sleep(0.05)
            assert not conn._alive()
        finally:
            server.stop()


def test_a_server_that_closed_an_idle_connection_gets_a_new_one() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"

    def one_answer_then_close(sock, _addr):
        buf = b""
        while b"{}" not in buf:
            buf += sock.recv(65536)
        sock.sendall(answer)
        sock.close()

    server = StreamServer(("127.0.0.1", 0), one_answer_then_close)
    server.start()
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        assert conn.exchange(_raw(server.server_port), timeout=2.0) == (200, b"hi")
        first = conn.sock
        assert conn._poll is not None  # a plain socket is asked by the OS's poll
        gevent.sleep(0.05)
        assert first is not None and not conn._alive()
        assert conn.exchange(_raw(server.server_port), timeout=2.0) == (200, b"hi")
        assert conn.sock is not first
    finally:
        server.stop()


def test_the_deadline_is_per_exchange_not_per_connection() -> None:
    """Many exchanges on one connection whose times add up past the deadline: none of
    them times out (each gets the whole deadline). The deadline is 25x one exchange, so a
    busy machine (CI runs this beside package installs) does not stall one past it; the
    40 exchanges take 1.6x the deadline together."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
    server = _answering(*[answer] * 40, split=20)  # each answer takes ~20 ms
    try:
        conn = http.Connection("127.0.0.1", server.server_port)
        for _ in range(40):
            assert conn.exchange(_raw(server.server_port), timeout=0.5) == (200, b"hi")
    finally:
        server.stop()
