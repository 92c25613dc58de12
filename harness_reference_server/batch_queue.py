"""The batcher's pure part: per-priority bounded queues of pending requests.

``BatchQueue`` takes an explicit ``now`` (testable with literal times); ``Batcher``
(batcher.py) drives it on an asyncio loop. The exceptions are how a request that was
never computed ends.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import numpy as np


class QueueFull(Exception):
    """The request's priority level is at capacity; rejected at enqueue (O(1))."""


class DeadlineExpired(Exception):
    """The request's timeout passed before a batch took it; it was never computed."""


class ServerExiting(Exception):
    """The server stopped before the request could be computed."""


@dataclasses.dataclass(eq=False)
class Pending:
    rows: np.ndarray
    level: int
    enqueued: float
    deadline: float | None
    future: asyncio.Future[np.ndarray] | None = None
    queued: bool = False
    timer: asyncio.TimerHandle | None = None
    started: float = 0.0  # when its batch was dispatched (the statistics' queue time)
    n: int = dataclasses.field(init=False)  # rows; what the batch size counts

    def __post_init__(self) -> None:
        self.n = int(self.rows.shape[0])


class BatchQueue:
    """Per-priority FIFO queues; level 0 is served first.

    Expired requests are removed lazily (``discard`` only fixes the counts), so both
    enqueue and expiry are O(1).
    """

    def __init__(self, levels: int, capacity: int, bounded: bool = True) -> None:
        self._queues: list[collections.deque[Pending]] = [
            collections.deque() for _ in range(levels)
        ]
        self._depth = [0] * levels
        self.capacity = capacity
        self.bounded = bounded
        self.live = 0
        self.live_rows = 0

    def depth(self, level: int) -> int:
        return self._depth[level]

    @property
    def levels(self) -> int:
        return len(self._queues)

    def offer(self, item: Pending) -> bool:
        if self.bounded and self._depth[item.level] >= self.capacity:
            return False
        self._queues[item.level].append(item)
        item.queued = True
        self._depth[item.level] += 1
        self.live += 1
        self.live_rows += item.n
        return True

    def discard(self, item: Pending) -> bool:
        """Mark a queued item as gone (expired/cancelled). True if it was still queued."""
        if not item.queued:
            return False
        item.queued = False
        self._depth[item.level] -= 1
        self.live -= 1
        self.live_rows -= item.n
        return True

    def _head(self, level: int) -> Pending | None:
        q = self._queues[level]
        while q and not q[0].queued:
            q.popleft()
        return q[0] if q else None

    def oldest(self) -> float | None:
        """Enqueue time of the oldest live request, or None when empty."""
        times = [h.enqueued for lv in range(self.levels) if (h := self._head(lv)) is not None]
        return min(times) if times else None

    def take(
        self, max_rows: int, max_requests: int | None = None, *, arrival_order: bool = False
    ) -> list[Pending]:
        """Pop up to ``max_rows`` rows, highest level first, FIFO within a level.

        ``arrival_order`` (fault fifo-dispatch) takes the oldest head across all levels
        instead: priority then only decides which queue bound a request meets.
        """
        batch: list[Pending] = []
        rows = 0
        while (lv := self._next_level(arrival_order)) is not None:
            head = self._queues[lv][0]
            # the first request always fits: a cap below its rows must not strand it
            if (batch and rows + head.n > max_rows) or (
                max_requests is not None and len(batch) >= max_requests
            ):
                break
            self._queues[lv].popleft()
            self.discard(head)
            batch.append(head)
            rows += head.n
        return batch

    def _next_level(self, arrival_order: bool) -> int | None:
        best: int | None = None
        for lv in range(self.levels):
            head = self._head(lv)
            if head is None:
                continue
            if not arrival_order:
                return lv
            if best is None or head.enqueued < self._queues[best][0].enqueued:
                best = lv
        return best
