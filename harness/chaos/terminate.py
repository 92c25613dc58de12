"""Terminate: SIGTERM the SUT as a rolling update does, time its drain and exit, restart it.

What a rolling update asks of a server is judged from what happened, so the detail
records what the kernel and the server did, not what was asked:

* ``found``: the process was running when signalled; ``ignored``: it had SIGTERM set to
  SIG_IGN (``/proc/<pid>/status`` SigIgn) — then nothing was asked of it;
* ``unready_s``: seconds from the signal until its readiness endpoint stopped answering
  200 (a draining server says so at once; None when it never did, or no URL is known);
* ``exit_s`` and ``exit_code``: when it exited and with what (None: still running at the
  drain timeout, when the harness SIGKILLs it: ``killed``; an attached server's exit
  code is not ours to read: None);
* with ``restart``, ``new_pid`` and ``time_to_ready_s`` of the replacement.

A SIGTERM that found no process, was ignored, or that the server showed no sign of
(neither unready nor exited) is no evidence of a shutdown: the run is invalid
(harness.analysis.chaos_evidence). A server that drained but did not exit in time is
evidence — of a defect, judged by the shutdown checks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.chaos.base import Action, ChaosTarget, proc_state
from harness.errors import ConfigError

GONE = ("Z", "X", None)
POLL_S = 0.02


def sigterm_ignored(pid: int) -> bool | None:
    """Whether ``pid`` has SIGTERM set to SIG_IGN (None: unknown, no such process)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:
        return None
    return None


def _ready(url: str, timeout_s: float) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Terminate(Action):
    """SIGTERM the SUT's main process, wait up to ``drain_timeout_s`` for it to exit
    (then SIGKILL it), and after ``duration_s`` restart it when ``restart``."""

    name = "terminate"

    def __init__(
        self,
        target: ChaosTarget,
        duration_s: float = 0.0,
        *,
        drain_timeout_s: float = 30.0,
        restart: bool = True,
        ready_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(duration_s)
        if not drain_timeout_s or drain_timeout_s <= 0:
            raise ConfigError(
                f"terminate.drain_timeout_s has value {drain_timeout_s!r}. Valid: seconds > 0"
            )
        if restart and not getattr(target, "can_restart", False):
            raise ConfigError(
                "terminate.restart is true but the SUT was attached by pid (--sut-pid): the "
                "harness cannot restart it. Start it with --sut-cmd, or set restart = false"
            )
        self.target = target
        self.drain_timeout_s = float(drain_timeout_s)
        self.restart = restart
        self.ready_timeout_s = ready_timeout_s
        self._clock = clock
        # revert() may come from another thread (the run ending) while apply() still
        # waits for the exit: it waits for apply to finish before it restarts anything.
        self._apply_done = threading.Event()

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> Terminate:
        return cls(
            target,
            float(params.get("duration_s", 0.0)),
            drain_timeout_s=float(params.get("drain_timeout_s", 30.0)),
            restart=bool(params.get("restart", True)),
        )

    @property
    def params(self) -> dict[str, Any]:
        return {
            "restart": self.restart,
            "drain_timeout_s": self.drain_timeout_s,
            "duration_s": self.duration_s,
        }

    def _exit_code(self) -> tuple[bool, int | None]:
        """(exited, exit code) of the target's main process."""
        rc = getattr(self.target, "returncode", None)
        popen_like = getattr(self.target, "_popen", None) is not None
        if popen_like:  # a SutProcess: Popen.poll reaps it and knows the code
            return rc is not None, rc
        return proc_state(self.detail["old_pid"]) in GONE, None

    def _apply(self) -> None:
        try:
            self._signal_and_wait()
        finally:
            self._apply_done.set()

    def _signal_and_wait(self) -> None:
        old = self.target.pid
        self.detail["old_pid"] = old
        state = proc_state(old)
        self.detail["found"] = state not in GONE
        self.detail["ignored"] = sigterm_ignored(old)
        # the server's readiness URL (its protocol's path), None when it has no URL
        ready_url = getattr(self.target, "ready_url", None)
        if not self.detail["found"]:
            return
        if state in ("T", "t"):  # a stopped process cannot handle SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGCONT)
        t0 = self._clock()
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGTERM)
        self.detail["unready_s"] = None
        deadline = t0 + self.drain_timeout_s
        next_probe = t0
        while True:
            exited, code = self._exit_code()
            now = self._clock()
            if exited:
                self.detail["exit_s"] = round(now - t0, 4)
                self.detail["exit_code"] = code
                if self.detail["unready_s"] is None and ready_url:
                    self.detail["unready_s"] = round(now - t0, 4)
                break
            if now >= deadline or self._reverted:  # the drain timeout, or the run ended
                self.detail["exit_s"] = None
                self.detail["exit_code"] = None
                self.detail["cut_short"] = now < deadline
                break
            if ready_url and self.detail["unready_s"] is None and now >= next_probe:
                if not _ready(ready_url, timeout_s=0.5):
                    self.detail["unready_s"] = round(self._clock() - t0, 4)
                next_probe = self._clock() + 0.05
            time.sleep(POLL_S)
        self.detail["killed"] = False
        if self.detail["exit_s"] is None and not self.detail.get("cut_short"):
            # past the drain timeout: what an orchestrator does
            self.detail["killed"] = True
            kill = getattr(self.target, "kill", None)
            if kill is not None:
                kill()
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old, signal.SIGKILL)
        self.detail["gone"] = proc_state(old) in GONE

    def _revert(self) -> None:
        self._apply_done.wait(self.drain_timeout_s + 15.0)
        if not self.restart or not self.detail.get("found") or self.detail.get("cut_short"):
            return  # cut short: the run is ending, and the harness stops the server
        restart = self.target.restart  # type: ignore[attr-defined]
        restart()
        self.detail["new_pid"] = self.target.pid
        self.detail["time_to_ready_s"] = round(
            self.target.wait_ready(timeout=self.ready_timeout_s),  # type: ignore[attr-defined]
            4,
        )
