"""The agent's state: sampler sessions and leased chaos actions on its own host (no HTTP
in here: ``server.py`` answers the routes with it).

Why the pieces are shaped this way:

* Every apply and revert runs on one long-lived worker thread: a CPU hog asks the kernel
  to kill it when the thread that spawned it ends (``PR_SET_PDEATHSIG``), and the
  request threads of ``ThreadingHTTPServer`` end with each request.
* The actions are the chaos package's own (``DEFAULT_ACTIONS``: idempotent, thread-safe
  ``revert``), built against an ``AttachedSut`` for the pid on this host, so what the
  evidence rules read (hog CPU seconds and affinity, pids seen stopped) is observed here,
  where it happened.
* A lease: every authenticated request renews it. When the master's heartbeat stops for
  ``lease_s`` (master killed, network cut), a watcher thread reverts every applied action
  and stops every sampler, as the timeline's ``finally``/atexit/signal handlers would on
  one host. The agent's own exit (SIGTERM/SIGINT, atexit) does the same.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import protocols
from harness.chaos.base import Action, proc_state
from harness.chaos.timeline import DEFAULT_ACTIONS, ActionFactory
from harness.collectors.child import sample_command, start_sample, stop_sample
from harness.errors import ConfigError, HarnessError
from harness.primitives import cpu_model
from harness.sut import SutProcess, attach

DEFAULT_LEASE_S = 10.0
# files of a sampler directory the agent serves (nothing else under its root)
SAMPLE_FILE = re.compile(r"^(?:[a-z_]+\.csv|sampler\.json|sampler\.log)$")
# CSVs are served up to their last complete line, so an incremental copy never holds half
# a row (the sampler appends whole rows; a read may land mid-write)
APPEND_ONLY = (".csv", ".log")


class Forbidden(HarnessError):
    """An action outside the agent's allow-list (HTTP 403)."""


class NotFound(HarnessError):
    """No such process, sampler, action or file on the agent's host (HTTP 404)."""


@dataclass(frozen=True)
class AgentConfig:
    token: str
    allow: tuple[str, ...] = ("cpu_hog", "pause", "kill")
    bind: str = "127.0.0.1"
    port: int = 8765
    lease_s: float = DEFAULT_LEASE_S
    root: str | None = None  # sampler directories (default: a fresh temporary directory)
    sample_interval_s: float = 1.0
    actions: Mapping[str, ActionFactory] = field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    # a server the agent starts and owns (``--sut-cmd``): kill chaos may restart it here
    sut_cmd: str | None = None
    sut_port: int | None = None  # its {port} (default: a free one)
    ready_timeout_s: float = 60.0
    protocol: str | None = None  # the server's wire protocol, for its readiness path
    # HTTPS: the agent's certificate chain and key (PEM); both or neither
    tls_cert: str | None = None
    tls_key: str | None = None
    # serve plain HTTP on an address other hosts reach (the token and the chaos actions
    # then travel unencrypted): only when the user says so
    plain_http: bool = False

    def validate(self) -> AgentConfig:
        if not self.token:
            raise ConfigError(
                "harness agent needs a token: pass --token or set HARNESS_AGENT_TOKEN (the "
                "master passes the same with --agent-token)"
            )
        unknown = [a for a in self.allow if a not in self.actions]
        if unknown:
            raise ConfigError(
                f"--allow has {', '.join(unknown)}; valid: {', '.join(self.actions)} "
                "(comma-separated)"
            )
        if not self.lease_s > 0:
            raise ConfigError(f"--lease has value {self.lease_s}; expected seconds > 0")
        if self.protocol is not None:
            protocols.get(self.protocol)  # unknown: a ConfigError naming the valid ones
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both PEM files")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{flag} has value {path!r}: no such file")
        if self.tls_cert is None and not self.plain_http and not _loopback(self.bind):
            raise ConfigError(
                f"--bind {self.bind} without TLS would send the token, and let anyone on the "
                "path pause or kill the server, in clear text: give --tls-cert FILE --tls-key "
                "FILE (the master then uses --agent https://… and --agent-ca-cert), or "
                "--plain-http to accept that"
            )
        return self


def _loopback(address: str) -> bool:
    """Whether ``address`` (a --bind value) is reachable from this host only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _netns() -> str | None:
    """This process's network namespace (``net:[inode]``): which "host" the agent is on
    when several share a kernel (a pod's sidecar, the two-namespace test)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def _attach(pid: int) -> Any:
    try:
        return attach(int(pid))
    except HarnessError:
        raise NotFound(
            f"no process {pid} on the agent's host {socket.gethostname()}: give the server's "
            "pid there (--sut-pid is the pid on the agent's host)"
        ) from None


@dataclass
class _Sampler:
    id: str
    dir: Path
    proc: subprocess.Popen


class Agent:
    """The agent's state: samplers, applied actions and the lease (no HTTP in here)."""

    def __init__(self, config: AgentConfig, *, clock: Callable[[], float] = time.monotonic):
        self.config = config.validate()
        self.clock = clock
        self.root = Path(config.root or tempfile.mkdtemp(prefix="harness-agent-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.samplers: dict[str, _Sampler] = {}
        self.active: dict[str, Action] = {}  # applied, not yet reverted
        self.done: dict[str, Action] = {}  # reverted (their detail stays readable)
        self._gates: dict[str, threading.Lock] = {}  # one revert at a time per action
        self.expired: list[dict[str, Any]] = []  # what the lease reverted, and when
        self.last_beat = clock()
        # one thread outlives every hog it spawns (PR_SET_PDEATHSIG is per thread)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agent-chaos")
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.sut: Any = None  # the SutProcess of --sut-cmd, once started
        self._sut_pids: set[int] = set()  # every pid it has had (it is restarted by chaos)

    # -- the server it owns ---------------------------------------------------------------

    def start_sut(self) -> float | None:
        """Start ``--sut-cmd`` and wait until it is ready; seconds to ready (None: no cmd).
        Its pid is kept in a file the samplers follow, so a kill + restart through chaos
        is sampled across the restart like on one host."""
        if not self.config.sut_cmd:
            return None
        self.sut = SutProcess(
            self.config.sut_cmd,
            port=self.config.sut_port,
            ready_path=protocols.get(self.config.protocol or protocols.DEFAULT).ready_path,
            log_path=self.root / "sut.log",
            pid_file=self.root / "sut.pid",
        )
        try:
            ready = self.sut.wait_ready(timeout=self.config.ready_timeout_s)
            self._sut_pid_now()
            return ready
        except HarnessError:
            self.sut.stop()
            raise

    def _sut_pid_now(self) -> int | None:
        """The owned server's pid while it runs (remembered among its pids)."""
        if self.sut is None or not self.sut.alive():
            return None
        pid = self.sut.pid
        self._sut_pids.add(pid)
        return pid

    def _owned(self, pid: int) -> bool:
        return self._sut_pid_now() == pid

    def _target(self, pid: int) -> Any:
        """The server behind ``pid``: the one the agent owns (restartable), or attached."""
        return self.sut if self._owned(pid) else _attach(pid)

    # -- lease ----------------------------------------------------------------------------

    def beat(self) -> None:
        self.last_beat = self.clock()

    def start_lease(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="agent-lease", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        every = min(1.0, self.config.lease_s / 4)
        while not self._stop.wait(every):
            self.check_lease()

    def check_lease(self) -> bool:
        """Revert everything when no request came for ``lease_s``; whether it did."""
        silent = self.clock() - self.last_beat
        with self._lock:
            busy = bool(self.active) or any(s.proc.poll() is None for s in self.samplers.values())
        if not busy or silent < self.config.lease_s:
            return False
        self.expired.append({"silent_s": round(silent, 3), "actions": sorted(self.active)})
        self.release(f"lease expired: no word from the master for {silent:.1f} s")
        return True

    def release(self, reason: str) -> None:
        """Revert every applied action and stop every sampler (idempotent)."""
        with self._lock:
            ids = sorted(self.active, reverse=True)
        for aid in ids:
            with contextlib.suppress(Exception):
                self.revert(aid, reason=reason)
        with self._lock:
            samplers = list(self.samplers.values())
        for s in samplers:
            stop_sample(s.proc)

    def shutdown(self, reason: str = "exit") -> None:
        self._stop.set()
        self.release(f"agent {reason}")
        self._worker.shutdown(wait=False)
        if self.sut is not None:
            self.sut.stop()

    # -- facts ----------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "cpu_model": cpu_model(),
            "cores": os.cpu_count(),
            "allow": list(self.config.allow),
            "lease_s": self.config.lease_s,
            "netns": _netns(),
            "time": time.time(),
            # the server it started (--sut-cmd): the master needs no --sut-pid, and kill
            # chaos may restart it
            "sut": None
            if self.sut is None
            else {
                "pid": self.sut.pid if self.sut.alive() else None,
                "url": self.sut.url,
                "cmd": self.sut.cmd,
                "can_restart": True,
            },
        }

    def alive(self, pid: int) -> dict[str, Any]:
        """The master's watchdog asks this every half second: /proc/<pid>/stat only (the
        process tree walk of ``process`` reads every process on the host)."""
        now = self._sut_pid_now()
        if now is not None and pid in self._sut_pids and pid != now:
            # the server it owns was restarted (kill chaos): alive, under a new pid
            return {"pid": pid, "alive": True, "pid_now": now}
        return {"pid": pid, "alive": proc_state(pid) not in ("Z", "X", None)}

    def process(self, pid: int) -> dict[str, Any]:
        h = self._target(pid)
        return {
            "pid": h.pid,
            "alive": h.alive(),
            "pids": h.pids(),
            "cores": list(h.cores or sorted(os.sched_getaffinity(h.pid))),
            "cmd": h.cmd,
        }

    # -- chaos ----------------------------------------------------------------------------

    def _build(self, name: str, params: Mapping[str, Any], pid: int) -> Action:
        if name not in self.config.allow:
            raise Forbidden(
                f"action {name!r} is not allowed on this agent (allowed: "
                f"{', '.join(self.config.allow) or 'none'}); start it with --allow "
                f"{','.join([*self.config.allow, name])}"
            )
        return self.config.actions[name](self._target(pid), dict(params))

    def check(self, name: str, params: Mapping[str, Any], pid: int) -> dict[str, Any]:
        """Build the action without applying it: its params, or the error it would raise."""
        return {"params": self._build(name, params, pid).params}

    def apply(self, name: str, params: Mapping[str, Any], pid: int) -> dict[str, Any]:
        action = self._build(name, params, pid)
        aid = f"a{next(self._ids)}"
        with self._lock:
            self.active[aid] = action
        try:
            self._worker.submit(action.apply).result()
        except Exception:
            self.revert(aid)
            raise
        return {"id": aid, "params": action.params, "detail": dict(action.detail)}

    def revert(self, aid: str, reason: str | None = None) -> dict[str, Any]:
        """Revert action ``aid`` (once) and answer its detail. A revert already under way
        (the lease's, the master's) is waited for, not missed: the action moves to
        ``done`` before it is reverted, under a gate the second caller blocks on."""
        with self._lock:
            action = self.active.pop(aid, None)
            if action is not None:
                self.done[aid] = action
            else:
                action = self.done.get(aid)
            gate = self._gates.setdefault(aid, threading.Lock())
        if action is None:
            raise NotFound(f"no action {aid!r} on this agent")
        with gate:
            if not action.reverted:
                if self._stop.is_set() or threading.current_thread().name.startswith("agent-"):
                    action.revert()  # the worker may be gone (exit) or be this thread
                else:
                    self._worker.submit(action.revert).result()
                if reason:
                    action.detail["interrupted"] = reason
        return {"id": aid, "detail": dict(action.detail)}

    # -- samplers -------------------------------------------------------------------------

    def start_sampler(self, pid: int, metrics_url: str | None = None) -> dict[str, Any]:
        owned = self._owned(pid)
        if not owned:
            _attach(pid)
        sid = f"s{next(self._ids)}"
        out = self.root / sid
        out.mkdir(parents=True)
        cmd = sample_command(
            pid,
            out,
            interval_s=self.config.sample_interval_s,
            metrics_url=metrics_url,
            pid_file=self.sut.pid_file if owned else None,
        )
        proc = start_sample(cmd, out)
        with self._lock:
            self.samplers[sid] = _Sampler(sid, out, proc)
        return {"id": sid, "pid": proc.pid}

    def _sampler(self, sid: str) -> _Sampler:
        with self._lock:
            s = self.samplers.get(sid)
        if s is None:
            raise NotFound(f"no sampler {sid!r} on this agent")
        return s

    def stop_sampler(self, sid: str) -> dict[str, Any]:
        s = self._sampler(sid)
        code = stop_sample(s.proc)
        return {"id": sid, "returncode": code}

    def files(self, sid: str) -> dict[str, int]:
        s = self._sampler(sid)
        return {
            p.name: p.stat().st_size for p in sorted(s.dir.iterdir()) if SAMPLE_FILE.match(p.name)
        }

    def pull(self, sid: str, have: Mapping[str, int], meta_mtime: int | None) -> dict[str, Any]:
        """Everything new since the master's copy, in one answer: each file's bytes from the
        size the master has (base64), sampler.json whole when it was rewritten since
        ``meta_mtime`` (it is written at the sampler's start and end only)."""
        s = self._sampler(sid)
        out: dict[str, Any] = {"files": {}, "meta_mtime": meta_mtime}
        for p in sorted(s.dir.iterdir()):
            if not SAMPLE_FILE.match(p.name):
                continue
            st = p.stat()
            if p.name == "sampler.json":
                if st.st_mtime_ns == meta_mtime:
                    continue
                out["meta_mtime"] = st.st_mtime_ns
                data = self.read(sid, p.name)
            elif st.st_size > int(have.get(p.name, 0)):
                data = self.read(sid, p.name, int(have.get(p.name, 0)))
            else:
                continue
            out["files"][p.name] = base64.b64encode(data).decode()
        return out

    def read(self, sid: str, name: str, offset: int = 0) -> bytes:
        s = self._sampler(sid)
        if not SAMPLE_FILE.match(name) or not (s.dir / name).is_file():
            raise NotFound(f"no file {name!r} in sampler {sid}")
        with open(s.dir / name, "rb") as f:
            f.seek(max(0, offset))
            data = f.read()
        if name.endswith(APPEND_ONLY) and s.proc.poll() is None:
            data = data[: data.rfind(b"\n") + 1]
        return data

    def remove_sampler(self, sid: str) -> None:
        s = self._sampler(sid)
        stop_sample(s.proc)
        with self._lock:
            self.samplers.pop(sid, None)
        shutil.rmtree(s.dir, ignore_errors=True)
