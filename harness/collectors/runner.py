"""One sampling session: process + system samplers on one tick schedule, the metrics
scraper on its own thread, files streamed to ``out_dir`` and ``sampler.json`` at both ends.

This is what ``harness sample`` runs (standalone, or as a subprocess of the Locust plugin).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.collectors.live import format_live
from harness.collectors.loop import TickLoop
from harness.collectors.metrics import DEFAULT_EXCLUDE, DEFAULT_MATCH, MetricsScraper, ScrapeConfig
from harness.collectors.process import HZ, ProcessSampler
from harness.collectors.run_processes import loadgen_pids, run_pids
from harness.collectors.system import SystemSampler
from harness.errors import ConfigError, TargetUnavailable
from harness.primitives import atomic_write

SAMPLER_SCHEMA = "harness.sampler/1"


@dataclass(frozen=True)
class SamplerConfig:
    pid: int | None
    out_dir: str
    interval_s: float = 1.0
    duration_s: float | None = None
    include_children: bool = True
    uss_every_s: float = 10.0
    # seconds between reads of the threads' context-switch counts (their status files,
    # the sampler's dearest read); the switch columns are empty between (0: every tick;
    # a --live table reads them every tick)
    switches_every_s: float = 5.0
    metrics_url: str | None = None
    metrics_interval_s: float | None = None  # default: interval_s
    metrics_match: str = DEFAULT_MATCH
    metrics_exclude: str | None = DEFAULT_EXCLUDE
    loadgen_pids: tuple[int, ...] | None = None  # None: the sampler's parent process tree
    stop_when_target_exits: bool = True
    # A file holding the SUT's current pid (``SutProcess(pid_file=...)`` rewrites it on every
    # start): when the watched process is gone, follow the pid in the file (kill+restart).
    pid_file: str | None = None
    # stop when the process that started the sampler is gone (SIGKILLed included): the
    # harness starts it so; a sampler started by hand from a shell keeps going
    stop_with_parent: bool = False

    def validate(self) -> SamplerConfig:
        if not self.interval_s > 0:
            raise ConfigError(f"--interval has value {self.interval_s}. Valid: seconds > 0")
        if not self.switches_every_s >= 0:
            raise ConfigError(
                f"switches_every_s has value {self.switches_every_s}. Valid: seconds >= 0"
            )
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"--duration has value {self.duration_s}. Valid: seconds > 0")
        if self.pid is None and self.pid_file is None:
            raise ConfigError("--pid is missing. Valid: --pid PID and/or --pid-file FILE")
        if self.pid is not None and self.pid <= 0:
            raise ConfigError(f"--pid has value {self.pid}. Valid: a running process id")
        return self


def read_pid_file(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class SamplingSession:
    """Run the samplers until ``stop`` is set, the duration ends, or the target exits."""

    def __init__(
        self,
        config: SamplerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        stop: threading.Event | None = None,
        live: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config.validate()
        pid = config.pid
        if pid is None and config.pid_file is not None:
            pid = read_pid_file(config.pid_file)
            if pid is None:
                raise TargetUnavailable(
                    f"--pid-file {config.pid_file!r} holds no pid. Start the server first"
                )
        if not os.path.exists(f"/proc/{pid}/stat"):
            raise TargetUnavailable(
                f"--pid has value {pid}: no such process. Give the pid of the running server"
            )
        self.retargets: list[dict] = []
        self._scraping = [os.getpid()] if config.metrics_url else []
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.clock, self.wall = clock, wall
        self.stop = stop or threading.Event()
        self.live = live
        self.target_exited = False
        self.parent = os.getppid()
        self.parent_exited = False
        # a tick that raised: counted, its traceback in sampler.log (the first few), the
        # last one in sampler.json — the sampler keeps ticking, and the missing rows are
        # judged as gaps in the evidence, with this as their cause
        self.tick_errors = 0
        self.last_error: str | None = None
        self.process = ProcessSampler(
            pid,
            self.out,
            include_children=config.include_children,
            uss_every_s=config.uss_every_s,
            switches_every_s=0.0 if live is not None else config.switches_every_s,
            # the harness's own connections to the server: the load generator's and this
            # sampler's (its metrics scrapes; without a metrics URL it has none, and its
            # fd table — one fd per /proc file it keeps open — is not listed)
            peer_pids=lambda: [*self.system.loadgen_now(), *self._scraping],
        )
        lg = loadgen_pids(config.loadgen_pids, exclude=lambda: [self.process.pid])
        everything = run_pids(config.loadgen_pids, sut=lambda: [self.process.pid])
        self.system = SystemSampler(
            self.out, loadgen_pids=lg, run_pids=everything, sut_pid=lambda: self.process.pid
        )
        self.scraper = None
        if config.metrics_url:
            self.scraper = MetricsScraper(
                ScrapeConfig(
                    url=config.metrics_url,
                    interval_s=config.metrics_interval_s or config.interval_s,
                    match=config.metrics_match,
                    exclude=config.metrics_exclude,
                ),
                self.out,
                clock=clock,
                wall=wall,
            )
        self.loop = TickLoop(config.interval_s, clock=clock, wall=wall, stop=self.stop)
        try:
            self.sut_cores = sorted(os.sched_getaffinity(pid))
        except OSError:
            self.sut_cores = None

    def _on_tick(self, t: float, late: float) -> None:
        try:
            self._tick(t, late)
        except Exception as e:  # recorded, and judged as missing evidence
            self.tick_errors += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.last_error = (
                f"t={t:.1f}s {type(e).__name__}: {e} "
                f"({Path(where.filename).name}:{where.lineno} in {where.name})"
            )
            if self.tick_errors <= 3:
                print(f"sampler tick at t={t:.1f}s raised:", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                sys.stderr.flush()

    def _tick(self, t: float, late: float) -> None:
        if self.config.stop_with_parent and os.getppid() != self.parent:
            # reparented: the harness that started us is gone and nobody will stop us
            self.parent_exited = True
            self.stop.set()
            return
        ts = self.wall()
        tick = self.process.sample(t, ts, late)
        self.system.sample(t, ts, late)
        if self.live is not None and tick is not None:
            self.live(format_live(tick, self.process.last_threads))
        if self.process.gone:
            self._target_gone(t)

    def _target_gone(self, t: float) -> None:
        if self.config.pid_file is not None:
            new = read_pid_file(self.config.pid_file)
            if new is not None and new != self.process.pid and os.path.exists(f"/proc/{new}"):
                self.retargets.append({"t": round(t, 4), "old_pid": self.process.pid, "pid": new})
                self.process.retarget(new)
            return  # keep ticking: a restarted server writes its new pid there
        if self.config.stop_when_target_exits:
            self.target_exited = True
            self.stop.set()

    def run(self) -> dict:
        t0 = self.loop.start()
        self.process.baseline(self.clock() - t0)
        self.system.baseline(self.clock() - t0)
        self._write_meta(running=True)
        if self.scraper is not None:
            self.scraper.start(t0, self.stop)
        try:
            self.loop.run(self._on_tick, self.config.duration_s)
        finally:
            self.stop.set()
            if self.scraper is not None:
                self.scraper.join(self.config.interval_s + 5.0)
                self.scraper.close()
            self.process.close()
            self.system.close()
            meta = self._write_meta(running=False)
        return meta

    def _write_meta(self, running: bool) -> dict:
        s = self.loop.stats
        stopped = s.stopped_unix if not running else None
        meta = {
            "schema": SAMPLER_SCHEMA,
            "running": running,
            "pid": self.retargets[0]["old_pid"] if self.retargets else self.process.pid,
            "pid_now": self.process.pid,
            "retargets": self.retargets,
            "interval_s": self.config.interval_s,
            "config": asdict(self.config),
            "hz": HZ,
            "has_schedstat": self.process.has_schedstat,
            # threads.csv / process.csv switch columns are filled this often (0: every tick)
            "switches_every_s": self.process.switches_every_s,
            "cores": {"sut": self.sut_cores, "system": self.system.cores},
            "started_unix": s.started_unix,
            "stopped_unix": stopped,
            "duration_s": (s.stopped_mono - s.started_mono)
            if (not running and s.stopped_mono is not None)
            else None,
            "ticks": s.ticks,
            "missed_ticks": s.missed,
            "max_late_s": round(s.max_late_s, 6),
            "target_exited": self.target_exited,
            "parent_exited": self.parent_exited,
            "tick_errors": self.tick_errors,
            "last_error": self.last_error,
            "metrics": None
            if self.scraper is None
            else {
                "url": self.scraper.config.url,
                "scrapes": self.scraper.scrapes,
                "errors": self.scraper.errors,
                "last_error": self.scraper.last_error,
            },
            "summary": None if running else _summary(self.process),
        }
        atomic_write(self.out / "sampler.json", json.dumps(meta, indent=2))
        return meta


def _summary(process: ProcessSampler) -> dict | None:
    """A few figures from the ticks still in memory (the CSVs hold everything)."""
    ticks = list(process.recent)
    if not ticks:
        return None
    return {
        "ticks_in_memory": len(ticks),
        "rss_bytes_last": ticks[-1].rss_bytes,
        "rss_bytes_max": max(t.rss_bytes for t in ticks),
        "threads_last": ticks[-1].threads,
        "threads_max": max(t.threads for t in ticks),
        "fds_last": ticks[-1].fds,
        "fds_max": max(t.fds for t in ticks),
        "cpu_pct_mean": round(sum(t.cpu_pct for t in ticks) / len(ticks), 2),
        "late_s_max": max(t.late_s for t in ticks),
    }
