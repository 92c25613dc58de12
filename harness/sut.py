"""The server under test: start it (pinned, in its own process group), wait until it is
ready, stop/restart it, or attach to one the user started.

Readiness is judged by status code only (Triton and MLServer send empty bodies).
Everything is stopped by pid, never by name.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from harness.errors import ConfigError, TargetUnavailable

READY_PATH = "/v2/health/ready"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on ``host`` right now (there is a small race, as always)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def available_cores() -> tuple[int, ...]:
    """Cores this process may run on (its affinity), not ``os.cpu_count()``."""
    return tuple(sorted(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class CoreSplit:
    """Which cores the SUT and the load generator get. ``shared`` when they overlap."""

    sut: tuple[int, ...]
    loadgen: tuple[int, ...]

    @property
    def shared(self) -> bool:
        return bool(set(self.sut) & set(self.loadgen))

    def as_dict(self) -> dict:
        return {"sut": list(self.sut), "loadgen": list(self.loadgen), "shared": self.shared}


def choose_cores(available: Sequence[int] | None = None, sut_count: int | None = None) -> CoreSplit:
    """Give the SUT the highest-numbered ``sut_count`` cores and the load generator the rest.

    Default ``sut_count`` is half the cores rounded up (2 cores: SUT on 1, load on 0). With a
    single core, or ``sut_count`` equal to every core, both share all of them.
    """
    cores = tuple(sorted(available if available is not None else available_cores()))
    if not cores:
        raise ConfigError("cores: no CPU cores available to split; valid: at least one core")
    n = len(cores)
    if sut_count is None:
        sut_count = (n + 1) // 2 if n > 1 else 1
    if not 1 <= sut_count <= n:
        raise ConfigError(f"sut_cores has value {sut_count}. Valid: 1..{n} (cores {list(cores)})")
    if sut_count == n:
        return CoreSplit(sut=cores, loadgen=cores)
    return CoreSplit(sut=cores[n - sut_count :], loadgen=cores[: n - sut_count])


def split_cores(given: str | None, available: Sequence[int] | None = None) -> CoreSplit:
    """The server's and the load generator's cores for ``--sut-cores`` as given (the
    generator gets the rest of ``available``), or the default split (``choose_cores``)
    when None. A server given every available core shares them (``shared``)."""
    cores = tuple(sorted(available if available is not None else available_cores()))
    if not given:
        return choose_cores(cores)
    sut_cores = parse_cores(given)
    rest = tuple(c for c in cores if c not in sut_cores)
    return CoreSplit(sut=sut_cores, loadgen=rest or cores)


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` → ``(0, 2, 3)`` (taskset -c syntax)."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.update(range(int(lo), int(hi) + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise ConfigError(f"cores has value {text!r}. Valid: a list like '1' or '0,2-3'") from None
    if not out:
        raise ConfigError(f"cores has value {text!r}. Valid: a list like '1' or '0,2-3'")
    return tuple(sorted(out))


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its live descendants (empty if ``pid`` is gone)."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def _poll_ready(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_pid_file(path: Path, pid: int) -> None:
    """Replace ``path`` with ``pid`` atomically (``harness sample --pid-file`` follows it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the body, then deliver them to the handlers they had.

    Python runs a signal's handler between two bytecodes of the main thread, so a handler
    that raises (Ctrl-C's KeyboardInterrupt, `harness tune`'s SIGTERM) can land between
    two steps that must not be parted, such as starting a server and starting the guard
    that stops it. Off the main thread nothing is held: handlers run on the main thread
    only. Ignored signals stay ignored; a signal whose action is the default (end the
    process) is held too and then ends it, with the guard in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is signal.SIG_IGN or handler is None:
            continue
        previous[sig] = signal.signal(sig, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(got):
            signal.raise_signal(sig)


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

    def __init__(self, pid: int, url: str | None = None, pid_file: Path | None = None) -> None:
        if not psutil.pid_exists(pid):
            raise TargetUnavailable(
                f"--sut-pid has value {pid}: no such process. Give the pid of the running server"
            )
        self.pid = pid
        self.url = url
        self.cmd = " ".join(psutil.Process(pid).cmdline())
        self.pid_file = pid_file
        self._write_pid()
        self.ready_after_s: float | None = None  # the supervisor's new process: start → ready

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
            if pid is not None and pid != old and _poll_ready(self.url + READY_PATH, 1.0):
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


def process_age_s(pid: int) -> float | None:
    """Seconds since ``pid`` started, to the clock tick: its start and the uptime are both
    counted from boot (psutil's create_time adds a boot time rounded to the second)."""
    # (harness.collectors.procfs parses stat fully, but this layer imports only errors)
    try:
        with open(f"/proc/{pid}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this host (of a pre-forked server's
    listeners, the one whose parent does not listen there too); None when none does."""
    pids = set()
    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                pids.add(c.pid)
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).ppid() not in pids:
                return pid
    return min(pids) if pids else None


def attach(pid: int, url: str | None = None, pid_file: Path | None = None) -> AttachedSut:
    """Watch a server the user started (``--sut-pid``)."""
    return AttachedSut(pid, url, pid_file)


class SutProcess:
    """Start a server command and own it until ``stop()``.

    ``cmd`` is a template: ``{port}`` and ``{threads}`` are filled in. The process gets its
    own process group and, when ``cores`` is given, an affinity every thread inherits
    (``taskset -c`` when present, else ``sched_setaffinity`` before exec). ``env`` adds to
    (overrides) this process's environment. ``pid_file``, when given, is rewritten with the
    pid on every start, so ``harness sample --pid-file`` follows a restarted server.
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
    ) -> None:
        self.template = cmd
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
        # stops the server if this process dies, SIGKILL included (harness.sut_guard)
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
                [sys.executable, "-m", "harness.sut_guard", str(os.getpid()), str(server_pid)],
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
        ready_url = url or self.url + READY_PATH
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
            if _poll_ready(ready_url, timeout_s=min(2.0, max(0.1, timeout))):
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
