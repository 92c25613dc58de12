"""One scenario as one ``locust -f locustfiles/inference.py --headless`` subprocess.

The harness has no private load engine ("one code path"): everything that measures
happens inside the Locust run. This module is the part ``harness acceptance`` / ``run``
and ``harness peak`` / ``tune`` share: where the load goes (``Target``), what every run
of a session gets (``RunSettings``), the command line, the subprocess pinned to the
generator's cores, its live progress from ``OUT/progress.json``, a clean stop on
SIGINT/SIGTERM (``StopFlag`` under ``harness.primitives.trapped_signals``) and the
scenario's results document read back (``ScenarioRun``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import protocols, sut
from harness.errors import ConfigError, ResultFormatError
from harness.finish import PARENT_RENDERS_ENV
from harness.load.options import GOLDEN_CACHE_ENV
from harness.packaged import locustfile
from harness.results import load_document

# The session's golden file (OUT/golden.json), given to every scenario's Locust run through
# the environment variable of its --golden-cache option.
GOLDEN_FILE = "golden.json"

# How long Locust gets to write its partial results after SIGTERM before SIGKILL.
STOP_GRACE_S = 30.0


def locustfile_path() -> Path:
    return locustfile("inference")


def default_sut_cmd(model: str | None = None, protocol: str | None = None) -> str:
    """The bundled reference server, on the port and with the threads the harness picks;
    for ``protocol`` "openai" its LLM server (one engine: no threads to pick)."""
    if protocol == "openai":
        return f"{shlex.quote(sys.executable)} -m harness_reference_server --api openai --port {{port}}"
    cmd = f"{shlex.quote(sys.executable)} -m harness_reference_server --port {{port}} --workers {{threads}}"
    if model:
        cmd += f" --model {shlex.quote(model)}"
    return cmd


def core_split(sut_cores: str | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(server's cores, generator's cores) for a server the harness starts on this host,
    when they can be apart (``harness.sut.split_cores``); else None (nothing pinned). The
    generator — the Locust process, its workers, the sampler — then runs where the server
    does not, so it neither takes CPU from the server it measures nor waits behind the
    server's threads to send on time. A server given every core shares them."""
    split = sut.split_cores(sut_cores)
    return None if split.shared else (split.sut, split.loadgen)


def attached_core_split(sut_pid: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(server's cores, generator's cores) beside a server the harness attaches to on this
    host (``--target --sut-pid``): the generator runs on the cores the server's affinity
    leaves free, as beside a server it starts. None when there are none (a server that
    may run on every core shares them with the generator: nothing pinned, and where each
    lands is the scheduler's choice, run by run) or the pid is not on this host."""
    split = sut.attached_split(sut_pid)
    return None if split is None or split.shared else (split.sut, split.loadgen)


def check_target_url(url: str) -> None:
    """``--target``: an http:// or https:// URL (ConfigError naming the fix)."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--target has value {url!r}; expected an http:// or https:// URL such "
            "as http://127.0.0.1:8000"
        )


@dataclass(frozen=True)
class Target:
    """Where the load goes. Exactly one of ``sut_cmd`` / ``url`` is set."""

    sut_cmd: str | None = None
    url: str | None = None
    sut_pid: int | None = None
    model: str | None = None
    # the wire protocol's name (harness.protocols; None: the default, KServe V2)
    protocol: str | None = None
    # deployment options (harness.load.options): headers as "Name: value", validated
    headers: tuple[str, ...] = ()
    ca_cert: str | None = None
    insecure: bool = False
    metrics_url: str | None = None
    # the server on another host: sampler and chaos through `harness agent`
    agent_url: str | None = None
    agent_token: str | None = field(default=None, repr=False)  # a secret: environment only
    agent_ca_cert: str | None = None  # an https agent's CA (environment: HARNESS_AGENT_CA_CERT)

    def __post_init__(self) -> None:
        if (self.sut_cmd is None) == (self.url is None):
            raise ConfigError(
                "give either --sut-cmd (the harness starts the server) or --target URL "
                "(attach to a running one), not both"
            )
        if self.url is not None:
            check_target_url(self.url)
        if self.sut_cmd is not None:
            sut.check_command(self.sut_cmd)
        if self.protocol is not None:
            protocols.get(self.protocol)  # unknown: a ConfigError naming the valid ones

    def locust_args(self) -> list[str]:
        args: list[str] = []
        if self.sut_cmd is not None:
            args += ["--sut-cmd", self.sut_cmd]
        else:
            assert self.url is not None
            args += ["--host", self.url]
            if self.sut_pid is not None:
                args += ["--sut-pid", str(self.sut_pid)]
        if self.model:
            args += ["--model", self.model]
        if self.protocol:
            args += ["--protocol", self.protocol]
        if self.ca_cert:
            args += ["--ca-cert", str(Path(self.ca_cert).resolve())]
        if self.insecure:
            args.append("--insecure")
        if self.metrics_url:
            args += ["--metrics-url", self.metrics_url]
        if self.agent_url:
            args += ["--agent", self.agent_url]
        return args

    def locust_env(self) -> dict[str, str]:
        """The headers travel in the environment, not on the command line (``ps`` shows
        a command line to every user of the machine; a bearer token must not be there)."""
        env = {"HARNESS_HEADER": json.dumps(list(self.headers))} if self.headers else {}
        if self.agent_token:
            env["HARNESS_AGENT_TOKEN"] = self.agent_token
        if self.agent_ca_cert:
            env["HARNESS_AGENT_CA_CERT"] = self.agent_ca_cert
        return env

    def client(self) -> Any:
        """The load client's settings for this target (headers, TLS), for preflight."""
        from harness.load import http

        url = self.url or "http://127.0.0.1"
        return http.Client.for_target(url, self.headers, self.ca_cert, self.insecure)

    def describe(self) -> dict[str, Any]:
        return {
            "cmd": self.sut_cmd,
            "target": self.url,
            "pid": self.sut_pid,
            "model": self.model,
            "headers": [h.partition(":")[0].strip() for h in self.headers],  # names only
            **({"agent": self.agent_url} if self.agent_url else {}),
        }


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What every Locust run of a session gets besides its scenario and directory."""

    target: Target
    mode: str = "quick"
    checklist: Path | None = None
    duration_s: float | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # check ids and scenario names the user accepts unjudged or not run (--allow-skip)
    allow_skip: tuple[str, ...] = ()
    # the load generator's cores (the Locust process, its workers, the sampler), apart
    # from a server the harness starts on this host (core_split); None = not pinned
    loadgen_cores: tuple[int, ...] | None = None


@dataclass
class ScenarioRun:
    name: str
    out_dir: Path
    returncode: int | None = None
    document: dict[str, Any] | None = None
    error: str | None = None
    interrupted: bool = False
    started_unix: float | None = None
    elapsed_s: float = 0.0
    # the earlier attempts of this scenario, set aside as invalid (disturbance_reasons)
    attempts: list[dict[str, Any]] = field(default_factory=list)


class StopFlag:
    """Set by SIGINT/SIGTERM while trapped (``with trapped_signals(flag):``): the running
    scenario is then stopped cleanly and writes what it measured."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int) -> None:
        self.requested = True


def scenario_argv(settings: RunSettings, name: str, out_dir: Path) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile_path()),
        "--headless",
        "--scenario",
        name,
        "--mode",
        settings.mode,
        "--out",
        str(out_dir),
        "--loglevel",
        "WARNING",
        "--only-summary",
    ]
    argv += settings.target.locust_args()
    if settings.duration_s is not None:
        argv += ["--duration", str(settings.duration_s)]
    if settings.checklist is not None:
        argv += ["--checklist", str(settings.checklist)]
    if settings.allow_skip:
        argv += ["--allow-skip", ",".join(settings.allow_skip)]
    argv += list(settings.extra_args)
    return argv


def _read_progress(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / "progress.json").read_text())
    except (OSError, ValueError):
        return None


def progress_line(
    name: str, index: int, total: int, p: Mapping[str, Any] | None, elapsed: float
) -> str:
    head = f"[{index}/{total}] {name:<15}"
    if not p:
        return f"{head} {elapsed:5.0f}s  starting…"
    parts = [f"{p.get('elapsed_s', elapsed):5.0f}/{p.get('total_s', 0):.0f}s"]
    if p.get("stage"):
        parts.append(f"{p['stage']:<10}")
    if p.get("rps") is not None:
        parts.append(f"{p['rps']:7.1f} req/s")
    if p.get("p99_ms") is not None:
        parts.append(f"p99 {p['p99_ms']:7.1f} ms")
    parts.append(f"errors {p.get('errors', 0)}")
    if p.get("aborted"):
        parts.append(f"aborted {p['aborted']}")
    if p.get("dropped"):
        parts.append(f"dropped {p['dropped']}")
    return f"{head} " + "  ".join(parts)


def run_one(
    settings: RunSettings,
    out_root: Path,
    name: str,
    index: int,
    total: int,
    stop: StopFlag,
    show: Callable[[str], None],
    poll_s: float = 1.0,
) -> ScenarioRun:
    """Run scenario ``name`` into ``out_root/<its stem>``; its results read back, or why
    there are none (``ScenarioRun.error``). ``stop`` set: SIGTERM to Locust, which writes
    its partial results (SIGKILL after STOP_GRACE_S)."""
    out_dir = out_root / Path(name).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    run = ScenarioRun(name=name, out_dir=out_dir)
    log_path = out_dir / "locust.log"
    env = {**os.environ, **settings.env, **settings.target.locust_env(), PARENT_RENDERS_ENV: "1"}
    # one golden file per session: a scenario whose server answers as the last one's did
    # reuses its golden outputs (harness.load.preparation); --golden-cache FILE overrides
    env.setdefault(GOLDEN_CACHE_ENV, str(out_root / GOLDEN_FILE))
    loadgen = settings.loadgen_cores

    def pin() -> None:  # in the child between fork and exec: every thread inherits it
        os.sched_setaffinity(0, loadgen or ())

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            scenario_argv(settings, name, out_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our Ctrl-C reaches it only as the SIGTERM we send
            env=env,
            preexec_fn=pin if loadgen is not None else None,
        )
        started = time.monotonic()
        run.started_unix = time.time()
        sent_term_at: float | None = None
        try:
            while True:
                try:
                    proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if stop.requested and sent_term_at is None:
                    run.interrupted = True
                    proc.send_signal(signal.SIGTERM)  # Locust quits and writes partial results
                    sent_term_at = time.monotonic()
                if sent_term_at is not None and time.monotonic() - sent_term_at > STOP_GRACE_S:
                    proc.kill()
                show(
                    progress_line(
                        name, index, total, _read_progress(out_dir), time.monotonic() - started
                    )
                )
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    run.returncode = proc.returncode
    run.elapsed_s = time.monotonic() - started
    results = out_dir / "results.json"
    try:
        run.document = load_document(results)
    except ResultFormatError as e:
        run.error = last_error_line(log_path) or str(e)
    return run


def last_error_line(log_path: Path) -> str | None:
    """The plugin prints its one-line error last; find it in Locust's log."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("harness: error:") or "Error:" in text:
            return text.removeprefix("harness: error:").strip()
    return lines[-1].strip() if lines else None


class ImportWhenWritten:
    """Import ``modules`` on a daemon thread, at the lowest CPU priority, once a scenario's
    complete results are on disk (``results.json`` whose envelope says ``"partial":
    false``: its load is over, Locust is judging and stopping the server; the partial
    results written every 30 s during a long load do not count). What the caller's
    wrap-up imports (the checks, matplotlib: ~0.8 s) then loads beside Locust's own
    wrap-up, never during the load; a document written otherwise only means no head start.
    ``cancel()`` ends the wait when the run ended without them and returns once this
    thread is done: an import it already started finishes first, so the caller's own
    imports never run beside it (two threads importing one package's modules at once can
    leave one with a partially initialised module: ``ImportError: cannot import name``)."""

    POLL_S = 0.05
    COMPLETE = b'"partial": false'

    def __init__(self, results: Path, modules: Sequence[str]) -> None:
        self.results = results
        self.modules = tuple(modules)
        self.imported = threading.Event()
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="import-when-written", daemon=True)
        self._thread.start()

    def _complete(self, seen: list[float]) -> bool:
        try:
            mtime = self.results.stat().st_mtime
            if seen and seen[0] == mtime:
                return False
            seen[:] = [mtime]
            with open(self.results, "rb") as f:
                return self.COMPLETE in f.read(512)
        except OSError:
            return False

    def _run(self) -> None:
        seen: list[float] = []
        while not self._complete(seen):
            if self._cancelled.wait(self.POLL_S):
                return
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only
        for name in self.modules:
            try:
                importlib.import_module(name)
            except ImportError:  # raised again where the caller imports it and handles it
                return
        self.imported.set()

    def cancel(self) -> None:
        self._cancelled.set()
        self._thread.join()
