"""A small keep-alive HTTP/1.1 client on gevent sockets for the load users.

Why not geventhttpclient's ``HTTPClient``: when a read is interrupted (our per-request
deadline), its response object hands a keep-alive socket *back to the pool*, and the late
answer is then read as the next request's — a false cross-wire. Here any
exception or deadline closes the connection. Requests are pre-built bytes, so the hot
path is one ``sendall`` and a few ``recv`` calls through geventhttpclient's C parser.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import gevent

# gevent's own socket/select, so a plain (unpatched) process cooperates too
from gevent import select, socket
from geventhttpclient.response import HTTPResponse

from harness.errors import ConfigError

RECV_SIZE = 65536


class RequestTimeout(Exception):
    """The request's deadline passed before its answer was complete."""


class ConnectionFailed(Exception):
    """Could not connect, the connection broke, or the answer was not valid HTTP."""


def split_url(url: str) -> tuple[str, int, str]:
    """``http://host:port/prefix`` → (host, port, prefix without trailing slash)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            f"--host has value {url!r}; expected an http:// URL such as http://127.0.0.1:8000 "
            f"(https is not supported by the open-loop client)"
        )
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def build_head(method: str, path: str, host: str, port: int, body_len: int | None) -> bytes:
    """Request line and headers; the body (``body_len`` bytes) follows."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: harness-load"]
    if body_len is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {body_len}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Connection:
    """One keep-alive connection, used by one greenlet at a time."""

    __slots__ = ("host", "port", "connect_timeout", "sock")

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.sock: socket.socket | None = None  # gevent socket

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _alive(self) -> bool:
        # An idle keep-alive socket must not be readable; readable means FIN or junk.
        sock = self.sock
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0.0)
        except (OSError, ValueError):
            return False
        return not readable

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self.sock = sock
        return sock

    def exchange(self, raw: bytes, timeout: float, method: str = "POST") -> tuple[int, bytes]:
        """Send ``raw`` and read one full answer → (status, body).

        Raises RequestTimeout after ``timeout`` seconds, ConnectionFailed on any socket or
        protocol error; in both cases the connection is closed, never reused.
        """
        timer = gevent.Timeout(timeout, RequestTimeout)
        timer.start()
        try:
            sock = self.sock if self._alive() else None
            if sock is None:
                self.close()
                sock = self._connect()
            sock.sendall(raw)
            resp = HTTPResponse(method=method)
            while not resp.message_complete:
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionFailed("connection closed by the server before the answer")
                resp.feed(data)
            status = resp.status_code
            body = bytes(resp._body_buffer)
            if resp.should_close():
                self.close()
            return status, body
        except RequestTimeout:
            self.close()
            raise
        except (OSError, ConnectionFailed) as exc:
            self.close()
            raise ConnectionFailed(str(exc) or type(exc).__name__) from None
        except Exception as exc:  # HTTPParseError and friends: not valid HTTP
            self.close()
            raise ConnectionFailed(f"invalid HTTP answer: {exc}") from None
        except BaseException:
            # GreenletExit while waiting: the answer may still come; never reuse.
            self.close()
            raise
        finally:
            timer.close()


class ConnectionPool:
    """Idle connections, reused most-recent-first so the hot ones stay warm."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self._idle: list[Connection] = []

    def acquire(self) -> Connection:
        if self._idle:
            return self._idle.pop()
        return Connection(self.host, self.port, self.connect_timeout)

    def release(self, conn: Connection) -> None:
        if conn.sock is not None:
            self._idle.append(conn)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def request(
    url: str, method: str = "GET", body: bytes | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    """One request on a fresh connection (metadata, golden outputs, calibration setup)."""
    host, port, prefix = split_url(url)
    path = prefix or "/"
    parts = urlsplit(url)
    if parts.query:
        path += "?" + parts.query
    raw = build_head(method, path, host, port, len(body) if body is not None else None)
    conn = Connection(host, port, connect_timeout=min(timeout, 5.0))
    try:
        return conn.exchange(raw + (body or b""), timeout, method=method)
    finally:
        conn.close()
