"""Pause: SIGSTOP the SUT's whole process tree, SIGCONT it on revert."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from harness.chaos.base import Action, ChaosTarget
from harness.errors import ConfigError


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return chr(data[data.rindex(b")") + 2])


def _wait_until_stopped(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while _state(pid) not in ("T", "t", "Z", "X", None) and time.monotonic() < deadline:
            time.sleep(0.001)


class Pause(Action):
    """Freeze every process of the SUT for ``duration_s`` (the server sees a stall)."""

    name = "pause"

    def __init__(self, target: ChaosTarget, duration_s: float) -> None:
        super().__init__(duration_s)
        if not duration_s or duration_s <= 0:
            raise ConfigError(f"pause.duration_s has value {duration_s!r}. Valid: seconds > 0")
        self.target = target
        self.stopped: list[int] = []

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> Pause:
        return cls(target, float(params.get("duration_s", 0.0)))

    def _apply(self) -> None:
        # Parent first, so it cannot react to (or respawn) children it sees stopping.
        for pid in self.target.pids():
            with self._lock:
                if self._reverted:
                    return
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    self.stopped.append(pid)
        self.detail["pids"] = list(self.stopped)
        # SIGSTOP lands asynchronously (a process running on another core must be
        # interrupted): wait until the kernel says "stopped", so the pause starts now.
        _wait_until_stopped(self.stopped, timeout_s=1.0)

    def _revert(self) -> None:
        with self._lock:
            pids = list(self.stopped)
        # Also continue anything now in the tree (a child forked just before the stop).
        for pid in reversed(pids + [p for p in self.target.pids() if p not in pids]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
