"""Reading HTTP/1.1 requests off a raw socket, for the tests' scripted servers (a server
that must answer byte by byte as the test says: cut a body, stall, split a write)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def requests_on(sock: Any) -> Iterator[tuple[bytes, bytes]]:
    """Each request a keep-alive connection carries, as (head, body), the body read to its
    Content-Length; ends when the peer closes (a request cut short is not yielded)."""
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
            data = sock.recv(65536)
            if not data:
                return
            buf += data
        yield head, buf[:length]
        buf = buf[length:]
