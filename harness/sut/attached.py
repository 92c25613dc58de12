"""A server the user started (``--sut-pid``): watched by pid, never started or stopped;
after a kill its supervisor's new process is followed."""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
from pathlib import Path

import psutil

from harness import protocols
from harness.errors import TargetUnavailable
from harness.sut.host import listener_pid, poll_ready, process_age_s, tree_pids, write_pid_file


class AttachedSut:
    """A server the user started; we watch it by pid but never start or stop it.

    When it is killed (crash_restart), its supervisor — systemd's ``Restart=``, Kubernetes,
    a restart loop — starts it again: ``restart`` waits for a new process listening on the
    server's port that answers ready, and follows it (``pid``, and ``pid_file`` for the
    sampler). Nothing restarting it within the timeout is an error naming that.
    """

    can_restart = False  # the harness cannot start it

    @property
    def waits_for_supervisor(self) -> bool:
        """A kill with restart waits for its supervisor: needs its URL (ready, port)."""
        return self.url is not None

    def __init__(
        self,
        pid: int,
        url: str | None = None,
        pid_file: Path | None = None,
        ready_path: str | None = None,
    ) -> None:
        if not psutil.pid_exists(pid):
            raise TargetUnavailable(
                f"--sut-pid has value {pid}: no such process. Give the pid of the running server"
            )
        self.pid = pid
        self.url = url
        # GET it on the server's URL: 200 means ready (default: the default protocol's)
        self.ready_path = ready_path if ready_path is not None else protocols.default().ready_path
        self.cmd = " ".join(psutil.Process(pid).cmdline())
        self.pid_file = pid_file
        self._write_pid()
        self.ready_after_s: float | None = None  # the supervisor's new process: start → ready

    @property
    def ready_url(self) -> str | None:
        """GET it: 200 means the server is ready (None: no URL to ask)."""
        return None if self.url is None else self.url + self.ready_path

    def _write_pid(self) -> None:
        if self.pid_file is not None:
            write_pid_file(self.pid_file, self.pid)

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted(os.sched_getaffinity(self.pid)))

    def pids(self) -> list[int]:
        return tree_pids(self.pid)

    def alive(self) -> bool:
        return bool(tree_pids(self.pid))

    def restart(self, ready_timeout: float = 60.0, poll_s: float = 0.05) -> float:
        """Wait for the supervisor's new server (another pid listening on the port, ready);
        follow it. Seconds waited."""
        if self.url is None:
            raise TargetUnavailable("the attached server has no URL: cannot wait for its restart")
        port = urllib.parse.urlsplit(self.url).port or 80
        old, t0 = self.pid, time.monotonic()
        deadline = t0 + ready_timeout
        while time.monotonic() < deadline:
            pid = listener_pid(port)
            if pid is not None and pid != old and poll_ready(self.url + self.ready_path, 1.0):
                self.pid = pid
                self.ready_after_s = process_age_s(pid)
                with contextlib.suppress(psutil.Error):
                    self.cmd = " ".join(psutil.Process(pid).cmdline())
                self._write_pid()
                return time.monotonic() - t0
            time.sleep(poll_s)
        raise TargetUnavailable(
            f"nothing restarted the server on port {port} within {ready_timeout:.0f} s of the "
            "kill. A server attached by --sut-pid is restarted by its supervisor (systemd "
            "Restart=, Kubernetes, a restart loop); without one, set restart = false or use "
            "--sut-cmd"
        )

    def wait_ready(self, timeout: float = 60.0) -> float:
        """After ``restart``: seconds from the new process's start to ready (the server's own
        start, not the supervisor's delay before it), as SutProcess reports its restart."""
        return self.ready_after_s or 0.0


def attach(
    pid: int, url: str | None = None, pid_file: Path | None = None, ready_path: str | None = None
) -> AttachedSut:
    """Watch a server the user started (``--sut-pid``)."""
    return AttachedSut(pid, url, pid_file, ready_path)
