"""The master's side of ``harness agent``: connect, align clocks, proxy chaos and samples.

``connect_sut`` is what ``SutControl`` calls for ``--agent URL --sut-pid PID``: it checks
everything knowable before load (the agent answers, the token is right, the pid runs on
the agent's host, every chaos event of the scenario is allowed and well-formed) and
raises a ``ConfigError`` naming the fix (exit 2) otherwise. It returns a ``RemoteSut``:
a ``ChaosTarget`` whose ``chaos_actions`` build ``RemoteAction`` proxies (the timeline
runs them like local ones; the records carry the detail the agent observed) and whose
``start_sampler`` copies the agent's sampler files into the run's ``samples/`` while the
run goes, so ``read_samples`` reads them unchanged.

Clocks: the agent's ``time.time()`` is read at connect, NTP-style — the sample with the
shortest round trip wins, and the offset is the agent's clock minus the midpoint of the
request. Sample times are moved onto the master's clock by that offset
(``sampler.json`` ``started_unix``/``stopped_unix``; the CSVs' ``t`` count from it).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import logging
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.agent import routes
from harness.agent.loadgen import merge
from harness.agent.routes import API
from harness.chaos.base import Action
from harness.chaos.timeline import DEFAULT_ACTIONS, ActionFactory
from harness.collectors import read_samples
from harness.errors import ConfigError, HarnessError, TargetUnavailable
from harness.primitives import atomic_write

log = logging.getLogger("harness.agent")

CLOCK_PROBES = 5
# a kill waits up to 15 s for the process to exit (KillRestart.exit_timeout_s)
ACTION_TIMEOUT_S = 30.0
FOLLOW_EVERY_S = 2.0  # the samples copied while the run goes (the live view reads them)


class AgentRefused(ConfigError):
    """The agent answered but refused (token, allow-list, unknown pid or parameter)."""


def clock_offset(probes: Iterable[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset_s, rtt_s) from ``(sent, agent_time, received)`` probes on the master's
    clock: the probe with the shortest round trip, offset = agent − midpoint. The error
    is at most half that round trip."""
    best = min(probes, key=lambda p: p[2] - p[0])
    sent, agent_t, received = best
    return agent_t - (sent + received) / 2.0, received - sent


class AgentClient:
    """JSON over HTTP with the bearer token; errors become one-line ``HarnessError``s."""

    def __init__(
        self, url: str, token: str | None, timeout_s: float = 10.0, ca_cert: str | None = None
    ) -> None:
        """``ca_cert`` (default: $HARNESS_AGENT_CA_CERT, else the system's CAs): the CA
        that signed an ``https://`` agent's certificate."""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--agent has value {url!r}; expected the agent's URL such as http://10.0.0.5:8765"
            )
        if not token:
            raise ConfigError(
                "--agent needs a token: pass --agent-token or set HARNESS_AGENT_TOKEN (the "
                "same as the agent's --token)"
            )
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self._tls: ssl.SSLContext | None = None
        if url.startswith("https://"):
            ca_cert = ca_cert or os.environ.get("HARNESS_AGENT_CA_CERT") or None
            try:
                self._tls = ssl.create_default_context(cafile=ca_cert)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"--agent-ca-cert has value {ca_cert!r}: not a readable PEM CA file ({exc})"
                ) from None

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        raw: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.url}{API}/{path}",
            data=data if method == "POST" else None,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(
                req, timeout=timeout_s or self.timeout_s, context=self._tls
            ) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                msg = json.loads(exc.read()).get("error") or exc.reason
            except (ValueError, AttributeError):
                msg = exc.reason
            if exc.code == 401:
                raise AgentRefused(f"agent {self.url} refused the token: {msg}") from None
            if exc.code in (400, 403, 404):
                raise AgentRefused(f"agent {self.url}: {msg}") from None
            raise TargetUnavailable(f"agent {self.url} failed: HTTP {exc.code} {msg}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLError):
                raise ConfigError(
                    f"TLS handshake with agent {self.url} failed ({reason}); pass "
                    "--agent-ca-cert FILE (or $HARNESS_AGENT_CA_CERT) with the CA that signed "
                    "the agent's --tls-cert"
                ) from None
            raise ConfigError(
                f"agent {self.url} is unreachable ({reason}); start `harness agent --bind "
                "ADDR --port PORT --token TOKEN` on the server's host or fix --agent"
            ) from None
        return payload if raw else json.loads(payload or b"null")

    def request(
        self,
        route: routes.Route,
        body: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        **params: Any,
    ) -> Any:
        """Call ``route``, its path parameters and query filled from ``params``."""
        path = route.path(**params)
        return self.call(route.method, path, body, raw=route.raw, timeout_s=timeout_s)

    def measure_clock(self, probes: int = CLOCK_PROBES) -> tuple[dict[str, Any], float, float]:
        """The agent's info and (offset_s, rtt_s) from ``probes`` info calls."""
        samples = []
        info: dict[str, Any] = {}
        for _ in range(probes):
            sent = time.time()
            info = self.request(routes.INFO)
            samples.append((sent, float(info["time"]), time.time()))
        offset, rtt = clock_offset(samples)
        return info, offset, rtt


class RemoteAction(Action):
    """A chaos action applied and reverted by the agent (built there at ``check``)."""

    def __init__(self, sut: RemoteSut, name: str, params: Mapping[str, Any]) -> None:
        checked = sut.client.request(
            routes.ACTION_CHECK, {"action": name, "params": dict(params), "pid": sut.pid}
        )["params"]
        super().__init__(checked.get("duration_s"))
        self.name = name
        self.sut = sut
        self._params = dict(checked)
        self._asked = dict(params)
        self._id: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    def _apply(self) -> None:
        doc = self.sut.client.request(
            routes.ACTION_APPLY,
            {"action": self.name, "params": self._asked, "pid": self.sut.pid},
            timeout_s=ACTION_TIMEOUT_S,
        )
        self._id = doc["id"]
        self.detail.update(doc["detail"], agent_host=self.sut.host)

    def _revert(self) -> None:
        if self._id is None:
            return
        doc = self.sut.client.request(
            routes.ACTION_REVERT, timeout_s=ACTION_TIMEOUT_S, aid=self._id
        )
        self.detail.update(doc["detail"], agent_host=self.sut.host)


class RemoteSampler:
    """``harness sample`` on the agent's host, its files copied into ``out``."""

    def __init__(self, sut: RemoteSut, out: Path, metrics_url: str | None) -> None:
        self.sut = sut
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        started = sut.client.request(
            routes.SAMPLER_START, {"pid": sut.pid, "metrics_url": metrics_url}
        )
        self.id = started["id"]
        self._lock = threading.Lock()
        self._meta_mtime: int | None = None
        self.local = out / "local"
        self._loadgen = start_loadgen(self.local)

    def fetch(self, offload: Callable[..., Any] | None = None) -> None:
        """Copy what is new in one request: the CSVs and log from where the local copy
        ends, sampler.json whole (when rewritten) with its times moved onto the master's
        clock. ``offload(fn, args)`` runs the file writes elsewhere and waits for them
        (gevent's native threadpool: a write can wait on the disk, and on the load's
        gevent loop that wait holds every send)."""
        with self._lock:
            have = {p.name: p.stat().st_size for p in self.out.iterdir() if p.is_file()}
            doc = self.sut.client.request(
                routes.SAMPLER_PULL, {"have": have, "meta_mtime": self._meta_mtime}, sid=self.id
            )
            self._meta_mtime = doc["meta_mtime"]
            files: list[tuple[str, bytes]] = []
            for name, b64 in doc["files"].items():
                if name == "loadgen.csv":
                    continue  # the agent's parent, not the generator (see not_here)
                data = base64.b64decode(b64)
                if name == "sampler.json":
                    meta = shift_meta(json.loads(data), self.sut.clock_offset_s)
                    meta["agent"] = self.sut.agent_doc
                    data = json.dumps(meta, indent=2).encode()
                files.append((name, data))
            if offload is None:
                self._store(files)
            else:
                offload(self._store, (files,))

    def _store(self, files: list[tuple[str, bytes]]) -> None:
        """sampler.json replaced whole, the other files appended to."""
        for name, data in files:
            local = self.out / name
            if name == "sampler.json":
                atomic_write(local, data)
            else:
                with open(local, "ab") as f:
                    f.write(data)

    def follow(
        self,
        sleep: Callable[[float], Any] = time.sleep,
        offload: Callable[..., Any] | None = None,
    ) -> None:
        """Copy every ``FOLLOW_EVERY_S`` until killed (a greenlet of the run)."""
        while True:
            sleep(FOLLOW_EVERY_S)
            try:
                self.fetch(offload)
            except HarnessError as exc:
                log.warning("harness: copying the agent's samples: %s", exc)

    def finish(self) -> dict[str, Any] | None:
        """Stop the sampler, copy the rest, and read the samples like local ones."""
        try:
            self.sut.client.request(routes.SAMPLER_STOP, sid=self.id)
            self.fetch()
            with contextlib.suppress(HarnessError):
                self.sut.client.request(routes.SAMPLER_REMOVE, sid=self.id)
        except HarnessError as exc:
            log.warning("harness: the agent's samples: %s", exc)
        stop_loadgen(self._loadgen)
        not_here(self.out)
        merge(self.out, self.local, self.sut.clock_offset_s)
        try:
            return read_samples(self.out)
        except HarnessError as exc:
            log.warning("harness: sampler output unreadable: %s", exc)
            return None


def start_loadgen(out: Path) -> subprocess.Popen:
    """The generator's CPU on this host (harness.agent.loadgen), beside the agent's
    sampler: the master's process tree, like ``harness sample`` measures it on one host."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "harness.agent.loadgen",
        "--out",
        str(out),
        "--loadgen-pid",
        str(os.getpid()),
    ]
    with open(out / "loadgen.log", "wb") as log_file:
        return subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def stop_loadgen(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def shift_meta(meta: dict[str, Any], offset_s: float) -> dict[str, Any]:
    """sampler.json with its unix times moved from the agent's clock to the master's."""
    out = dict(meta)
    for key in ("started_unix", "stopped_unix"):
        if isinstance(out.get(key), int | float):
            out[key] = out[key] - offset_s
    out["clock_offset_s"] = offset_s
    return out


def not_here(samples: Path) -> None:
    """The load generator does not run on the agent's host: the sampler there counted its
    own parent (the agent) as the generator. Blank that column (``loadgen.merge`` fills it
    from the master's own measurement), so no check reads the agent's CPU as the
    generator's."""
    with contextlib.suppress(FileNotFoundError):
        (samples / "loadgen.csv").unlink()
    path = samples / "system.csv"
    if not path.exists():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "loadgen_cpu_pct" not in rows[0]:
        return
    i = rows[0].index("loadgen_cpu_pct")
    for row in rows[1:]:
        if i < len(row):
            row[i] = ""
    text = io.StringIO()
    csv.writer(text).writerows(rows)
    atomic_write(path, text.getvalue())


class RemoteSut:
    """The server on the agent's host, by its pid there (a ``ChaosTarget``). A server the
    agent started itself (``harness agent --sut-cmd``) is found without a pid and may be
    restarted by kill chaos, on the agent's host; one it attached to by pid may not (kill
    chaos needs ``restart = false`` there)."""

    can_restart = False

    def __init__(self, client: AgentClient, pid: int | None, lease_s: float | None = None) -> None:
        self.client = client
        info, self.clock_offset_s, self.rtt_s = client.measure_clock()
        self.host = str(info.get("host"))
        self.info = info
        owned = info.get("sut") or {}
        if pid is None:
            pid = owned.get("pid")
            if pid is None:
                raise ConfigError(
                    f"--agent {client.url} has no server of its own (harness agent --sut-cmd) "
                    "and no --sut-pid was given: pass the server's pid on the agent's host "
                    "(`pgrep -f SERVER` there) as --sut-pid"
                )
        self.can_restart = bool(owned.get("can_restart")) and owned.get("pid") == int(pid)
        proc = client.request(routes.PROCESS, pid=int(pid))
        self._pid = int(proc["pid"])
        self._cores = tuple(proc.get("cores") or ())
        self.cmd = proc.get("cmd")
        self.url = None
        self.lease_s = float(lease_s or info.get("lease_s") or 10.0)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def agent_doc(self) -> dict[str, Any]:
        """The results' ``sut.agent``: where the server-side work ran and the clocks' offset."""
        return {
            "url": self.client.url,
            "host": self.host,
            "cpu_model": self.info.get("cpu_model"),
            "cores": self.info.get("cores"),
            "allow": self.info.get("allow"),
            "lease_s": self.lease_s,
            "netns": self.info.get("netns"),
            "clock_offset_s": round(self.clock_offset_s, 6),
            "rtt_s": round(self.rtt_s, 6),
        }

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def cores(self) -> tuple[int, ...]:
        return self._cores

    def pids(self) -> list[int]:
        return list(self.client.request(routes.PROCESS, pid=self._pid)["pids"])

    def alive(self) -> bool:
        """Whether the server runs; an agent that does not answer is not a dead server."""
        try:
            doc = self.client.request(routes.ALIVE, pid=self._pid)
            if doc.get("pid_now"):
                # the agent restarted the server it owns (kill chaos): follow the new pid
                self._pid = int(doc["pid_now"])
            return bool(doc["alive"])
        except AgentRefused:
            return False  # 404: the process is gone
        except HarnessError as exc:
            log.warning("harness: agent: %s", exc)
            return True

    @property
    def chaos_actions(self) -> Mapping[str, ActionFactory]:
        """The timeline's action table: every name goes to the agent (which refuses the
        ones outside its allow-list, 403)."""

        def factory(name: str) -> ActionFactory:
            return lambda _target, params: RemoteAction(self, name, params)

        return {name: factory(name) for name in DEFAULT_ACTIONS}

    def check_chaos(self, events: Sequence[Any]) -> None:
        """Every chaos event built by the agent now (403/400 → exit 2 before load)."""
        for i, ev in enumerate(events):
            params = {**dict(ev.params), "duration_s": ev.duration_s}
            try:
                RemoteAction(self, ev.action, params)
            except AgentRefused as exc:
                raise ConfigError(f"chaos[{i}] ({ev.action}): {exc}") from None

    def start_sampler(self, out: Path, metrics_url: str | None) -> RemoteSampler:
        return RemoteSampler(self, out, metrics_url)

    # -- the lease ------------------------------------------------------------------------

    def start_heartbeat(self) -> None:
        """Renew the agent's lease every third of it (a thread; a greenlet under gevent)."""
        if self._beat is not None:
            return
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="agent-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.client.request(routes.HEARTBEAT)
            except HarnessError as exc:
                log.warning("harness: agent heartbeat: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._beat = None


def agent_facts(url: str, token: str | None, pid: int | None) -> dict[str, Any]:
    """What preflight needs from the agent before anything starts: the server's pid and
    cores on the agent's host, and whether the agent may restart it (it started it)."""
    sut = RemoteSut(AgentClient(url, token), pid)
    return {"sut_pid": sut.pid, "remote_cores": sut.cores, "agent_restarts": sut.can_restart}


def connect_sut(
    url: str, token: str | None, pid: int | None, events: Sequence[Any] = ()
) -> RemoteSut:
    """A ``RemoteSut`` for ``--agent URL [--sut-pid PID]``, checked before any load (no pid:
    the server the agent started with ``--sut-cmd``)."""
    sut = RemoteSut(AgentClient(url, token), pid)
    sut.check_chaos(events)
    sut.start_heartbeat()
    log.info(
        "harness: agent %s on %s, clock offset %+.4f s (round trip %.4f s)",
        url,
        sut.host,
        sut.clock_offset_s,
        sut.rtt_s,
    )
    return sut
