"""One Locust process's side of a harness run: prepare, generate, merge, write.

Roles (decided by the Locust runner):
- master / local: prepares the run (starts the SUT if asked, reads the model metadata,
  fetches golden outputs, calibrates capacity), sends each load process its ``Plan``,
  runs the sampler subprocess, the chaos timeline and a SUT watchdog, merges the
  processes' recordings and writes ``--out/results.json``;
- worker / local: runs an ``Engine`` from the plan and ships its recording.

Workers ship deltas with Locust's ``report_to_master`` (every 3 s) and a final one with
the ``harness_final`` message once their requests are done; the master adds histograms,
never averages percentiles.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gevent
import gevent.event
from locust.runners import MasterRunner, WorkerRunner

from harness import results, sut
from harness.errors import ConfigError, HarnessError, TargetUnavailable
from harness.load import calibrate, http, integrity, payloads, target
from harness.load.options import Options, scenario_for
from harness.load.recording import Recording
from harness.load.result import scenario_result
from harness.load.scenario import Scenario, Stage
from harness.load.users import Engine, Plan

log = logging.getLogger("harness.load")

REPORT_EVERY_S = 3.0  # local runner: how often the engine's recording is merged
WRITE_EVERY_S = 30.0  # partial results.json while a run is going (a killed soak keeps them)
PLAN_LEAD_S = 1.0
PROGRESS_EVERY_S = 1.0  # --out/progress.json, read by `harness acceptance` for its live line
PROGRESS_SPAN_S = 5.0  # the live req/s and p99 cover the last this many seconds  # t = 0 this far after preparation: time for plans and spawns to land


class HarnessState:
    """Everything the plugin keeps for one Locust process (``environment.harness``)."""

    def __init__(self, environment: Any, options: Options) -> None:
        self.env = environment
        self.opts = options
        self.scenario: Scenario = self._load_scenario()
        self.engine: Engine | None = None
        self.engine_ready = gevent.event.Event()
        self._final_sent = False
        self._reset_run()
        self.sut_handle: Any = None

    # -- setup ---------------------------------------------------------------------

    def _load_scenario(self) -> Scenario:
        return scenario_for(self.opts)

    def _reset_run(self) -> None:
        self.prepared = False
        self.shape_done = False
        self.finalized = False
        self.slots = 1
        self.plan_clients: list[str] = []
        self.finals: set[str] = set()
        self.finals_event = gevent.event.Event()
        self.origin_unix: float | None = None
        self.capacity_rps: float | None = None
        self.calibration: dict[str, Any] | None = None
        self.time_to_ready_s: float | None = None
        self.golden_summary: dict[str, Any] | None = None
        self.aggregate = Recording(self.scenario.load.window_s, self.scenario.load.first_requests)
        self.error: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self.sut_exit: dict[str, Any] | None = None
        self.timeline: Any = None
        self.chaos_skipped: list[dict[str, Any]] = []
        self.sampler: subprocess.Popen | None = None
        self.greenlets: list[gevent.Greenlet] = []
        self.sut_doc: dict[str, Any] = {}
        self.ended_unix: float | None = None
        self.partial = False
        self.written = False  # the final results.json of this run is on disk
        self._restarting = False
        self.fresh_sut = False
        self.sut_cores_n = 1
        self.cpu_by_source: dict[str, float] = {}  # load processes' CPU seconds since the plan
        self._cpu_at_plan = 0.0

    @property
    def is_worker(self) -> bool:
        return isinstance(self.env.runner, WorkerRunner)

    @property
    def is_master(self) -> bool:
        return isinstance(self.env.runner, MasterRunner)

    @property
    def out_dir(self) -> Path:
        return Path(self.opts.out)

    def scenario_time(self) -> float:
        if self.origin_unix is None:
            return 0.0
        return time.time() - self.origin_unix

    def stage_for_shape(self, t: float) -> Stage | None:
        if t >= self.scenario.duration_s or self.sut_exit is not None or self.error is not None:
            return None
        return self.scenario.stage_at(max(t, 0.0))

    def wait_engine(self, timeout: float = 60.0) -> Engine:
        if not self.engine_ready.wait(timeout) or self.engine is None:
            raise TargetUnavailable(
                f"no load plan from the master within {timeout:g} s; is the master running "
                f"the same locustfile and scenario?"
            )
        return self.engine

    # -- master / local: preparation -----------------------------------------------

    def prepare(self) -> bool:
        """Run once per test from the shape's first tick; False if the run cannot go on."""
        if self.prepared:
            return self.error is None
        self._reset_run()
        self.prepared = True
        try:
            self._prepare()
            return True
        except HarnessError as exc:
            self._record_error(exc)
            return False

    def _record_error(self, exc: HarnessError) -> None:
        log.error("harness: %s", exc)
        self.error = {"type": type(exc).__name__, "message": str(exc)}
        self.exit_code = exc.exit_code

    def _base_url(self) -> str:
        host = self.env.host
        if not host:
            raise ConfigError(
                "no target: pass --host http://HOST:PORT (or --sut-cmd to start the server)"
            )
        return host.rstrip("/")

    def _preflight(self) -> None:
        """Refuse (exit 2) a scenario this target cannot support, before starting anything."""
        from harness.load.preflight import (
            TargetFacts,
            checklist_max_n,
            linearity_max_n,
            unsupported_reason,
        )

        o = self.opts
        checklist = checklist_max_n(o.checklist)
        facts = TargetFacts(
            sut_cmd=o.sut_cmd,
            attached=not o.sut_cmd,
            sut_pid=o.sut_pid,
            sut_cores=o.sut_cores,
            linearity_max_n=linearity_max_n(self.scenario, checklist),
        )
        why = unsupported_reason(self.scenario, facts)
        if why is not None:
            raise ConfigError(
                f"scenario {self.scenario.name!r} cannot run against this target: {why}"
            )

    def _start_sut(self) -> None:
        o = self.opts
        if o.sut_cmd:
            if (
                self.sut_handle is None
                or self.scenario.load.fresh_sut
                or not self.sut_handle.alive()
            ):
                if self.sut_handle is not None:
                    self.sut_handle.stop()
                port = target.port_of(self.env.host)
                cores = sut.parse_cores(o.sut_cores) if o.sut_cores else sut.choose_cores().sut
                # linearity: the first stage's thread count (expanded for these cores)
                stages = self.scenario.with_cores(len(cores)).stages
                threads = next((st.threads for st in stages if st.threads), 1)
                self.sut_handle = sut.SutProcess(
                    o.sut_cmd,
                    port=port,
                    cores=cores,
                    threads=threads,
                    log_path=self.out_dir / "sut.log",
                    pid_file=self._pid_file(),
                )
                self.sut_handle.start()
                self.time_to_ready_s = self.sut_handle.wait_ready(timeout=o.ready_timeout_s)
        elif o.sut_pid is not None and self.sut_handle is None:
            self.sut_handle = sut.attach(o.sut_pid, self._base_url())

    def _prepare(self) -> None:
        o = self.opts
        load = self.scenario.load
        self._preflight()
        self._start_sut()
        self.sut_cores_n = len(target.cores_of(self.sut_handle) or os.sched_getaffinity(0))
        self.scenario = self.scenario.with_cores(self.sut_cores_n)
        if any(st.threads for st in self.scenario.stages):
            template = o.sut_cmd or ""
            if "{threads}" not in template:
                raise ConfigError(
                    f"scenario {self.scenario.name!r} varies the server's threads per stage; "
                    f"start the server with --sut-cmd containing {{threads}} (e.g. "
                    f"--sut-cmd 'python -m reference_server --port {{port}} --workers {{threads}}'), "
                    f"got --sut-cmd {o.sut_cmd!r}"
                )
        base = self._base_url()
        status, _ = target.get(base + "/v2/health/ready")
        if status != 200:
            raise TargetUnavailable(
                f"{base}/v2/health/ready answered {status or 'nothing'}; start the server "
                f"or point --host at it"
            )
        server_meta = target.json_or_none(base + "/v2")
        model = o.model or (server_meta or {}).get("model")
        if not model:
            raise ConfigError(
                f"--model is not set and GET {base}/v2 names no model; pass --model NAME"
            )
        meta = payloads.model_metadata(base, model)
        specs, first = payloads.resolve_specs(meta, model, o.inputs, o.sample_request)
        max_batch = int((meta.get("parameters") or {}).get("max_batch_size") or 32)
        pool_size = load.pool_size or max(64, 4 * max_batch)
        inputs = payloads.generate_inputs(specs, pool_size, load.seed, first)
        host, port, prefix = http.split_url(base)
        classes = [
            payloads.ClassParams(c.name, c.priority, c.timeout_us) for c in self.scenario.classes
        ]
        pool = payloads.PayloadPool(
            host, port, f"{prefix}/v2/models/{model}/infer", inputs, classes
        )
        golden = None
        if load.verify:
            golden = target.fetch_golden(pool, host, port, load.request_timeout_s)
            self.golden_summary = golden.summary()
        self.capacity_rps = load.capacity_rps
        if self.scenario.needs_capacity and self.capacity_rps is None:
            users = load.calibration_users or max(8, 2 * max_batch)
            cal = calibrate.calibrate(
                pool,
                host,
                port,
                classes[-1].name,
                users=users,
                duration_s=load.calibration_s,
                timeout_s=load.request_timeout_s,
            )
            self.calibration = cal.as_dict()
            self.capacity_rps = cal.capacity_rps
            log.info("harness: calibrated capacity %.1f req/s (%d users)", cal.capacity_rps, users)
        self.fresh_sut = False
        if load.fresh_sut and isinstance(self.sut_handle, sut.SutProcess):
            # The golden fetch and the calibration warmed the server up: start it again so
            # the load meets a cold server, and time that start (same command, port, cores).
            self.time_to_ready_s = self.sut_handle.restart(ready_timeout=o.ready_timeout_s)
            self.fresh_sut = True
        elif load.fresh_sut:
            log.warning(
                "harness: scenario %r wants a freshly started server; without --sut-cmd the "
                "server is already warm (fresh_sut: false in the results)",
                self.scenario.name,
            )
        self.sut_doc = {
            "target": base,
            "pid": self._sut_pid(),
            "cmd": getattr(self.sut_handle, "cmd", None),
            "model": model,
            "cores": target.cores_of(self.sut_handle),
            "config": {"server": server_meta, "model": meta},
        }
        self.origin_unix = time.time() + PLAN_LEAD_S
        wire = {
            "origin_unix": self.origin_unix,
            "base_url": base,
            "model": model,
            "capacity_rps": self.capacity_rps,
            "inputs": inputs,
            "golden": integrity.golden_to_wire(golden) if golden is not None else None,
            "options": self._options_for_workers(),
            "sut_cores_n": self.sut_cores_n,
        }
        self._distribute(wire)
        self._start_side_tasks(base)

    def _options_for_workers(self) -> dict[str, Any]:
        opts = asdict(self.opts)
        path = Path(self.opts.scenario)
        if path.is_file():  # workers on this machine may run from another directory
            opts["scenario"] = str(path.resolve())
        return opts

    def _pid_file(self) -> Path:
        path = self.out_dir / "samples" / "sut.pid"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _sut_pid(self) -> int | None:
        h = self.sut_handle
        if h is None:
            return None
        try:
            return int(h.pid)
        except HarnessError:
            return None

    def _distribute(self, wire: dict[str, Any]) -> None:
        runner = self.env.runner
        if self.is_master:
            clients = runner.clients.ready + runner.clients.running + runner.clients.spawning
            ids = sorted((c.id for c in clients), key=runner.get_worker_index)
            if not ids:
                raise TargetUnavailable(
                    "no workers connected; start workers or use --expect-workers"
                )
            self.slots = len(ids)
            self.plan_clients = ids
            self.aggregate.expect(ids)
            for slot, cid in enumerate(ids):
                runner.send_message(
                    "harness_plan", {**wire, "slot": slot, "slots": len(ids)}, client_id=cid
                )
        else:
            self.slots = 1
            self.aggregate.expect(["local"])
            self.on_plan({**wire, "slot": 0, "slots": 1})
            self.greenlets.append(gevent.spawn(self._local_reports))

    def _start_side_tasks(self, base: str) -> None:
        pid = self._sut_pid()
        if pid is not None and self.opts.sample:
            # A server the harness started may be restarted (kill chaos, thread sweeps):
            # the sampler follows the pid file SutProcess rewrites on every start.
            pid_file = getattr(self.sut_handle, "pid_file", None)
            self.sampler = target.start_sampler(
                pid, self.out_dir / "samples", base + "/metrics", pid_file=pid_file
            )
        if self.scenario.chaos:
            if self.sut_handle is None:
                self.chaos_skipped = [
                    {
                        "action": e.action,
                        "params": dict(e.params),
                        "start_s": e.at_s,
                        "end_s": None,
                        "ok": False,
                        "error": "no SUT process to act on: pass --sut-pid or --sut-cmd",
                    }
                    for e in self.scenario.chaos
                ]
            else:
                from harness.chaos.timeline import Timeline

                t0 = time.monotonic() + (self.origin_unix - time.time())
                self.timeline = Timeline(self.scenario.chaos, self.sut_handle, handle_signals=False)
                self.timeline.start(t0=t0)
        if self.sut_handle is not None:
            self.greenlets.append(gevent.spawn(self._watch_sut))
        if any(st.threads for st in self.scenario.stages):
            self.greenlets.append(gevent.spawn(self._drive_threads))
        self.greenlets.append(gevent.spawn(self._write_periodically))
        self.greenlets.append(gevent.spawn(self._write_progress))

    # -- master / local: during the run --------------------------------------------

    def _local_reports(self) -> None:
        while not self.finalized:
            gevent.sleep(REPORT_EVERY_S)
            if self.engine is not None and not self.finalized:
                self.aggregate.merge(self.engine.recording.drain(self.engine.now()), "local")

    def _watch_sut(self) -> None:
        restarts = any(e.action == "kill" for e in self.scenario.chaos)
        while not self.finalized:
            gevent.sleep(0.5)
            h = self.sut_handle
            if h is None or h.alive() or self._restarting:
                continue
            if restarts:
                # a kill+restart chaos event is allowed to take the server away for a while
                deadline = time.monotonic() + 30.0 + max(e.duration_s for e in self.scenario.chaos)
                while time.monotonic() < deadline and not h.alive() and not self.finalized:
                    gevent.sleep(0.5)
                if h.alive() or self.finalized:
                    continue
            code = getattr(getattr(h, "_popen", None), "returncode", None)
            self.sut_exit = {
                "t_s": round(self.scenario_time(), 3),
                "exit_code": code,
                "cause": f"the server under test exited (code {code}) during the run",
                "log_tail": h.tail() if hasattr(h, "tail") else None,
            }
            log.error(
                "harness: %s at t=%.1f s; stopping the test",
                self.sut_exit["cause"],
                self.sut_exit["t_s"],
            )
            self.exit_code = 1
            gevent.spawn(self.env.runner.stop)
            return

    def _drive_threads(self) -> None:
        """Restart the SUT with each stage's ``{threads}`` as the stage begins."""
        h = self.sut_handle
        for st in self.scenario.stages:
            if not st.threads or st.threads == h.threads:
                continue
            delay = st.start_s - self.scenario_time()
            if delay > 0:
                gevent.sleep(delay)
            if self.finalized:
                return
            new = sut.SutProcess(
                self.opts.sut_cmd,
                port=h.port,
                cores=h.cores,
                threads=st.threads,
                log_path=self.out_dir / "sut.log",
                pid_file=self._pid_file(),
            )
            self._restarting = True
            try:
                h.stop()
                new.start()
                new.wait_ready(timeout=self.opts.ready_timeout_s)
            except HarnessError as exc:
                self._record_error(exc)
                gevent.spawn(self.env.runner.stop)
                return
            finally:
                self.sut_handle = h = new
                self._restarting = False
            log.info("harness: stage %s — server restarted with %d threads", st.name, st.threads)

    def _write_periodically(self) -> None:
        while not self.finalized:
            gevent.sleep(WRITE_EVERY_S)
            if not self.finalized:
                with contextlib.suppress(Exception):
                    self._write(partial=True, samples=None)

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
                sum(v for k, v in counts.items() if k not in ("ok", "scheduled", "dropped"))
            ),
            "dropped": int(counts.get("dropped", 0)),
        }

    def _write_progress(self) -> None:
        path = self.out_dir / "progress.json"
        while not self.finalized:
            gevent.sleep(PROGRESS_EVERY_S)
            with contextlib.suppress(OSError, ValueError):
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(json.dumps(self.progress()))
                os.replace(tmp, path)

    # -- worker / local: the engine --------------------------------------------------

    def on_plan(self, wire: dict[str, Any]) -> None:
        try:
            self._build_engine(wire)
        except HarnessError as exc:
            if not self.is_worker:
                raise
            # e.g. the scenario path does not exist on this worker's machine: tell the
            # master (its results carry the error) instead of idling until a timeout
            log.error("harness: %s", exc)
            self._final_sent = True
            error = {"type": type(exc).__name__, "message": f"worker: {exc}"}
            self.env.runner.send_message("harness_final", {"error": error})

    def _build_engine(self, wire: dict[str, Any]) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.is_worker:
            # A worker's own command line need not repeat the harness options: take the
            # master's, so every process runs the very same scenario.
            opts = dict(wire["options"])
            opts["inputs"] = tuple(opts["inputs"])
            self.opts = Options(**opts)
            self.scenario = self._load_scenario().with_cores(int(wire.get("sut_cores_n") or 1))
        plan = Plan.from_wire(wire)
        self._final_sent = False
        self._cpu_at_plan = target.cpu_s()
        self.engine = Engine(
            self.scenario,
            plan,
            Recording(
                self.scenario.load.window_s, -(-self.scenario.load.first_requests // plan.slots)
            ),
            fire_request=self.env.events.request.fire,
        )
        self.engine_ready.set()

    def drain_for_master(self) -> dict[str, Any] | None:
        e = self.engine
        if e is None or e.recording.closed:
            return None
        delta = e.recording.drain(e.now())
        delta["cpu_s"] = target.cpu_s() - self._cpu_at_plan
        return delta

    def send_final(self) -> None:
        """Worker: stop scheduling, wait for requests out, send the final delta."""
        if self._final_sent:
            return
        self._final_sent = True
        self.env.runner.send_message("harness_final", self.final_delta())

    def final_delta(self) -> dict[str, Any] | None:
        e = self.engine
        if e is None or e.recording.closed:
            return None
        grace = self.scenario.load.request_timeout_s + 1.0
        left = e.wait_in_flight(grace)
        if left:
            log.warning("harness: %d requests still in flight after %.1f s", left, grace)
        delta = e.recording.drain(e.now(), final=True)
        delta["cpu_s"] = target.cpu_s() - self._cpu_at_plan
        e.close()
        return delta

    # -- master: merging -------------------------------------------------------------

    def on_worker_report(self, client_id: str, data: dict[str, Any]) -> None:
        delta = data.get("harness")
        if delta and not self.finalized:
            self.aggregate.merge(delta, client_id)
            self.cpu_by_source[client_id] = float(delta.get("cpu_s") or 0.0)

    def on_final(self, client_id: str, delta: dict[str, Any] | None) -> None:
        if delta and delta.get("error") and self.error is None:
            self.error = dict(delta["error"])
            self.exit_code = 2 if self.error.get("type") == "ConfigError" else 1
            gevent.spawn(self.env.runner.stop)
        elif delta and not self.finalized:
            self.aggregate.merge(delta, client_id)
            self.cpu_by_source[client_id] = float(delta.get("cpu_s") or 0.0)
        self.finals.add(client_id)
        if self.finals >= set(self.plan_clients):
            self.finals_event.set()

    # -- the end ---------------------------------------------------------------------

    def finalize(self) -> None:
        """At test_stop on the master/local runner: merge, stop side tasks, write results."""
        if self.finalized or not self.prepared:
            return
        if self.is_master:
            # In headless mode Locust's master quits without sending "stop" to the
            # workers, so ask them for their final reports explicitly.
            for cid in set(self.plan_clients) - self.finals:
                with contextlib.suppress(Exception):
                    self.env.runner.send_message("harness_finish", None, client_id=cid)
            self.finals_event.wait(self.scenario.load.request_timeout_s + 15.0)
            missing = set(self.plan_clients) - self.finals
            if missing:
                log.warning("harness: no final report from workers %s", sorted(missing))
        else:
            delta = self.final_delta()
            if delta:
                self.aggregate.merge(delta, "local")
                self.cpu_by_source["local"] = float(delta.get("cpu_s") or 0.0)
        self.finalized = True
        self.ended_unix = time.time()
        for g in self.greenlets:
            g.kill(block=False)
        if self.timeline is not None:
            self.timeline.stop()
        samples = self._stop_sampler()
        self.aggregate.finish()
        self.partial = self._partial()
        self._write(partial=self.partial, samples=samples)
        self.written = True
        # With the web UI the next "start" prepares a fresh run (new plan, new results).
        self.prepared = False

    def _partial(self) -> bool:
        missing = bool(set(self.plan_clients) - self.finals) if self.is_master else False
        return (
            (not self.shape_done) or self.sut_exit is not None or self.error is not None or missing
        )

    def _stop_sampler(self) -> dict[str, Any] | None:
        proc, self.sampler = self.sampler, None
        return target.stop_sampler(proc, self.out_dir / "samples")

    def _write(self, partial: bool, samples: dict[str, Any] | None) -> Path:
        end = self.ended_unix or time.time()
        chaos = list(self.timeline.records) if self.timeline is not None else []
        sc = scenario_result(
            scenario=self.scenario,
            file=self.opts.scenario,
            recording=self.aggregate,
            started_unix=self.origin_unix,
            duration_s=round(max(0.0, end - (self.origin_unix or end)), 3),
            partial=partial,
            capacity_rps=self.capacity_rps,
            calibration=self.calibration,
            time_to_ready_s=self.time_to_ready_s,
            fresh_sut=self.fresh_sut,
            golden_summary=self.golden_summary,
            chaos=chaos + self.chaos_skipped,
            samples=samples,
            sut_cores=self.sut_cores_n,
            error=self.error,
            sut_exit=self.sut_exit,
            workers=self.slots,
            loadgen_cpu_s=dict(self.cpu_by_source),
        )
        import locust

        doc = results.new_document(
            sut=self.sut_doc or {"target": self.env.host},
            loadgen={
                "workers": self.slots,
                "locust_version": locust.__version__,
                "cores": sorted(os.sched_getaffinity(0)),
                "master_cpu_s": round(sum(os.times()[:2]), 3),
            },
        )
        doc["partial"] = partial
        doc["scenarios"].append(sc)
        return results.write_document(self.out_dir / "results.json", doc)

    def shutdown(self) -> None:
        """At quit: stop what this process started (the SUT last)."""
        for g in self.greenlets:
            g.kill(block=False)
        if self.timeline is not None:
            with contextlib.suppress(Exception):
                self.timeline.stop()
        self._stop_sampler()
        if self.engine is not None:
            self.engine.close()
        if isinstance(self.sut_handle, sut.SutProcess):
            self.sut_handle.stop()
