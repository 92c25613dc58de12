"""Kill the SUT and (on revert) restart it, measuring the recovery: kill → ready again.

The detail records what happened to the process, not what was asked: ``found`` (it was
running when signalled) and ``gone`` (it had exited within ``exit_timeout_s`` after).
A kill that found no process, or one the server survived, is no evidence of a restart
(harness.analysis.chaos_evidence).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from harness.chaos.base import Action, ChaosTarget, proc_state
from harness.errors import ConfigError

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
GONE = ("Z", "X", None)  # exited (a zombie has exited; only its parent has not reaped it)


def _running(pid: int) -> bool:
    return proc_state(pid) not in GONE


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class KillRestart(Action):
    """Send ``signal`` to the SUT; after ``duration_s`` restart it and wait until ready.

    A SUT the harness started (``SutProcess``) is started again here; an attached one
    (``AttachedSut``) is started again by its supervisor, and the revert waits for it.
    ``on_restart(new_pid)`` lets the caller re-point its sampler.
    """

    name = "kill"

    def __init__(
        self,
        target: ChaosTarget,
        duration_s: float = 0.0,
        *,
        restart: bool = True,
        signal_name: str = "SIGKILL",
        ready_timeout_s: float = 60.0,
        exit_timeout_s: float = 15.0,
        on_restart: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(duration_s)
        if signal_name not in SIGNALS:
            raise ConfigError(f"kill.signal has value {signal_name!r}. Valid: {', '.join(SIGNALS)}")
        supervised = getattr(target, "waits_for_supervisor", False)
        if restart and not getattr(target, "can_restart", False) and not supervised:
            raise ConfigError(
                "kill.restart is true but the SUT was attached by pid (--sut-pid): the harness "
                "cannot restart it. Start it with --sut-cmd, or set restart = false"
            )
        self.target = target
        self.restart = restart
        self.signal_name = signal_name
        self.ready_timeout_s = ready_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.on_restart = on_restart
        self._clock = clock
        self._killed_at: float | None = None

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> KillRestart:
        return cls(
            target,
            float(params.get("duration_s", 0.0)),
            restart=bool(params.get("restart", True)),
            signal_name=str(params.get("signal", "SIGKILL")),
        )

    @property
    def params(self) -> dict[str, Any]:
        return {"restart": self.restart, "signal": self.signal_name, "duration_s": self.duration_s}

    def _apply(self) -> None:
        old = self.target.pid
        self.detail["old_pid"] = old
        self.detail["found"] = _running(old)
        self._killed_at = self._clock()
        stop = getattr(self.target, "stop", None)
        kill = getattr(self.target, "kill", None)
        if self.signal_name == "SIGKILL" and kill is not None:
            kill()
        elif self.signal_name == "SIGTERM" and stop is not None:
            stop()  # SIGTERM, then SIGKILL if it will not go
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, SIGNALS[self.signal_name])
        # SutProcess.stop() waits up to 10 s before its own SIGKILL: wait longer than that.
        self.detail["gone"] = _wait_gone(old, self.exit_timeout_s)

    def _revert(self) -> None:
        if not self.restart:
            return
        restart = self.target.restart  # type: ignore[attr-defined]
        if getattr(self.target, "can_restart", False):
            restart()
        else:
            # attached (--sut-pid): its supervisor starts it again; wait for that and follow
            # the new process (a timeout raises: the record says nothing restarted it)
            self.detail["restarted_by"] = "supervisor"
            self.detail["supervisor_wait_s"] = round(restart(ready_timeout=self.ready_timeout_s), 4)
        new_pid = self.target.pid
        self.detail["new_pid"] = new_pid
        if self.on_restart is not None:
            self.on_restart(new_pid)
        self.detail["time_to_ready_s"] = round(
            self.target.wait_ready(timeout=self.ready_timeout_s),  # type: ignore[attr-defined]
            4,
        )
        if self._killed_at is not None:
            self.detail["recovery_s"] = round(self._clock() - self._killed_at, 4)
