"""Network faults: a loopback TCP fault proxy between the load and the server, and the
``network`` chaos action that switches its toxics on and off.

A scenario with a ``network`` chaos event gets its load sent through the proxy
(``harness.load.preparation``); the golden fetch, the calibration, the server's statistics
and the metrics scrapes still go straight to the server, so they measure the server, not
the network. The proxy is its own process (``harness/chaos/netproxy.py``, asyncio, the
standard library only): it never steals the Locust process's gevent loop, and it exits on
EOF of its control pipe, which the kernel delivers whenever the harness exits — SIGKILL
included. ``FaultProxy.stop`` closes it on every ordinary exit path.

The toxics are Toxiproxy's (latency ± jitter, bandwidth, slicer, reset_peer,
timeout/blackhole), per stream (``upstream`` client → server, ``downstream`` server →
client), each connection affected with probability ``toxicity``. The action's detail
records what the proxy really did (chunks delayed, connections reset or held, seconds
added): ``harness.analysis.chaos_evidence`` makes a run whose toxic touched nothing
invalid, never a pass.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from harness.chaos import netproxy
from harness.chaos.base import Action, ChaosTarget
from harness.errors import ConfigError, HarnessError

# kind → {param: (default, minimum, what is valid)}
TOXIC_PARAMS: dict[str, dict[str, tuple[float, float, str]]] = {
    "latency": {
        "latency_ms": (100.0, 0.0, "milliseconds ≥ 0"),
        "jitter_ms": (0.0, 0.0, "milliseconds ≥ 0"),
    },
    "bandwidth": {"rate_kbps": (100.0, 0.001, "KiB/s > 0")},
    "slicer": {
        "average_size": (64.0, 1.0, "bytes ≥ 1"),
        "size_variation": (0.0, 0.0, "bytes ≥ 0"),
        "delay_us": (10_000.0, 0.0, "microseconds ≥ 0"),
    },
    "reset_peer": {"timeout_ms": (0.0, 0.0, "milliseconds ≥ 0")},
    "timeout": {"timeout_ms": (0.0, 0.0, "milliseconds ≥ 0 (0: hold until removed)")},
}
STREAMS = netproxy.STREAMS
# every key a [[chaos]] action = "network" table may hold (besides at_s, duration_s)
NETWORK_PARAMS = (
    "toxic",
    "stream",
    "toxicity",
    "per",
    *{k: 0 for p in TOXIC_PARAMS.values() for k in p},
)
START_TIMEOUT_S = 10.0

_current: FaultProxy | None = None
_current_lock = threading.Lock()


def current() -> FaultProxy | None:
    """The proxy this process's run sends its load through (None: no network scenario)."""
    return _current


def stop_current() -> None:
    """Stop the current proxy (end of a run); nothing when there is none."""
    global _current
    with _current_lock:
        proxy, _current = _current, None
    if proxy is not None:
        proxy.stop()


class FaultProxy:
    """The proxy process and its control pipe. ``url`` is where the load goes."""

    def __init__(self, upstream_host: str, upstream_port: int, listen_port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listen_port = listen_port
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        if self.port is None:
            raise HarnessError("the fault proxy is not running")
        return f"http://127.0.0.1:{self.port}"

    def start(self, register: bool = True) -> FaultProxy:
        """Start the process and wait for its port; with ``register``, it becomes
        ``current()`` (a previous current proxy is stopped)."""
        global _current
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-S",  # the proxy needs only the standard library: start fast, stay small
                netproxy.__file__,
                self.upstream[0],
                str(self.upstream[1]),
                str(self.listen_port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            # a Ctrl-C to the harness's group is for the harness, which stops the proxy
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        hello = self._read_line(START_TIMEOUT_S)
        if not hello or not hello.get("ready"):
            self.stop()
            raise HarnessError(
                f"the fault proxy to {self.upstream[0]}:{self.upstream[1]} did not start "
                f"(said {hello!r}); run python {netproxy.__file__} HOST PORT to see why"
            )
        self.port = int(hello["port"])
        if register:
            with _current_lock:
                previous, _current = _current, self
            if previous is not None and previous is not self:
                previous.stop()
        return self

    def _read_line(self, timeout_s: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.daemon = True
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            return None
        try:
            return json.loads(box[0])
        except ValueError:
            return None

    def command(self, op: str, **fields: Any) -> dict[str, Any]:
        """One command, its reply; ``HarnessError`` when the proxy is gone or refuses."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None or proc.stdin is None:
                raise HarnessError(
                    f"the fault proxy (pid {self.pid}) is not running "
                    f"(exit code {proc.returncode if proc else None})"
                )
            try:
                proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline() if proc.stdout is not None else ""
            except (OSError, ValueError) as exc:
                raise HarnessError(f"the fault proxy's control pipe failed: {exc}") from None
        try:
            reply = json.loads(line) if line else None
        except ValueError:
            reply = None
        if not reply or not reply.get("ok"):
            raise HarnessError(f"the fault proxy refused {op}: {reply!r}")
        return reply

    def stop(self) -> None:
        """Close the control pipe (the proxy exits on EOF), then make sure it is gone."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5.0)
        with contextlib.suppress(OSError, ValueError):
            if proc.stdout is not None:
                proc.stdout.close()


_ids = itertools.count(1)


def toxic_spec(params: dict[str, Any]) -> dict[str, Any]:
    """The validated toxic of a ``network`` event's params (ConfigError naming the key)."""
    kind = params.get("toxic")
    if kind not in TOXIC_PARAMS:
        raise ConfigError(f"network.toxic has value {kind!r}. Valid: {', '.join(TOXIC_PARAMS)}")
    stream = params.get("stream") or "downstream"
    if stream not in STREAMS:
        raise ConfigError(f"network.stream has value {stream!r}. Valid: {', '.join(STREAMS)}")
    tox = params.get("toxicity")
    tox = 1.0 if tox is None else tox
    if isinstance(tox, bool) or not isinstance(tox, int | float) or not 0 < tox <= 1:
        raise ConfigError(f"network.toxicity has value {tox!r}. Valid: a probability in (0, 1]")
    per = params.get("per") or "connection"
    if per not in ("connection", "chunk"):
        raise ConfigError(f"network.per has value {per!r}. Valid: connection, chunk")
    spec: dict[str, Any] = {"kind": kind, "stream": stream, "toxicity": float(tox), "per": per}
    for key, (default, lo, what) in TOXIC_PARAMS[kind].items():
        v = params.get(key)
        v = default if v is None else v
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
            raise ConfigError(f"network.{key} has value {v!r}. Valid: {what}")
        spec[key] = float(v)
    given = {k for k, v in params.items() if v is not None}
    unknown = given - {"toxic", "stream", "toxicity", "per", "duration_s", *TOXIC_PARAMS[kind]}
    if unknown:
        raise ConfigError(
            f"network: {', '.join(sorted(unknown))} is not a parameter of the {kind} toxic. "
            f"Valid: {', '.join(TOXIC_PARAMS[kind])}, stream, toxicity, per"
        )
    return spec


class NetworkFault(Action):
    """Switch one toxic on in the run's fault proxy for ``duration_s``, then off.

    The detail is the proxy's own count of what the toxic did (``counters``) plus the
    proxy's pid and port; a run without a proxy fails at apply (recorded, run invalid).
    """

    name = "network"

    def __init__(
        self, params: dict[str, Any], duration_s: float, proxy: FaultProxy | None = None
    ) -> None:
        super().__init__(duration_s)
        if not duration_s or duration_s <= 0:
            raise ConfigError(f"network.duration_s has value {duration_s!r}. Valid: seconds > 0")
        self.spec = toxic_spec(params)
        self._proxy = proxy
        self.toxic_id = f"t{next(_ids)}"

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> NetworkFault:
        return cls(params, float(params.get("duration_s", 0.0)))

    @property
    def params(self) -> dict[str, Any]:
        p = {"toxic": self.spec["kind"], **{k: v for k, v in self.spec.items() if k != "kind"}}
        return {**p, "duration_s": self.duration_s}

    def proxy(self) -> FaultProxy:
        proxy = self._proxy or current()
        if proxy is None:
            raise HarnessError(
                "no fault proxy is running: the load of this run does not go through one "
                "(a network event needs a scenario run by the harness, which starts it)"
            )
        return proxy

    def _apply(self) -> None:
        proxy = self.proxy()
        self.detail.update(proxy_pid=proxy.pid, proxy_port=proxy.port)
        reply = proxy.command("add", id=self.toxic_id, **self.spec)
        self.detail["open_at_start"] = reply.get("open")

    def _revert(self) -> None:
        reply = self.proxy().command("remove", id=self.toxic_id)
        self.detail["counters"] = reply.get("counters")
        self.detail["open_at_end"] = reply.get("open")
