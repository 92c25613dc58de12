"""Per-request server timestamps (``--record-timings``), served at ``GET /debug/timings``.

Every timestamp is ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process
of a Linux host, so a client on the same host compares its own readings with these
directly. A record is made when an admitted request has been parsed and is filled in as
the request goes: the first step that includes it, each write of token events (the time
the write was handed to the transport, and the tokens of each event in it), the end of
the response. The log keeps the last ``keep`` records; with recording off nothing is
made at all (the server's hooks test one attribute against None).

The format is documented in docs/llm-server.md ("Server timestamps").
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from typing import Any


class RequestTimings:
    """One request's timestamps (ns, CLOCK_MONOTONIC) and the tokens of each event."""

    __slots__ = (
        "id",
        "route",
        "stream",
        "priority",
        "prompt_tokens",
        "arrival_ns",
        "scheduled_ns",
        "_event_ns",
        "_event_tokens",
        "finish_ns",
        "finish_reason",
        "completion_tokens",
        "preemptions",
    )

    def __init__(
        self, route: str, stream: bool, priority: int, prompt_tokens: int, arrival_ns: int
    ) -> None:
        self.id: str | None = None
        self.route = route
        self.stream = stream
        self.priority = priority
        self.prompt_tokens = prompt_tokens
        self.arrival_ns = arrival_ns
        self.scheduled_ns: int | None = None
        self._event_ns = array("q")
        self._event_tokens = array("l")
        self.finish_ns: int | None = None
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None
        self.preemptions = 0

    def written(self, tokens_per_event: list[int]) -> None:
        """Events carrying these token counts were just handed to the transport."""
        now = time.monotonic_ns()
        for n in tokens_per_event:
            self._event_ns.append(now)
            self._event_tokens.append(n)

    def finished(self, reason: str | None, completion_tokens: int, preemptions: int) -> None:
        """The response ended now (its last write returned, or the client went away)."""
        if self.finish_ns is None:
            self.finish_ns = time.monotonic_ns()
            self.finish_reason = reason
            self.completion_tokens = completion_tokens
            self.preemptions = preemptions

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "stream": self.stream,
            "priority": self.priority,
            "prompt_tokens": self.prompt_tokens,
            "arrival_ns": self.arrival_ns,
            "scheduled_ns": self.scheduled_ns,
            "events": [[t, n] for t, n in zip(self._event_ns, self._event_tokens, strict=True)],
            "finish_ns": self.finish_ns,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "preemptions": self.preemptions,
        }


class TimingLog:
    """The last ``keep`` requests' timings, oldest first."""

    def __init__(self, keep: int) -> None:
        self._records: deque[RequestTimings] = deque(maxlen=keep)

    def start(
        self, route: str, stream: bool, priority: int, prompt_tokens: int, arrival_ns: int
    ) -> RequestTimings:
        """A new record for an admitted request, parsed at ``arrival_ns``."""
        record = RequestTimings(route, stream, priority, prompt_tokens, arrival_ns)
        self._records.append(record)
        return record

    def snapshot(self, clear: bool = False) -> list[dict[str, Any]]:
        """Every kept record (those in flight too: ``finish_ns`` null); ``clear`` empties
        the log after reading it."""
        out = [r.as_dict() for r in self._records]
        if clear:
            self._records.clear()
        return out
