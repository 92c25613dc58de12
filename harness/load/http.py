"""A small keep-alive HTTP/1.1 client on gevent sockets for the load users.

Why not geventhttpclient's ``HTTPClient``: when a read is interrupted (our per-request
deadline), its response object hands a keep-alive socket *back to the pool*, and the late
answer is then read as the next request's — a false cross-wire. Here any
exception or deadline closes the connection. Requests are pre-built bytes, so the hot
path is one ``sendall`` and a few ``recv`` calls. An answer framed by one Content-Length
(what inference servers send) is read by ``http_framing.plain_framing`` from its head; any other
(chunked, unframed, 1xx, a head it does not read as plain) goes through geventhttpclient's
C parser.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import select as _stdlib_select
import ssl as _stdlib_ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import gevent

# gevent's own socket/select/ssl, so a plain (unpatched) process cooperates too
from gevent import monkey, select, socket
from gevent import ssl as gssl
from geventhttpclient.response import HTTPResponse

from harness.errors import ConfigError
from harness.load.http_framing import MAX_PLAIN_HEAD, ip_family, plain_framing

RECV_SIZE = 65536

# RFC 9110 token characters: what a header name may contain
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Framing is the client's: a user value for these would desynchronise keep-alive.
_RESERVED = {"content-length", "transfer-encoding", "connection"}
HEADER_EXAMPLE = "--header 'Authorization: Bearer TOKEN'"


class RequestTimeout(Exception):
    """The request's deadline passed before its answer was complete."""


class ConnectionFailed(Exception):
    """Could not connect, the connection broke, or the answer was not valid HTTP."""


class TLSFailed(ConnectionFailed):
    """The TLS handshake failed (certificate not trusted, wrong name, not a TLS server).

    Before load this is a configuration error (``target.get`` and ``preflight`` turn it
    into exit 2); during load it is one more connection error, recorded per request.
    """


def parse_header(text: str) -> tuple[str, str]:
    """``NAME:VALUE`` (``NAME: VALUE``) → (name, value), or a ConfigError naming the fix.

    Messages never repeat the value: it is typically a secret."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep:
        raise ConfigError(
            "a --header has no ':' (value not shown: it may hold a secret); "
            f"expected NAME:VALUE, e.g. {HEADER_EXAMPLE}"
        )
    if not name or not _TOKEN.match(name):
        raise ConfigError(
            f"a --header has the name {name!r}, which is not an HTTP header name "
            f"(letters, digits and !#$%&'*+.^_`|~- only, not empty); e.g. {HEADER_EXAMPLE}"
        )
    if any(c in value for c in "\r\n\0"):
        raise ConfigError(
            f"--header {name}: the value contains a CR, LF or NUL character, which would "
            "split the request; pass the value on one line"
        )
    if name.lower() in _RESERVED:
        raise ConfigError(
            f"--header {name}: the harness sets {name} itself (it frames every request); "
            "leave it out"
        )
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise ConfigError(
            f"--header {name}: the value has characters outside Latin-1, which HTTP/1.1 "
            "headers cannot carry; percent- or base64-encode it"
        ) from None
    return name, value


def parse_headers(items: Iterable[str] | str | None) -> tuple[tuple[str, str], ...]:
    """Every ``--header`` validated (``HARNESS_HEADER`` holds one, or a JSON list of them);
    a name given twice is an error (which one would the server see?)."""
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in items:
        name, value = parse_header(str(item))
        if name.lower() in seen:
            raise ConfigError(f"--header {name} is given twice; pass each header once")
        seen.add(name.lower())
        out.append((name, value))
    return tuple(out)


def check_ca_cert(path: str | None) -> None:
    """A ``--ca-cert`` that is not a readable PEM file fails before anything starts."""
    if path is None:
        return
    if not os.path.isfile(path):
        raise ConfigError(
            f"--ca-cert has value {path!r}: no such file; pass the PEM file of the CA that "
            "signed the server's certificate (or --insecure to skip verification)"
        )
    try:
        _context(path, False)
    except (OSError, _stdlib_ssl.SSLError) as exc:
        raise ConfigError(
            f"--ca-cert {path!r} could not be loaded as PEM certificates ({exc}); pass the "
            "CA certificate in PEM form (-----BEGIN CERTIFICATE-----)"
        ) from None


@functools.lru_cache(maxsize=8)
def _context(ca_cert: str | None, insecure: bool) -> gssl.SSLContext:
    """One context per (CA file, insecure): loading the system CAs is not free."""
    if insecure:
        ctx = gssl.SSLContext(gssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = gssl.CERT_NONE
        return ctx
    return gssl.create_default_context(cafile=ca_cert)


@dataclass(frozen=True)
class Client:
    """How this process talks to the server: extra headers and TLS (see the module doc)."""

    headers: tuple[tuple[str, str], ...] = ()
    tls: bool = False  # the target is https://
    ca_cert: str | None = None  # PEM file of the CA to trust (default: the system's)
    insecure: bool = False  # TLS without verifying the certificate

    @classmethod
    def for_target(
        cls,
        url: str,
        headers: Iterable[str] | str | None = (),
        ca_cert: str | None = None,
        insecure: bool = False,
    ) -> Client:
        """The client for the server at ``url`` (its scheme decides TLS)."""
        scheme = urlsplit(url).scheme
        return cls(parse_headers(headers), scheme == "https", ca_cert, insecure)

    def ssl_context(self) -> gssl.SSLContext | None:
        return _context(self.ca_cert, self.insecure) if self.tls else None

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def describe(self) -> dict[str, Any]:
        """For the results' ``sut``: header NAMES only, never their values."""
        return {
            "headers": [k for k, _ in self.headers],
            "tls": ({"ca_cert": self.ca_cert, "verify": not self.insecure} if self.tls else None),
        }


_client = Client()


def client_for(url: str, opts: Any) -> Client:
    """The client for ``url`` under the run's options (``headers``, ``ca_cert``,
    ``insecure`` of ``harness.load.options.Options``); a missing CA file is a ConfigError
    here, on the master and on every worker (a worker on another host needs the file at
    the same path)."""
    check_ca_cert(opts.ca_cert)
    return Client.for_target(url, opts.headers, opts.ca_cert, opts.insecure)


def configure(client: Client) -> None:
    """Set the process's client (see the module docstring for why it is one per process)."""
    global _client
    _client = client


def current() -> Client:
    return _client


def split_url(url: str) -> tuple[str, int, str]:
    """``http(s)://host:port/prefix`` → (host, port, prefix without trailing slash)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--host has value {url!r}; expected an http:// or https:// URL such as "
            f"http://127.0.0.1:8000"
        )
    default_port = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default_port
    except ValueError:
        raise ConfigError(f"--host has value {url!r}: the port is not a number") from None
    return parts.hostname, port, parts.path.rstrip("/")


def build_head(
    method: str,
    path: str,
    host: str,
    port: int,
    body_len: int | None,
    client: Client | None = None,
) -> bytes:
    """Request line and headers; the body (``body_len`` bytes) follows. The client's
    headers are added; a ``Host`` or ``User-Agent`` among them replaces the default."""
    c = client if client is not None else _client
    extra: Sequence[tuple[str, str]] = c.headers
    given = {k.lower() for k, _ in extra}
    lines = [f"{method} {path} HTTP/1.1", f"Host: {c.header('Host') or f'{host}:{port}'}"]
    if "user-agent" not in given:
        lines.append("User-Agent: harness-load")
    lines += [f"{k}: {v}" for k, v in extra if k.lower() != "host"]
    if body_len is not None:
        if "content-type" not in given:
            lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {body_len}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _tls_failure(host: str, port: int, exc: Exception, client: Client) -> TLSFailed:
    """One line: what failed and what to pass instead."""
    why = getattr(exc, "reason", None) or str(exc)
    if isinstance(exc, _stdlib_ssl.SSLCertVerificationError):
        why = f"certificate verify failed: {exc.verify_message}"
        fix = (
            "pass --ca-cert FILE with the CA that signed the server's certificate"
            if client.ca_cert is None
            else f"--ca-cert {client.ca_cert} did not sign it: pass the right CA file"
        ) + " (or --insecure to skip verification)"
    elif "WRONG_VERSION_NUMBER" in str(exc) or "wrong version number" in str(exc):
        fix = "the server does not speak TLS on this port: use an http:// URL"
    else:
        fix = "check that the server serves TLS on this port (or use an http:// URL)"
    return TLSFailed(f"TLS handshake with {host}:{port} failed ({why}); {fix}")


# An idle keep-alive socket's liveness, asked without waiting: the OS's poll (not gevent's
# cooperative one, which would yield to the hub) on the socket alone, timeout 0. Any event
# (readable: a FIN or junk; hang-up; error; a closed fd) means it is not fit to reuse. It
# raises nothing when all is well, unlike the MSG_PEEK recv kept for systems without poll.
try:
    _OsPoll: Any = monkey.get_original("select", "poll")
    _POLL_IN = _stdlib_select.POLLIN | _stdlib_select.POLLPRI
except AttributeError:
    _OsPoll = None
_PEEK_NOW = socket.MSG_PEEK | socket.MSG_DONTWAIT


class Connection:
    """One keep-alive connection, used by one greenlet at a time."""

    __slots__ = ("host", "port", "connect_timeout", "sock", "client", "family", "_poll")

    def __init__(
        self, host: str, port: int, connect_timeout: float = 5.0, client: Client | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.client = client if client is not None else _client
        self.sock: Any = None  # gevent socket, or gevent SSLSocket over one
        self._poll: Any = None  # an OS poll object on a plain ``sock``'s fd alone
        # an IP literal is connected to directly; a name is resolved at every connect
        self.family = ip_family(host)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self._poll = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _alive(self) -> bool:
        # An idle keep-alive socket must not be readable; readable means FIN or junk.
        sock = self.sock
        if sock is None:
            return False
        poll = self._poll
        if poll is not None:
            return not poll.poll(0)
        plain = getattr(sock, "_sock", None)  # the OS socket under a plain gevent socket
        if plain is not None and not isinstance(sock, gssl.SSLSocket):
            # one non-blocking peek: nothing to read (alive), or FIN / junk / error (dead)
            try:
                plain.recv(1, _PEEK_NOW)
            except BlockingIOError:
                return True
            except (OSError, ValueError):
                return False
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0.0)
        except (OSError, ValueError):
            return False
        if not readable:
            return True
        if not isinstance(sock, gssl.SSLSocket):
            return False
        # TLS: the readable bytes may be records that carry no data (a TLS 1.3 session
        # ticket arriving after the handshake). A non-blocking read tells: no data yet
        # (alive), end of stream or data nobody asked for (dead).
        try:
            sock.settimeout(0.0)
            sock.recv(1)
            return False
        except gssl.SSLWantReadError:
            return True
        except (OSError, ValueError):
            return False
        finally:
            with contextlib.suppress(OSError, ValueError):
                sock.settimeout(None)

    def _connect(self) -> Any:
        if self.family is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        else:
            # an IP literal: no resolver round trip (gevent's runs on a thread pool)
            sock = socket.socket(self.family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.connect_timeout)
                sock.connect((self.host, self.port))
            except BaseException:
                sock.close()
                raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ctx = self.client.ssl_context()
        if ctx is not None:
            try:
                # SNI and certificate name: the URL's host (the handshake runs under the
                # connect timeout)
                sock = ctx.wrap_socket(sock, server_hostname=self.host)
            except (_stdlib_ssl.SSLError, _stdlib_ssl.CertificateError) as exc:
                with contextlib.suppress(OSError):
                    sock.close()
                raise _tls_failure(self.host, self.port, exc, self.client) from None
        sock.settimeout(None)
        self.sock = sock
        if ctx is None and _OsPoll is not None:
            self._poll = _OsPoll()
            self._poll.register(sock.fileno(), _POLL_IN)
        return sock

    def ready_socket(self) -> Any:
        """The connected socket: the kept-alive one while it is still alive, else a new
        connection (TLS handshake included, under the connect timeout). Raises what
        connecting raises (OSError, TLSFailed); the caller closes on any failure."""
        sock = self.sock if self._alive() else None
        if sock is None:
            self.close()
            sock = self._connect()
        return sock

    def exchange(self, raw: bytes, timeout: float, method: str = "POST") -> tuple[int, bytes]:
        """Send ``raw`` and read one full answer → (status, body).

        Raises RequestTimeout after ``timeout`` seconds, ConnectionFailed on any socket or
        protocol error; in both cases the connection is closed, never reused.
        """
        # A fresh timer per exchange: a libev timer re-armed after a stop keeps only the
        # time it had left, so a reused one would expire ever sooner on a busy connection.
        timer = gevent.Timeout(timeout, RequestTimeout)
        timer.start()
        try:
            sock = self.sock if self._alive() else None
            if sock is None:
                self.close()
                sock = self._connect()
            sock.sendall(raw)
            buf = bytearray()
            end = -1
            while end < 0 and len(buf) <= MAX_PLAIN_HEAD:
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise ConnectionFailed("connection closed by the server before the answer")
                buf += data
                end = buf.find(b"\r\n\r\n")
            framing = plain_framing(buf, end, method) if end >= 0 else None
            if framing is None:
                return self._parse_rest(sock, bytes(buf), method)
            status, length, close = framing
            start = end + 4
            need = start + length
            while len(buf) < need:
                data = sock.recv(max(RECV_SIZE, need - len(buf)))
                if not data:
                    raise ConnectionFailed("connection closed by the server before the answer")
                buf += data
            body = bytes(buf[start:need])
            if close or len(buf) > need:
                # bytes after the answer were never asked for: never reuse the connection
                self.close()
            return status, body
        except RequestTimeout:
            self.close()
            raise
        except TLSFailed:
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

    def _parse_rest(self, sock: Any, received: bytes, method: str) -> tuple[int, bytes]:
        """The answer through geventhttpclient's parser (chunked, no length, 1xx, ...),
        from the bytes already ``received``."""
        resp = HTTPResponse(method=method)
        resp.feed(received)
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


class ConnectionPool:
    """Idle connections, reused most-recent-first so the hot ones stay warm."""

    def __init__(
        self, host: str, port: int, connect_timeout: float = 5.0, client: Client | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.client = client if client is not None else _client
        self._idle: list[Connection] = []

    def acquire(self) -> Connection:
        if self._idle:
            return self._idle.pop()
        return Connection(self.host, self.port, self.connect_timeout, self.client)

    def release(self, conn: Connection) -> None:
        if conn.sock is not None:
            self._idle.append(conn)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def handshake(url: str, client: Client, timeout: float = 5.0) -> None:
    """Connect to ``url``'s server (and complete the TLS handshake for https://) without
    sending a request; TLSFailed or ConnectionFailed when that does not work."""
    host, port, _ = split_url(url)
    conn = Connection(host, port, connect_timeout=timeout, client=client)
    try:
        conn._connect()
    except OSError as exc:
        raise ConnectionFailed(str(exc) or type(exc).__name__) from None
    finally:
        conn.close()


def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    timeout: float = 10.0,
    client: Client | None = None,
) -> tuple[int, bytes]:
    """One request on a fresh connection (metadata, golden outputs, calibration setup),
    with the process's headers; TLS when ``url`` is https://."""
    host, port, prefix = split_url(url)
    c = client if client is not None else _client
    c = replace(c, tls=urlsplit(url).scheme == "https")
    path = prefix or "/"
    parts = urlsplit(url)
    if parts.query:
        path += "?" + parts.query
    raw = build_head(method, path, host, port, len(body) if body is not None else None, c)
    conn = Connection(host, port, connect_timeout=min(timeout, 5.0), client=c)
    try:
        return conn.exchange(raw + (body or b""), timeout, method=method)
    finally:
        conn.close()
