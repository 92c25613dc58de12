"""What every chaos action shares: apply/revert that are idempotent and thread-safe.

``revert()`` may be called from a signal handler or an atexit hook while ``apply()`` is
still running on the timeline's thread, so an action checks ``_reverted`` under its lock
before each step it takes: once reverted, it takes no new step.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

from harness.errors import ConfigError, HarnessError


class ChaosTarget(Protocol):
    """The server chaos acts on: a ``SutProcess`` (started by us) or an ``AttachedSut``."""

    can_restart: bool

    @property
    def pid(self) -> int: ...

    def pids(self) -> list[int]: ...


def proc_state(pid: int) -> str | None:
    """The process state letter from /proc/<pid>/stat (``T`` stopped, ``Z`` zombie…);
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return chr(data[data.rindex(b")") + 2])


def target_cores(target: ChaosTarget) -> tuple[int, ...]:
    """The cores the SUT may run on: its configured pinning, else its current affinity."""
    cores = getattr(target, "cores", None)
    if cores:
        return tuple(cores)
    try:
        return tuple(sorted(os.sched_getaffinity(target.pid)))
    except (OSError, HarnessError):  # gone, or not started yet: the cores we may use
        return tuple(sorted(os.sched_getaffinity(0)))


class Action:
    """Base of the chaos actions. Subclasses implement ``_apply`` and ``_revert``."""

    name = "action"

    def __init__(self, duration_s: float | None) -> None:
        if duration_s is not None and duration_s < 0:
            raise ConfigError(f"{self.name}.duration_s has value {duration_s}. Valid: seconds ≥ 0")
        self.duration_s = duration_s
        self._lock = threading.RLock()
        self._applied = False
        self._reverted = False
        self.detail: dict[str, Any] = {}

    @property
    def params(self) -> dict[str, Any]:
        return {"duration_s": self.duration_s}

    @property
    def reverted(self) -> bool:
        return self._reverted

    def apply(self) -> None:
        with self._lock:
            if self._reverted or self._applied:
                return
            self._applied = True
        self._apply()

    def revert(self) -> None:
        with self._lock:
            if self._reverted:
                return
            self._reverted = True
            applied = self._applied
        if applied:
            self._revert()

    def _apply(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _revert(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
