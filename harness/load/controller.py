"""One Locust process's side of a harness run: the lifecycle, and who does each part.

``HarnessState`` (``environment.harness``) holds the run's ``Lifecycle`` and hands each
job to its owner:

- ``preparation.Preparation``: preflight, SUT start, metadata, golden outputs, calibration;
- ``distribution``: plans out to the load processes, their reports and finals back
  (``LoadProcess`` is this process's engine on a worker or the local runner);
- ``side_tasks.SideTasks`` and ``sut_control.SutControl``: sampler, chaos, SUT watchdog,
  threads sweep, partial writes and the progress file while the run goes;
- ``finalisation``: collect, stop, merge and write ``--out/results.json``.

Roles (decided by the Locust runner): the master / local runner prepares, distributes,
watches and writes; a worker / the local runner generates load from its plan. Workers
ship deltas with Locust's ``report_to_master`` (every 3 s) and a final one once their
requests are done; the master adds histograms, never averages percentiles.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import gevent.subprocess
from locust.runners import MasterRunner, WorkerRunner

from harness import results
from harness.errors import ExitCode, HarnessError
from harness.load import finalisation, integrity
from harness.load.distribution import LOCAL, Finals, LoadProcess, send_plans
from harness.load.lifecycle import COLLECTING, ON_DISK, STOPPABLE, Lifecycle, RunState
from harness.load.options import Options, options_from, scenario_for
from harness.load.preparation import Preparation
from harness.load.recording import Recording
from harness.load.scenario import Scenario, Stage
from harness.load.side_tasks import SideTasks
from harness.load.sut_control import SutControl
from harness.load.users import Engine, Plan
from harness.load.wire import REPORT_KEY, ErrorInfo, FinalMessage, ReportMessage, WireFormatError
from harness.primitives import atomic_write

if TYPE_CHECKING:
    from locust.env import Environment

log = logging.getLogger("harness.load")

REPORT_EVERY_S = 3.0  # local runner: how often the engine's recording is merged
WRITE_EVERY_S = 30.0  # partial results.json while a run is going (a killed soak keeps them)
# t = 0 this far after preparation: time for the plans and Locust's spawn messages to land
# and every load process's scheduler to start (docs/performance.md, "A run's fixed cost")
PLAN_LEAD_S = 0.3
PROGRESS_EVERY_S = 1.0  # --out/progress.json, read by `harness acceptance` for its live line
PROGRESS_SPAN_S = 5.0  # the live req/s and p99 cover the last this many seconds
JUDGE_TIMEOUT_S = 300.0  # `harness judge` of a web UI run (checks, reports)

S = RunState


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole, never half: a reader sees the old text or the new."""
    atomic_write(path, text)


class HarnessState:
    """Everything the plugin keeps for one Locust process (``environment.harness``)."""

    def __init__(self, environment: Environment, options: Options) -> None:
        self.env = environment
        self.opts = options
        self.scenario: Scenario = scenario_for(options)
        self.lifecycle = Lifecycle.master()
        # Started from the web UI, every start is a run of its own: options from the start
        # form, results in --out/run-N/, judged when it ends (not when Locust quits).
        self.web = getattr(environment, "web_ui", None) is not None and not self.is_worker
        self.run_dir = Path(options.out)
        self.runs: list[dict[str, Any]] = []  # web UI: every run so far, with its verdict
        self.judging: gevent.Greenlet | None = None
        # the partial results.json being written on the threadpool (None: none yet); the
        # final write waits for it, so a partial one never lands after it
        self.partial_write: Any = None
        self.sut = SutControl(options, Path(options.out))  # outlives a run (web UI restarts)
        self.load = LoadProcess(environment, options, self.scenario, self.is_worker)
        self._written = gevent.event.Event()  # set once a run's final results are on disk
        self._new_run()

    def _new_run(self) -> None:
        """What one run (one start of the test) accumulates, empty."""
        self.prep: Preparation | None = None
        self.tasks = SideTasks()
        self.finals = Finals()
        self.slots = 1
        self.origin_unix: float | None = None
        self.aggregate = Recording(self.scenario.load.window_s, self.scenario.load.first_requests)
        self.error: dict[str, Any] | None = None  # the results' error: {"type", "message"}
        self.exit_code: ExitCode | None = None
        self.sut_exit: dict[str, Any] | None = None
        self.ended_unix: float | None = None
        self.partial = False
        self.cpu_by_source: dict[str, float] = {}  # load processes' CPU seconds since the plan
        self.judged_doc: dict[str, Any] | None = None  # web UI: this run's document, judged
        self._written.clear()

    @property
    def is_worker(self) -> bool:
        return isinstance(self.env.runner, WorkerRunner)

    @property
    def is_master(self) -> bool:
        return isinstance(self.env.runner, MasterRunner)

    @property
    def out_dir(self) -> Path:
        """This run's directory: --out, or --out/run-N/ for a run started from the web UI."""
        return self.run_dir

    @property
    def engine(self) -> Engine | None:
        return self.load.engine

    def scenario_time(self) -> float:
        if self.origin_unix is None:
            return 0.0
        return time.time() - self.origin_unix

    def wait_engine(self, timeout: float = 60.0) -> Engine:
        return self.load.wait_engine(timeout)

    # -- master / local: preparation and the shape ------------------------------------

    def prepare(self) -> bool:
        """From the shape's tick: prepare a run not yet prepared; whether it can go on."""
        if self.lifecycle.state not in (S.IDLE, S.WRITTEN, S.JUDGED):
            return self.lifecycle.state in (S.READY, S.RUNNING)
        self.lifecycle.advance(S.PREPARING)
        if self.web:
            self.run_dir = next_run_dir(Path(self.opts.out))
        self._new_run()
        self.prep = prep = Preparation(self.opts, self.scenario, self.env.host, self.sut)
        try:
            if self.web:
                prep = self._web_run_options()
            prep.run()
            self.scenario = prep.scenario
            if self.lifecycle.state is not S.PREPARING:
                return False  # stopped while preparing (SIGTERM): nothing to start
            # Python's platform.platform() runs `uname -p` (a fork of this process) the
            # first time: here, not in the first partial write on the loop mid-load
            results.machine_metadata()
            self.origin_unix = time.time() + PLAN_LEAD_S
            self._distribute(prep)
            self._start_side_tasks(prep)
        except HarnessError as exc:
            log.error("harness: %s", exc)
            self.scenario = prep.scenario  # as far as it got (the server's cores applied)
            self._record_error(ErrorInfo.from_exception(exc))
            self.lifecycle.advance_if(S.FAILED)
            return False
        return self.lifecycle.advance_if(S.READY)

    def _web_run_options(self) -> Preparation:
        """A web UI start: the options as the start form left them (checked again here;
        the form's submit was refused already if they were wrong) and a new run dir."""
        self.opts = options_from(self.env.parsed_options, form=True)
        self.scenario = scenario_for(self.opts)
        self.run_dir = next_run_dir(Path(self.opts.out))
        self._new_run()
        self.load.opts, self.load.scenario = self.opts, self.scenario
        self.sut.reconfigure(self.opts)
        if self.opts.sut_cmd and not self.env.host:
            from harness import sut

            self.env.host = f"http://127.0.0.1:{sut.free_port()}"
        self.prep = Preparation(self.opts, self.scenario, self.env.host, self.sut)
        return self.prep

    def shape_tick(self) -> Stage | None:
        """The stage the shape runs now; None once the stages ran out or the run stopped."""
        t = self.scenario_time()
        if self.lifecycle.state not in (S.READY, S.RUNNING):
            return None
        if t >= self.scenario.duration_s:
            self.lifecycle.advance(S.COMPLETED)
            return None
        if self.lifecycle.state is S.READY:
            self.lifecycle.advance(S.RUNNING)
        return self.scenario.stage_at(max(t, 0.0))

    def _distribute(self, prep: Preparation) -> None:
        assert prep.base_url is not None and prep.model is not None
        plan = Plan(
            origin_unix=self.origin_unix or time.time(),
            slot=0,
            slots=1,
            base_url=prep.load_url or prep.base_url,  # the fault proxy's, for network chaos
            model=prep.model,
            capacity_rps=prep.capacity_rps,
            inputs=prep.inputs,
            golden=(
                integrity.golden_to_wire(prep.golden) if prep.golden is not None else prep.oracle
            ),
            protocol=self.opts.protocol,
        )
        runner = self.env.runner
        if isinstance(runner, MasterRunner):
            ids = send_plans(runner, plan, self.opts, prep.sut_cores_n)
            self.slots = len(ids)
            self.finals.expect(ids)
            self.aggregate.expect(ids)
        else:
            self.slots = 1
            self.aggregate.expect([LOCAL])
            self.load.scenario = self.scenario
            self.load.build(plan)
            self.tasks.spawn(self._local_reports)

    def _start_side_tasks(self, prep: Preparation) -> None:
        base = prep.base_url or ""
        if self.opts.sample:
            self.tasks.start_sampler(
                self.sut, self.out_dir / "samples", self.opts.metrics_url or base + "/metrics"
            )
        self.tasks.start_chaos(self.scenario, self.sut, self.origin_unix or time.time())
        if self.sut.handle is not None:
            self.tasks.spawn(
                self.sut.watch, self.scenario, self.scenario_time, self._collecting, self._sut_died
            )
        if any(st.threads for st in self.scenario.stages):
            self.tasks.spawn(
                self.sut.drive_threads,
                self.scenario,
                self.scenario_time,
                self._collecting,
                self._sweep_failed,
            )
        if isinstance(self.env.runner, MasterRunner):
            # workers outside the sampler's process tree (other hosts, started by hand)
            from harness.load.workers_cpu import WorkerCpu

            self.tasks.workers_cpu = WorkerCpu(self.env.runner)
            self.tasks.spawn(self.tasks.workers_cpu.run, gevent.sleep)
        self.tasks.spawn(self._write_periodically)
        self.tasks.spawn(self._write_progress)
        from harness.load import server_stats  # the server's statistics at stage edges

        server_stats.start(self.tasks, prep, self.scenario, self.scenario_time, self._collecting)

    # -- master / local: while the run goes ---------------------------------------------

    def _collecting(self) -> bool:
        return self.lifecycle.state in COLLECTING

    def _record_error(self, info: ErrorInfo) -> None:
        self.error = info.as_result()
        self.exit_code = info.code

    def _abort(self) -> None:
        """Stop the test early (its cause is recorded); nothing to do once it is stopping."""
        if self.lifecycle.advance_if(S.ABORTED):
            gevent.spawn(self.env.runner.stop)

    def _sut_died(self, sut_exit: dict[str, Any]) -> None:
        self.sut_exit = sut_exit
        log.error("harness: %s at t=%.1f s; stopping the test", sut_exit["cause"], sut_exit["t_s"])
        self.exit_code = ExitCode.FAIL
        self._abort()

    def _sweep_failed(self, exc: HarnessError) -> None:
        log.error("harness: %s", exc)
        self._record_error(ErrorInfo.from_exception(exc))
        self._abort()

    def merge(
        self,
        source: str,
        recording: Mapping[str, Any],
        cpu_s: float | None,
        conns: Mapping[str, Any] | None = None,
        final: bool = False,
    ) -> None:
        """Add a load process's recording delta (while the run's recordings are open) and
        its own connection counts (``final``: its last)."""
        if self.lifecycle.state in COLLECTING:
            self.aggregate.merge(recording, source)
            self.cpu_by_source[source] = float(cpu_s or 0.0)
            self.tasks.own_conns.add(source, conns, final=final)

    def _local_reports(self) -> None:
        while self._collecting():
            gevent.sleep(REPORT_EVERY_S)
            report = self.load.report(encoded=False) if self._collecting() else None
            if report is not None:
                self.merge(LOCAL, report.recording, report.cpu_s, report.conns)

    def _write_periodically(self) -> None:
        # The document is built on the loop (from the live recording); its serialising
        # and fsync'd write, tens of ms of CPU and a disk wait of any length, on a native
        # thread: on the loop, every send due meanwhile left late.
        pool = gevent.get_hub().threadpool

        def off_loop(write: Any) -> None:
            self.partial_write = pool.spawn(write)
            self.partial_write.get()

        while self._collecting():
            gevent.sleep(WRITE_EVERY_S)
            if self._collecting():
                with contextlib.suppress(Exception):
                    finalisation.write_results(self, partial=True, samples=None, off_loop=off_loop)

    def progress(self) -> dict[str, Any]:
        """A live line's worth: elapsed/total, the current stage, recent req/s, p99, errors."""
        t = self.scenario_time()
        stage = self.scenario.stage_at(min(max(t, 0.0), self.scenario.duration_s - 1e-9))
        rows = self.aggregate.rows[-40:]
        last_t = max((r["t"] for r in rows), default=None)
        recent = [r for r in rows if last_t is not None and r["t"] > last_t - PROGRESS_SPAN_S]
        span = len({r["t"] for r in recent}) * self.aggregate.window_s if recent else None
        counts = self.aggregate.totals().counts
        return {
            "scenario": self.scenario.name,
            "elapsed_s": round(t, 1),
            "total_s": round(self.scenario.duration_s, 1),
            "stage": stage.name if stage else None,
            "rps": round(sum(r["ok"] for r in recent) / span, 1) if span else None,
            "p99_ms": max((r["p99_ms"] or 0.0 for r in recent), default=None),
            "ok": int(counts.get("ok", 0)),
            "errors": int(
                sum(
                    v
                    for k, v in counts.items()
                    if k not in ("ok", "scheduled", "dropped", "aborted")
                )
            ),
            "dropped": int(counts.get("dropped", 0)),
            "aborted": int(counts.get("aborted", 0)),
        }

    def _write_progress(self) -> None:
        path = self.out_dir / "progress.json"
        # The file is written on a native thread: on ext4 the rename that replaces it
        # can wait on the disk, measured 0.4-0.7 s on this VM's disk, and on the gevent
        # loop that wait held every send (dispatch lag p99 past its limit, the run invalid).
        offload = gevent.get_hub().threadpool.apply
        while self._collecting():
            gevent.sleep(PROGRESS_EVERY_S)
            with contextlib.suppress(OSError, ValueError):
                offload(replace_text, (path, json.dumps(self.progress())))

    # -- messages (the plugin's listeners call these) -------------------------------------

    def on_plan(self, data: Any) -> None:
        """Worker: ``harness_plan`` arrived."""
        self.load.on_plan_message(data)
        self.opts, self.scenario = self.load.opts, self.load.scenario

    def send_final(self) -> None:
        """Worker: at test_stop or on ``harness_finish``, the final report (once)."""
        self.load.send_final()

    def drain_for_master(self) -> dict[str, Any] | None:
        """Worker: the ``report_to_master`` payload, None when there is nothing to report."""
        report = self.load.report()
        return report.to_wire() if report is not None else None

    def on_worker_report(self, client_id: str, data: Mapping[str, Any]) -> None:
        """Master: Locust's periodic worker report, with our delta under ``REPORT_KEY``."""
        if data.get(REPORT_KEY) is None:
            return
        try:
            report = ReportMessage.from_wire(data[REPORT_KEY])
        except WireFormatError as exc:
            self._worker_failed(ErrorInfo.from_exception(exc))
            return
        self.merge(client_id, report.recording, report.cpu_s, report.conns)

    def on_final(self, client_id: str, data: Any) -> None:
        """Master: a worker's ``harness_final`` — its last delta, or its error's code."""
        try:
            final = FinalMessage.from_wire(data)
        except WireFormatError as exc:
            final = FinalMessage(error=ErrorInfo.from_exception(exc))
        if final.error is not None:
            self._worker_failed(final.error)
        elif final.recording is not None:
            self.merge(client_id, final.recording, final.cpu_s, final.conns, final=True)
        self.finals.got(client_id)

    def _worker_failed(self, info: ErrorInfo) -> None:
        """The first error a worker reports stops the run with that error's exit code."""
        if self.error is not None:
            return
        log.error("harness: %s", info.message)
        self._record_error(info)
        self._abort()

    # -- the end ---------------------------------------------------------------------------

    def finalize(self) -> None:
        """At test_stop on the master/local runner: merge, stop side tasks, write results."""
        if not self.lifecycle.advance_if(S.DRAINING):
            return  # not started, or already finalising / finalised
        finalisation.finish_run(self)
        self._written.set()
        if self.web:
            self.judging = gevent.spawn(self._judge_web_run)

    def _judge_web_run(self) -> None:
        """A web UI run's end: ``harness judge`` on its directory, in a child process (the
        reports' plots would hold this process's gevent loop, i.e. the UI, for seconds)."""
        run: dict[str, Any] = {
            "name": self.run_dir.name,
            "dir": str(self.run_dir),
            "scenario": self.scenario.name,
            "verdict": None,
            "exit_code": None,
            "line": "judging…",
        }
        self.runs.append(run)
        cmd = [sys.executable, "-m", "harness", "judge", str(self.run_dir)]
        if self.opts.checklist:
            cmd += ["--checklist", self.opts.checklist]
        try:
            proc = gevent.subprocess.run(
                cmd, capture_output=True, text=True, timeout=JUDGE_TIMEOUT_S, check=False
            )
            code, said = proc.returncode, (proc.stdout.strip() or proc.stderr.strip())
        except (OSError, gevent.subprocess.TimeoutExpired) as exc:
            code, said = int(ExitCode.INVALID), f"harness judge failed: {exc}"
        doc = None
        with contextlib.suppress(HarnessError, OSError, ValueError):
            doc = results.load_document(self.run_dir / "results.json")
        # the run judged and its record updated together, before anything that may yield
        # (logging): the tab must never show the record judged and the run still written
        self.judged_doc = doc
        self.judged()
        run.update(
            verdict=(doc or {}).get("verdict"),
            exit_code=code,
            line=said.splitlines()[-1] if said else f"harness judge exited {code}",
        )
        log.warning("harness: %s: %s — %s", run["name"], run["line"], self.run_dir / "report.html")

    def wait_written(self, timeout: float) -> bool:
        """Wait for a finalisation under way elsewhere (another greenlet) to write."""
        return self._written.wait(timeout)

    @property
    def stoppable(self) -> bool:
        """The test is prepared (or preparing) and has not been finalised."""
        return self.lifecycle.state in STOPPABLE

    @property
    def on_disk(self) -> bool:
        """The run's final results.json is written."""
        return self.lifecycle.state in ON_DISK

    @property
    def finalising(self) -> bool:
        """``finalize`` is under way (collecting the finals, writing)."""
        return self.lifecycle.state in (S.DRAINING, S.WRITING)

    def judged(self) -> None:
        """``harness.finish`` judged the written results."""
        if self.lifecycle.state is S.WRITTEN:
            self.lifecycle.advance(S.JUDGED)

    def wait_judged(self, timeout: float) -> dict[str, Any] | None:
        """Web UI: wait for the last run's judging; that run's record (None: no run)."""
        if self.judging is not None:
            self.judging.join(timeout)
        return self.runs[-1] if self.runs else None

    def shutdown(self) -> None:
        """At quit: stop what this process started (the SUT last)."""
        self.tasks.shutdown(self.out_dir / "samples")
        self.load.close()
        self.sut.stop()


def next_run_dir(base: Path) -> Path:
    """``base/run-N`` with N one past the highest already there: a run started from the
    web UI never overwrites an earlier one, even across Locust restarts."""
    taken = [0]
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            m = re.fullmatch(r"run-(\d+)", p.name)
            if m and p.is_dir():
                taken.append(int(m.group(1)))
    return base / f"run-{max(taken) + 1}"
