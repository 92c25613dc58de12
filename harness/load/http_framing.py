"""How the load client reads an answer's framing and reaches its host, without a parser
object per answer: ``plain_framing`` reads an HTTP/1.x head framed by one Content-Length
(what inference servers send) in one regular-expression pass and says when to hand the
answer to geventhttpclient's parser instead; ``ip_family`` lets a connection to an IP
literal skip the resolver. Used by ``harness.load.http``'s ``Connection``.
"""

from __future__ import annotations

import ipaddress
import re
import socket

# A head longer than this is left to geventhttpclient's parser.
MAX_PLAIN_HEAD = 16384


# An answer's head as plain_framing reads it: the status line, then "name:value" lines
# with RFC 9110 token names (no folded lines), matched whole in one pass.
_PLAIN_HEAD = re.compile(
    rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?((?:\r\n[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*)*)"
)
# in the lower-cased header lines
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)[ \t]*(?=\r\n|$)")
_CONNECTION = re.compile(rb"\r\nconnection:([^\r\n]*)")


def plain_framing(buf: bytes | bytearray, end: int, method: str) -> tuple[int, int, bool] | None:
    """(status, body length, close after it) of an answer whose head ``buf[:end]`` is
    plain HTTP/1.x framed by one Content-Length; None for anything else (a chunked or
    unframed body, a status without a body, a line it does not read as a header), which
    is then left to geventhttpclient's parser, as every answer was before. "Close after
    it" follows HTTP/1.1 (``Connection: close``) and HTTP/1.0 (closed unless
    ``keep-alive``)."""
    if method == "HEAD":
        return None
    m = _PLAIN_HEAD.fullmatch(buf, 0, end)
    if m is None:
        return None
    status = int(m[2])
    if status < 200 or status in (204, 304):
        return None
    fields = m[3].lower()
    if b"\r\ntransfer-encoding:" in fields or fields.count(b"\r\ncontent-length:") != 1:
        return None
    length = _CONTENT_LENGTH.search(fields)
    if length is None:
        return None
    close = m[1] == b"0"  # HTTP/1.0 closes unless told to keep alive
    for value in _CONNECTION.findall(fields):
        tokens = {t.strip() for t in value.split(b",")}
        if b"close" in tokens:
            close = True
            break
        if b"keep-alive" in tokens:
            close = False
    return status, int(length[1]), close


def ip_family(host: str) -> int | None:
    """The address family of an IP literal (``127.0.0.1``, ``::1``); None for a name."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if addr.version == 6 else socket.AF_INET
