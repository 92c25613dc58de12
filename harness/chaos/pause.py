"""Pause: SIGSTOP the SUT's whole process tree, SIGCONT it on revert.

The detail records what the kernel said, not what was asked: ``stopped`` lists the pids
seen in state ``T`` (/proc/<pid>/stat) once the stop landed, ``still_stopped`` those still
in it just before SIGCONT. A pause nobody observed (the server was gone, a supervisor
continued it) is no evidence that the server stalled (harness.analysis.chaos_evidence).

Before the first SIGSTOP an undo guard (``harness.chaos.guard``) is armed with the pids:
if the harness dies mid-pause — SIGKILL, a crash — the kernel closes the guard's pipe and
the guard continues them, so no exit path leaves the server frozen. ``detail.guard_pid``
records it; a guard that cannot start fails the event before anything is stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from harness.chaos.base import Action, ChaosTarget, proc_state
from harness.chaos.guard import ContGuard
from harness.errors import ConfigError

STOPPED = ("T", "t")


def _wait_until_stopped(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while proc_state(pid) not in ("T", "t", "Z", "X", None) and time.monotonic() < deadline:
            time.sleep(0.001)


def _stopped(pids: list[int]) -> list[int]:
    """The pids the kernel reports as stopped now."""
    return [pid for pid in pids if proc_state(pid) in STOPPED]


class Pause(Action):
    """Freeze every process of the SUT for ``duration_s`` (the server sees a stall)."""

    name = "pause"

    def __init__(self, target: ChaosTarget, duration_s: float) -> None:
        super().__init__(duration_s)
        if not duration_s or duration_s <= 0:
            raise ConfigError(f"pause.duration_s has value {duration_s!r}. Valid: seconds > 0")
        self.target = target
        self.stopped: list[int] = []
        self.guard: ContGuard | None = None

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> Pause:
        return cls(target, float(params.get("duration_s", 0.0)))

    def _apply(self) -> None:
        pids = self.target.pids()
        with self._lock:
            if self._reverted:
                return
            # The undo that survives the harness: armed before anything is stopped.
            self.guard = ContGuard(pids).start()
            self.detail["guard_pid"] = self.guard.pid
        # Parent first, so it cannot react to (or respawn) children it sees stopping.
        for pid in pids:
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
        self.detail["stopped"] = _stopped(self.stopped)

    def _revert(self) -> None:
        with self._lock:
            pids = list(self.stopped)
        self.detail["still_stopped"] = _stopped(pids)
        # Also continue anything now in the tree (a child forked just before the stop).
        for pid in reversed(pids + [p for p in self.target.pids() if p not in pids]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with self._lock:
            guard, self.guard = self.guard, None
        if guard is not None:
            guard.close()
