"""The load client never reads a late answer as the next request's."""

from __future__ import annotations

import itertools

import gevent
import pytest
from gevent.server import StreamServer

from harness.errors import ConfigError
from harness.load import http


def _serve(delays: dict[int, float]):
    """A keep-alive HTTP server answering request k with body b"answer-k" after delays[k]."""
    counter = itertools.count()

    def handle(sock, _addr):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while len(buf) < length:
                buf += sock.recv(65536)
            buf = buf[length:]
            k = next(counter)
            gevent.sleep(delays.get(k, 0.0))
            body = f"answer-{k}".encode()
            try:
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                return

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    return server


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
