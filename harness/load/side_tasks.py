"""What runs beside the load on the master / local runner, started once the run is
prepared and stopped when it ends: the sampler subprocess, the chaos timeline, and the
harness's own greenlets (SUT watchdog, threads sweep, partial results, progress file).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent

from harness.chaos import proxy
from harness.load import target
from harness.load.own_conns import OwnConns
from harness.load.scenario import Scenario
from harness.load.sut_control import SutControl

if TYPE_CHECKING:
    from harness.chaos.timeline import Timeline

NO_SUT = "no SUT process to act on: pass --sut-pid or --sut-cmd"


class SideTasks:
    """The sampler, the chaos timeline and the greenlets of one run."""

    def __init__(self) -> None:
        self.sampler: subprocess.Popen | None = None
        self.remote_sampler: Any = None  # harness.agent's RemoteSampler (server on its host)
        self.timeline: Timeline | None = None
        self.chaos_skipped: list[dict[str, Any]] = []
        self.greenlets: list[gevent.Greenlet] = []
        # on a master: the workers' own CPU from their heartbeats (harness.load.workers_cpu)
        self.workers_cpu: Any = None
        # every load process's own connections to the server (harness.load.own_conns)
        self.own_conns = OwnConns()

    def start_sampler(self, sut: SutControl, samples_dir: Path, metrics_url: str) -> None:
        """``harness sample`` on the server; it follows the pid file SutProcess rewrites on
        every start, so a server restarted by kill chaos or a threads sweep stays sampled."""
        pid = sut.pid()
        if pid is None:
            return
        remote = getattr(sut.handle, "start_sampler", None)
        if remote is not None:  # on the agent's host: its files copied here as they grow
            self.remote_sampler = remote(samples_dir, metrics_url)
            # its file writes on a native thread, off the loop that dispatches the load
            offload = gevent.get_hub().threadpool.apply
            self.spawn(self.remote_sampler.follow, gevent.sleep, offload)
            return
        pid_file = getattr(sut.handle, "pid_file", None)
        self.sampler = target.start_sampler(pid, samples_dir, metrics_url, pid_file=pid_file)

    def start_chaos(self, scenario: Scenario, sut: SutControl, origin_unix: float) -> None:
        """The scenario's chaos timeline on the scenario's clock (or every event recorded as
        not applied when there is no server process to act on)."""
        if not scenario.chaos:
            return
        if sut.handle is None:
            self.chaos_skipped = [
                {
                    "action": e.action,
                    "params": dict(e.params),
                    "start_s": e.at_s,
                    "end_s": None,
                    "ok": False,
                    "error": NO_SUT,
                }
                for e in scenario.chaos
            ]
            return
        from harness.chaos.timeline import DEFAULT_ACTIONS, Timeline

        t0 = time.monotonic() + (origin_unix - time.time())
        # on an agent's host: proxies applied and reverted there (same records)
        actions = getattr(sut.handle, "chaos_actions", DEFAULT_ACTIONS)
        self.timeline = Timeline(scenario.chaos, sut.handle, handle_signals=False, actions=actions)
        self.timeline.start(t0=t0)

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        self.greenlets.append(gevent.spawn(fn, *args))

    def chaos_records(self) -> list[dict[str, Any]]:
        applied = list(self.timeline.records) if self.timeline is not None else []
        return applied + self.chaos_skipped

    def stop(self, samples_dir: Path) -> dict[str, Any] | None:
        """Kill the greenlets, stop chaos (reverting what it did) and the sampler; return
        what the sampler recorded."""
        for g in self.greenlets:
            g.kill(block=False)
        if self.timeline is not None:
            self.timeline.stop()
        # the load went through the fault proxy (a process of this tree, which the sampler
        # matches): the server's connections are the proxy's, not the load processes'
        via_proxy = proxy.current() is not None
        proxy.stop_current()  # after the timeline: its network events read the proxy at revert
        remote, self.remote_sampler = self.remote_sampler, None
        if remote is not None:
            samples = remote.finish()
        else:
            proc, self.sampler = self.sampler, None
            samples = target.stop_sampler(proc, samples_dir)
        if self.workers_cpu is not None:
            self.workers_cpu.add_to(samples)
        # after the workers' entries: a worker the sampler measured is one it matched
        if not via_proxy:
            self.own_conns.add_to(samples, sampler_local=remote is None)
        return samples

    def shutdown(self, samples_dir: Path) -> None:
        """At quit: the same, never raising (the Locust process is ending)."""
        for g in self.greenlets:
            g.kill(block=False)
        if self.timeline is not None:
            with contextlib.suppress(Exception):
                self.timeline.stop()
        with contextlib.suppress(Exception):
            proxy.stop_current()
        remote, self.remote_sampler = self.remote_sampler, None
        if remote is not None:
            with contextlib.suppress(Exception):
                remote.finish()
        proc, self.sampler = self.sampler, None
        target.stop_sampler(proc, samples_dir)
