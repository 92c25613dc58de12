"""Inference requests, pre-encoded once, and the metadata GETs before the load.

What a request says is the protocol's (``harness.protocols``: for KServe V2 the input
names, datatypes and shapes come from the model's metadata or from ``--input`` /
``--sample-request``, the data from an ``--input-data`` file when given); here its body
is framed as HTTP once per pool input and traffic class, so per request only the
fixed-width id is spliced in and the hot path never touches JSON encoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from harness import protocols
from harness.errors import ConfigError, TargetUnavailable
from harness.load import http
from harness.protocols import ID_WIDTH, ClassParams, WireProtocol


class PayloadPool:
    """Pre-encoded requests: ``parts(cls, i)`` → (head + body up to the id, rest of body).

    ``path``: where the requests go (the target's prefix and the protocol's
    ``infer_path``); ``protocol``: what they say (default: ``kserve-v2``)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        inputs: Sequence[Any],
        classes: Sequence[ClassParams],
        protocol: WireProtocol | None = None,
    ) -> None:
        self.protocol = protocol if protocol is not None else protocols.default()
        self.inputs = list(inputs)
        self.class_names = [c.name for c in classes]
        self._classes = {c.name: c for c in classes}
        self._where = (path, host, port)
        self._parts: dict[str, list[tuple[bytes, bytes]]] = {
            c.name: [self._encode(inp, c) for inp in self.inputs] for c in classes
        }

    def _encode(self, inp: Any, cls: ClassParams) -> tuple[bytes, bytes]:
        before, after = self.protocol.request_parts(inp, cls)
        path, host, port = self._where
        body_len = len(before) + ID_WIDTH + len(after)
        head = http.build_head(self.protocol.request_method, path, host, port, body_len)
        return head + before, after

    def __len__(self) -> int:
        return len(self.inputs)

    def raw(self, cls: str, index: int, request_id: str) -> bytes:
        head, tail = self._parts[cls][index]
        return head + request_id.encode() + tail

    def raw_for(self, cls: str, inp: Any, request_id: str) -> bytes:
        """A request of an input that is in no pool (a conversation's later turn, built
        from the answer before it), encoded as the pool's are."""
        head, tail = self._encode(inp, self._classes[cls])
        return head + request_id.encode() + tail

    def body(self, cls: str, index: int, request_id: str) -> bytes:
        """The body alone (for tests and for the golden fetch)."""
        raw = self.raw(cls, index, request_id)
        return raw[raw.index(b"\r\n\r\n") + 4 :]

    def parse_answer(self, body: bytes) -> tuple[str | None, tuple[Any, ...]]:
        """The protocol's reading of a 200 answer (``protocols.BadResponse`` if none)."""
        return self.protocol.parse_answer(body)


def make_id(slot: int, seq: int) -> str:
    """Fixed-width request id, unique across workers: 4 hex digits of slot, 12 of sequence."""
    return f"{slot & 0xFFFF:04x}{seq & 0xFFFFFFFFFFFF:012x}"


def fetch_json(
    url: str, timeout: float = 10.0, on_status: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """GET a JSON document from the SUT; TargetUnavailable when it cannot be had.
    ``on_status`` may raise a more precise error for a status other than 200 first."""
    try:
        status, body = http.request(url, "GET", timeout=timeout)
    except http.TLSFailed as exc:
        raise ConfigError(str(exc)) from None
    except (http.RequestTimeout, http.ConnectionFailed) as exc:
        raise TargetUnavailable(f"GET {url} failed: {exc}; is the server running?") from None
    if status != 200 and on_status is not None:
        on_status(status)
    if status != 200:
        raise TargetUnavailable(f"GET {url} answered HTTP {status}: {body[:200]!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise TargetUnavailable(f"GET {url} did not answer JSON: {body[:200]!r}") from None


def model_metadata(
    base_url: str, model: str, timeout: float = 10.0, protocol: WireProtocol | None = None
) -> dict[str, Any]:
    """The model's metadata (the protocol's ``model_metadata_path``); a 404 is a
    ConfigError naming --model."""
    path = (protocol if protocol is not None else protocols.default()).model_metadata_path(model)

    def unknown_model(status: int) -> None:
        if status == 404:
            raise ConfigError(
                f"--model has value {model!r}, which the server at {base_url} does not serve "
                f"(GET {path} → 404); pass the model's name with --model NAME"
            )

    return fetch_json(f"{base_url.rstrip('/')}{path}", timeout, unknown_model)
