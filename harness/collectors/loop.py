"""The tick schedule shared by the samplers, and a CSV writer that flushes every tick.

Ticks are scheduled at ``t0 + k·interval`` on a monotonic clock (no drift); each tick
records how late it was. A tick more than one interval late is *missed* (counted, not
taken late twice) — a run with missed ticks is flagged by the checks, not here.
"""

from __future__ import annotations

import csv
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TickStats:
    started_mono: float = 0.0
    started_unix: float = 0.0
    stopped_mono: float | None = None
    stopped_unix: float | None = None
    ticks: int = 0
    missed: int = 0
    max_late_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _event_wait(stop: threading.Event, timeout: float) -> None:
    stop.wait(timeout)


class TickLoop:
    """Call ``on_tick(t, late_s)`` every ``interval_s`` until ``stop`` is set or the duration ends.

    ``clock`` is monotonic seconds; ``wait(stop, seconds)`` blocks until the next tick or a
    stop (tests inject a fake clock and a wait that advances it).
    """

    def __init__(
        self,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        wait: Callable[[threading.Event, float], None] = _event_wait,
        stop: threading.Event | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s has value {interval_s!r}; valid: a number > 0")
        self.interval_s = interval_s
        self.clock = clock
        self.wall = wall
        self.wait = wait
        self.stop = stop or threading.Event()
        self.stats = TickStats()
        self.t0: float | None = None

    def start(self) -> float:
        self.t0 = self.clock()
        self.stats.started_mono = self.t0
        self.stats.started_unix = self.wall()
        return self.t0

    def run(
        self, on_tick: Callable[[float, float], None], duration_s: float | None = None
    ) -> TickStats:
        t0 = self.t0 if self.t0 is not None else self.start()
        k = 1
        try:
            while not self.stop.is_set():
                due = t0 + k * self.interval_s
                if duration_s is not None and due - t0 > duration_s + 1e-9:
                    break
                now = self.clock()
                if due > now:
                    self.wait(self.stop, due - now)
                    if self.stop.is_set():
                        break
                    now = self.clock()
                    if now < due:  # woke early (spurious): wait again
                        continue
                late = now - due
                if late >= self.interval_s:
                    skipped = math.floor(late / self.interval_s)
                    self.stats.missed += skipped
                    k += skipped
                    due = t0 + k * self.interval_s
                    late = now - due
                self.stats.max_late_s = max(self.stats.max_late_s, late)
                on_tick(now - t0, late)
                self.stats.ticks += 1
                k += 1
        finally:
            self.stats.stopped_mono = self.clock()
            self.stats.stopped_unix = self.wall()
        return self.stats


class CsvStream:
    """Append rows to a CSV file with a header, flushing after each tick's rows."""

    def __init__(self, path: str | Path, columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = list(columns)
        self._f = open(self.path, "w", newline="")  # noqa: SIM115 (closed by close())
        self._w = csv.writer(self._f)
        self._w.writerow(self.columns)
        self._f.flush()

    def write(self, rows: Sequence[Sequence[Any]]) -> None:
        # round floats (4 decimals is below any figure we report); None → empty cell
        self._w.writerows(
            [
                [round(v, 4) if type(v) is float else ("" if v is None else v) for v in r]
                for r in rows
            ]
        )
        self._f.flush()

    def write_lines(self, lines: Sequence[str]) -> None:
        """Already formatted CSV lines (each ending in a newline)."""
        self._f.write("".join(lines))
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
