"""A server command the harness starts and owns: pinned to its cores, in its own process
group, with a guard process (``harness.sut.guard``) that stops it when the harness dies."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import psutil

from harness import protocols
from harness.errors import ConfigError, TargetUnavailable
from harness.primitives import STOP_SIGNALS, trapped_signals
from harness.sut import guard
from harness.sut.host import free_port, poll_ready, tree_pids, write_pid_file


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the body, then deliver them to the handlers they had.

    Python runs a signal's handler between two bytecodes of the main thread, so a handler
    that raises (Ctrl-C's KeyboardInterrupt, `harness tune`'s SIGTERM) can land between
    two steps that must not be parted, such as starting a server and starting the guard
    that stops it. Off the main thread nothing is held: handlers run on the main thread
    only. Ignored signals stay ignored; a signal whose action is the default (end the
    process) is held too and then ends it, with the guard in place."""
    held = tuple(sig for sig in STOP_SIGNALS if signal.getsignal(sig) not in (signal.SIG_IGN, None))
    got: list[int] = []
    try:
        with trapped_signals(got.append, held):
            yield
    finally:
        for sig in dict.fromkeys(got):
            signal.raise_signal(sig)


class SutProcess:
    """Start a server command and own it until ``stop()``.

    ``cmd`` is a template: ``{port}`` and ``{threads}`` are filled in. The process gets its
    own process group and, when ``cores`` is given, an affinity every thread inherits
    (``taskset -c`` when present, else ``sched_setaffinity`` before exec). ``env`` adds to
    (overrides) this process's environment. ``pid_file``, when given, is rewritten with the
    pid on every start, so ``harness sample --pid-file`` follows a restarted server.
    ``ready_path``: GET it for readiness (default: the default protocol's, see
    ``harness.protocols``).
    """

    can_restart = True

    def __init__(
        self,
        cmd: str | Sequence[str],
        *,
        port: int | None = None,
        threads: int = 1,
        host: str = "127.0.0.1",
        cores: Iterable[int] | None = None,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        pid_file: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        ready_path: str | None = None,
    ) -> None:
        self.template = cmd
        self.ready_path = ready_path if ready_path is not None else protocols.default().ready_path
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.threads = threads
        self.cores = tuple(sorted(cores)) if cores is not None else None
        self.env = env
        self.pid_file = Path(pid_file) if pid_file else None
        self._clock = clock
        self._log_path = Path(log_path) if log_path else None
        self._log_file = None
        self._own_log = False
        self._popen: subprocess.Popen | None = None
        # stops the server if this process dies, SIGKILL included (harness.sut.guard)
        self._guard: subprocess.Popen | None = None
        self._stale_guards: list[subprocess.Popen] = []
        self.spawned_at: float | None = None
        self.argv = self._fill(cmd)
        self.cmd = shlex.join(self.argv)

    def _fill(self, cmd: str | Sequence[str]) -> list[str]:
        fields = {"port": self.port, "threads": self.threads}
        try:
            if isinstance(cmd, str):
                return shlex.split(cmd.format(**fields))
            return [str(a).format(**fields) for a in cmd]
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                f"--sut-cmd has value {cmd!r}: bad placeholder {e}. Valid placeholders: {{port}}, {{threads}}"
            ) from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready_url(self) -> str:
        """GET it: 200 means the server is ready."""
        return self.url + self.ready_path

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise TargetUnavailable(f"server {self.cmd!r} was not started; call start() first")
        return self._popen.pid

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def pids(self) -> list[int]:
        return tree_pids(self.pid) if self._popen is not None else []

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the server has exited (negative: killed by that signal)."""
        return self._popen.poll() if self._popen is not None else None

    def start(self) -> SutProcess:
        """Start the server and its guard, as one step: a SIGINT/SIGTERM that arrives while
        they start is held until both run (``_signals_held``), so no server is left without
        the guard that stops it, and an exception out of here leaves no server running."""
        if self.alive():
            return self
        try:
            with _signals_held():
                self._spawn()
        except BaseException:
            if self._popen is not None:
                self.stop()
            elif self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            raise
        return self

    def _spawn(self) -> None:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="harness-sut-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
            self._own_log = True  # a temp file of ours: removed at stop() if still empty
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 (held until stop)
        argv = list(self.argv)
        preexec = None
        if self.cores is not None:
            cores = self.cores
            if shutil.which("taskset"):
                argv = ["taskset", "-c", ",".join(map(str, cores)), *argv]
            else:

                def preexec() -> None:  # runs in the child between fork and exec
                    os.sched_setaffinity(0, cores)

        try:
            self._popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
                start_new_session=True,  # own process group: a Ctrl-C to us is not sent to it
                preexec_fn=preexec,
            )
        except OSError as e:
            raise TargetUnavailable(
                f"could not start server {self.cmd!r}: {e}. Check --sut-cmd (the executable and its path)"
            ) from None
        self.spawned_at = self._clock()
        if self.pid_file is not None:
            write_pid_file(self.pid_file, self._popen.pid)
        self._start_guard(self._popen.pid)

    def _start_guard(self, server_pid: int) -> None:
        """A process that stops this server's group when this process dies: no handler,
        atexit or finally of ours runs after a SIGKILL, and a server left behind holds its
        port and CPU (the guard of the server this one replaces exits with that server)."""
        self._reap_guard(wait_s=0.0)
        try:
            self._guard = subprocess.Popen(
                # the file itself, -I -S: it needs only the standard library, and
                # `-m harness.sut.guard` imports the package first (~10x its CPU, spent
                # on the load generator's core at every restart: a dispatch lag spike)
                [sys.executable, "-I", "-S", guard.__file__, str(os.getpid()), str(server_pid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to us must not reach it first
            )
        except OSError:
            self._guard = None  # no guard: the normal stop paths still stop the server

    def _reap_guard(self, wait_s: float) -> None:
        g, self._guard = self._guard, None
        if g is None:
            return
        if g.poll() is None and wait_s > 0:
            with contextlib.suppress(ProcessLookupError):
                g.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                g.wait(wait_s)
        if g.poll() is None and wait_s == 0:
            self._stale_guards.append(g)  # its server is gone or going: it exits by itself
        self._stale_guards = [x for x in self._stale_guards if x.poll() is None]

    def tail(self, lines: int = 20) -> str:
        """The last lines the server wrote (stdout and stderr share one log)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with open(self._log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", "replace")
        return "\n".join(data.splitlines()[-lines:])

    def wait_ready(
        self, url: str | None = None, timeout: float = 60.0, poll_s: float = 0.05
    ) -> float:
        """Poll the readiness URL until 200; return seconds from spawn to the first 200."""
        ready_url = url or self.ready_url
        if self._popen is None or self.spawned_at is None:
            self.start()
        assert self._popen is not None and self.spawned_at is not None
        deadline = self.spawned_at + timeout
        while True:
            code = self._popen.poll()
            if code is not None:
                raise TargetUnavailable(
                    f"server {self.cmd!r} exited with code {code} before {ready_url} answered 200. "
                    f"Fix the command or the server; its last output:\n{self.tail()}"
                )
            if poll_ready(ready_url, timeout_s=min(2.0, max(0.1, timeout))):
                return self._clock() - self.spawned_at
            now = self._clock()
            if now >= deadline:
                raise TargetUnavailable(
                    f"server {self.cmd!r} (pid {self._popen.pid}) did not answer 200 at {ready_url} "
                    f"within {timeout:.0f} s. Raise the ready timeout or check the port/readiness "
                    f"path; its last output:\n{self.tail()}"
                )
            time.sleep(min(poll_s, max(0.0, deadline - now)))

    def kill(self) -> None:
        """SIGKILL the server and its children at once (chaos); no grace period."""
        if self._popen is None:
            return
        for p in reversed(self.pids()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        self._reap(5.0)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL what is left. Returns the exit code."""
        if self._popen is None:
            return None
        try:
            if self._popen.poll() is None:
                family = self.pids()
                # A stopped (paused) server cannot handle SIGTERM: continue it first.
                for p in family:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGCONT)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._popen.pid, signal.SIGTERM)
                try:
                    self._popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._popen.pid, signal.SIGKILL)
                    self._popen.wait(5.0)
                # Children the server left behind (it should have ended them itself).
                leftovers = []
                for p in family[1:]:
                    with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                        proc = psutil.Process(p)
                        if proc.status() != psutil.STATUS_ZOMBIE:
                            proc.kill()  # psutil checks the pid was not reused
                            leftovers.append(proc)
                psutil.wait_procs(leftovers, timeout=5.0)
            return self._popen.returncode
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            if self._own_log and self._log_path is not None:
                with contextlib.suppress(OSError):
                    if self._log_path.stat().st_size == 0:  # nothing to read: no file left
                        self._log_path.unlink()
                        self._log_path, self._own_log = None, False
            self._reap_guard(wait_s=2.0)

    def _reap(self, timeout: float) -> None:
        assert self._popen is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def restart(self, ready_timeout: float | None = None) -> float | None:
        """Stop (if running) and start again on the same port and cores.

        Returns seconds to ready when ``ready_timeout`` is given, else None.
        """
        self.stop()
        self._popen = None
        self.start()
        if ready_timeout is not None:
            return self.wait_ready(timeout=ready_timeout)
        return None

    def __enter__(self) -> SutProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> dict:
        return {
            "target": self.url,
            "pid": self._popen.pid if self._popen else None,
            "cmd": self.cmd,
            "cores": list(self.cores) if self.cores is not None else None,
        }
