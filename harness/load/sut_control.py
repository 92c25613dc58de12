"""The server under test during a run, on the master / local runner: one owner.

Preparation starts (``--sut-cmd``) or attaches to (``--sut-pid``) it, the watchdog
notices when it exits, a threads sweep restarts it with each stage's ``{threads}``, and
the end of the Locust process stops it. Everything that holds or replaces the handle is
here, so the watchdog can tell a sweep's own restart (it holds ``_restarting``) from a
server that died.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.lock

from harness import protocols, sut
from harness.errors import HarnessError
from harness.load import target
from harness.load.options import Options
from harness.load.scenario import Scenario

log = logging.getLogger("harness.load")

SutHandle = sut.SutProcess | sut.AttachedSut | Any  # Any: harness.agent's RemoteSut

WATCH_EVERY_S = 0.5
KILL_GRACE_S = 30.0  # beyond a kill+restart event's own duration, before the SUT counts as dead


class SutControl:
    """Start, attach, watch, restart and stop the server under test."""

    def __init__(self, opts: Options, out_dir: Path) -> None:
        self.opts = opts
        self.out_dir = out_dir
        self.handle: SutHandle | None = None
        self._restarting = gevent.lock.BoundedSemaphore(1)  # held while a sweep restarts it

    def reconfigure(self, opts: Options) -> None:
        """A web UI start with the start form's options: a server started from another
        command (or on other cores) than the form now names is stopped, to be started anew
        by ``ensure``; one attached by another pid is let go."""
        before = self.opts
        self.opts = opts
        restarted = (before.sut_cmd, before.sut_cores) != (opts.sut_cmd, opts.sut_cores)
        moved = (before.sut_pid, before.agent_url) != (opts.sut_pid, opts.agent_url)
        if (restarted and self.owned) or (moved and not self.owned):
            self.stop()  # an attached one is left running (an agent's: its lease let go)
            self.handle = None

    @property
    def owned(self) -> bool:
        """The harness started this server (and may restart and must stop it)."""
        return isinstance(self.handle, sut.SutProcess)

    def pid_file(self) -> Path:
        path = self.out_dir / "samples" / "sut.pid"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def pid(self) -> int | None:
        if self.handle is None:
            return None
        try:
            return int(self.handle.pid)
        except HarnessError:
            return None

    def cores(self) -> list[int] | None:
        return target.cores_of(self.handle)

    def describe(self, base_url: str, model: str, config: dict[str, Any]) -> dict[str, Any]:
        """The results document's ``sut`` object (with ``agent`` when the server is on an
        agent's host: where, and the clocks' offset)."""
        doc = {
            "target": base_url,
            "pid": self.pid(),
            "cmd": getattr(self.handle, "cmd", None),
            "model": model,
            "cores": self.cores(),
            "config": config,
        }
        agent = getattr(self.handle, "agent_doc", None)
        if agent is not None:
            doc["agent"] = agent
        return doc

    # -- preparation ---------------------------------------------------------------

    def ensure(
        self, scenario: Scenario, host: str | None, base_url: Callable[[], str]
    ) -> float | None:
        """Start the ``--sut-cmd`` server (again, when the scenario wants a fresh one or it
        died) or attach to ``--sut-pid``; seconds to ready when it was started here."""
        o = self.opts
        if o.agent_url:
            if self.handle is None:
                # the server on the agent's host: every check before load (exit 2)
                from harness.agent.client import connect_sut

                self.handle = connect_sut(o.agent_url, o.agent_token, o.sut_pid, scenario.chaos)
            return None
        if o.sut_cmd:
            h = self.handle
            if h is not None and not scenario.load.fresh_sut and h.alive():
                return None
            if h is not None:
                self.stop()
            cores = sut.split_cores(o.sut_cores).sut
            # linearity: the first stage's thread count (expanded for these cores)
            stages = scenario.with_cores(len(cores)).stages
            threads = next((st.threads for st in stages if st.threads), 1)
            new = sut.SutProcess(
                o.sut_cmd,
                port=target.port_of(host),
                cores=cores,
                threads=threads,
                log_path=self.out_dir / "sut.log",
                pid_file=self.pid_file(),
                ready_path=protocols.get(o.protocol).ready_path,
            )
            self.handle = new  # before it can fail: the end of the process stops it
            new.start()
            return new.wait_ready(timeout=o.ready_timeout_s)
        if o.sut_pid is not None and self.handle is None:
            # its pid file: a supervisor's restart after kill chaos is followed by the sampler
            ready_path = protocols.get(o.protocol).ready_path
            self.handle = sut.attach(o.sut_pid, base_url(), self.pid_file(), ready_path)
        return None

    def restart_fresh(self) -> float | None:
        """Start the harness's own server again (same command, port, cores); seconds to
        ready. None when the server is not the harness's to restart."""
        if not isinstance(self.handle, sut.SutProcess):
            return None
        return self.handle.restart(ready_timeout=self.opts.ready_timeout_s)

    # -- during the run -------------------------------------------------------------

    def watch(
        self,
        scenario: Scenario,
        scenario_time: Callable[[], float],
        active: Callable[[], bool],
        on_exit: Callable[[dict[str, Any]], None],
    ) -> None:
        """Greenlet: call ``on_exit`` (the results' ``sut_exit``) once the server is gone."""
        restarts = any(e.action in ("kill", "terminate") for e in scenario.chaos)
        while active():
            gevent.sleep(WATCH_EVERY_S)
            h = self.handle
            if h is None or h.alive() or self._restarting.locked():
                continue
            if restarts:
                # a kill+restart chaos event is allowed to take the server away for a while
                grace = KILL_GRACE_S + max(e.duration_s for e in scenario.chaos)
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and not h.alive() and active():
                    gevent.sleep(WATCH_EVERY_S)
                if h.alive() or not active():
                    continue
            code = h.returncode if isinstance(h, sut.SutProcess) else None
            on_exit(
                {
                    "t_s": round(scenario_time(), 3),
                    "exit_code": code,
                    "cause": f"the server under test exited (code {code}) during the run",
                    "log_tail": h.tail() if isinstance(h, sut.SutProcess) else None,
                }
            )
            return

    def drive_threads(
        self,
        scenario: Scenario,
        scenario_time: Callable[[], float],
        active: Callable[[], bool],
        on_error: Callable[[HarnessError], None],
    ) -> None:
        """Greenlet: restart the server with each stage's ``{threads}`` as the stage begins."""
        h = self.handle
        assert isinstance(h, sut.SutProcess), "a threads sweep needs --sut-cmd (preflight)"
        for st in scenario.stages:
            if not st.threads or st.threads == h.threads:
                continue
            delay = st.start_s - scenario_time()
            if delay > 0:
                gevent.sleep(delay)
            if not active():
                return
            new = sut.SutProcess(
                self.opts.sut_cmd or "",
                port=h.port,
                cores=h.cores,
                threads=st.threads,
                log_path=self.out_dir / "sut.log",
                pid_file=self.pid_file(),
                ready_path=h.ready_path,
            )
            with self._restarting:
                try:
                    h.stop()
                    new.start()
                    new.wait_ready(timeout=self.opts.ready_timeout_s)
                except HarnessError as exc:
                    on_error(exc)
                    return
                finally:
                    self.handle = h = new
            log.info("harness: stage %s — server restarted with %d threads", st.name, st.threads)

    # -- the end ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the server if the harness started it (an attached one is left running);
        one on an agent's host: stop renewing the agent's lease."""
        if isinstance(self.handle, sut.SutProcess):
            self.handle.stop()
        close = getattr(self.handle, "close", None)
        if close is not None:
            close()
