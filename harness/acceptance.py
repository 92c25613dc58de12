"""Run scenarios the way a user would: one ``locust -f locustfiles/inference.py --headless``
subprocess per scenario, then merge, judge and report.

The harness has no private load engine ("one code path"): everything that
measures happens inside the Locust run; this module only starts it, watches its progress
file, stops it cleanly on Ctrl-C and turns the per-scenario documents into one verdict.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

import locustfiles
from harness.errors import ConfigError, ExitCode, HarnessError, ResultFormatError
from harness.finish import PARENT_RENDERS_ENV, finish
from harness.load.preflight import Exclusion
from harness.results import load_document, machine_metadata, merge_documents, new_document
from harness.results.records import ZERO_COUNTERS

# The order of the delivery checklist: cheap, fresh-server scenarios first so a broken
# server fails fast; the soak last, where a partial report is still worth having.
CHECKLIST: tuple[str, ...] = (
    "cold_start",
    "steady_state",
    "spike",
    "mixed_priority",
    "integrity",
    "contention",
    "freeze",
    "crash_restart",
    "rolling_shutdown",
    "linearity",
    "soak",
)

# Scenarios only `--full` runs. `network` would add 52 s of load (~60 s wall) to a quick
# checklist CI runs whole, already near its budget; its quick-mode proof is the detection
# matrix (reset-leak, io-lock and their healthy twins) and tests/test_network_fault*.py.
FULL_ONLY: tuple[str, ...] = ("network",)


def checklist(mode: str) -> tuple[str, ...]:
    """The scenarios ``harness acceptance`` runs in ``mode``: CHECKLIST, + FULL_ONLY in full."""
    return CHECKLIST + FULL_ONLY if mode == "full" else CHECKLIST


# How long Locust gets to write its partial results after SIGTERM before SIGKILL.
_STOP_GRACE_S = 30.0


def locustfile_path() -> Path:
    return Path(locustfiles.__file__).resolve().parent / "inference.py"


def default_sut_cmd(model: str | None = None) -> str:
    """The bundled reference server, on the port and with the threads the harness picks."""
    cmd = f"{shlex.quote(sys.executable)} -m reference_server --port {{port}} --workers {{threads}}"
    if model:
        cmd += f" --model {shlex.quote(model)}"
    return cmd


@dataclass(frozen=True)
class Target:
    """Where the load goes. Exactly one of ``sut_cmd`` / ``url`` is set."""

    sut_cmd: str | None = None
    url: str | None = None
    sut_pid: int | None = None
    model: str | None = None
    # deployment options (harness.load.options): headers as "Name: value", validated
    headers: tuple[str, ...] = ()
    ca_cert: str | None = None
    insecure: bool = False
    metrics_url: str | None = None
    # the server on another host: sampler and chaos through `harness agent`
    agent_url: str | None = None
    agent_token: str | None = field(default=None, repr=False)  # a secret: environment only

    def __post_init__(self) -> None:
        if (self.sut_cmd is None) == (self.url is None):
            raise ConfigError(
                "give either --sut-cmd (the harness starts the server) or --target URL "
                "(attach to a running one), not both"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--target has value {self.url!r}; expected an http:// or https:// URL such "
                "as http://127.0.0.1:8000"
            )
        if self.sut_cmd is not None:
            from harness.load.preflight import check_sut_cmd

            check_sut_cmd(self.sut_cmd)

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


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[str, ...]
    mode: str
    out_dir: Path
    target: Target
    checklist: Path | None = None
    duration_s: float | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # scenarios left out before load started (harness.load.preflight.Exclusion)
    excluded: tuple[Exclusion, ...] = ()
    # check ids and scenario names the user accepts unjudged or not run (--allow-skip)
    allow_skip: tuple[str, ...] = ()
    # more attempts for a scenario invalid only because the machine was disturbed
    retry_invalid: int = 1
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


@dataclass(frozen=True)
class Outcome:
    document: dict[str, Any]
    exit_code: ExitCode
    runs: tuple[ScenarioRun, ...]


class _Interrupt:
    """Turns SIGINT/SIGTERM into a flag so the running scenario is stopped cleanly."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def scenario_argv(plan: Plan, name: str, out_dir: Path) -> list[str]:
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
        plan.mode,
        "--out",
        str(out_dir),
        "--loglevel",
        "WARNING",
        "--only-summary",
    ]
    argv += plan.target.locust_args()
    if plan.duration_s is not None:
        argv += ["--duration", str(plan.duration_s)]
    if plan.checklist is not None:
        argv += ["--checklist", str(plan.checklist)]
    if plan.allow_skip:
        argv += ["--allow-skip", ",".join(plan.allow_skip)]
    argv += list(plan.extra_args)
    return argv


def core_split(sut_cores: str | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(server's cores, generator's cores) for a server the harness starts on this host,
    when they can be apart (``harness.sut.split_cores``); else None (nothing pinned). The
    generator — the Locust process, its workers, the sampler — then runs where the server
    does not, so it neither takes CPU from the server it measures nor waits behind the
    server's threads to send on time. A server given every core shares them."""
    from harness import sut

    split = sut.split_cores(sut_cores)
    return None if split.shared else (split.sut, split.loadgen)


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
    if p.get("dropped"):
        parts.append(f"dropped {p['dropped']}")
    return f"{head} " + "  ".join(parts)


def run_one(
    plan: Plan,
    name: str,
    index: int,
    total: int,
    interrupt: _Interrupt,
    show: Callable[[str], None],
    poll_s: float = 1.0,
) -> ScenarioRun:
    out_dir = plan.out_dir / Path(name).stem
    out_dir.mkdir(parents=True, exist_ok=True)
    run = ScenarioRun(name=name, out_dir=out_dir)
    log_path = out_dir / "locust.log"
    env = {**os.environ, **plan.env, **plan.target.locust_env(), PARENT_RENDERS_ENV: "1"}
    loadgen = plan.loadgen_cores

    def pin() -> None:  # in the child between fork and exec: every thread inherits it
        os.sched_setaffinity(0, loadgen or ())

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            scenario_argv(plan, name, out_dir),
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
                if interrupt.requested and sent_term_at is None:
                    run.interrupted = True
                    proc.send_signal(signal.SIGTERM)  # Locust quits and writes partial results
                    sent_term_at = time.monotonic()
                if sent_term_at is not None and time.monotonic() - sent_term_at > _STOP_GRACE_S:
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
        run.error = _last_error_line(log_path) or str(e)
    return run


def _recorded_error(document: Mapping[str, Any] | None) -> str | None:
    """The error message a scenario's results recorded (``error.message``), if any."""
    for sc in (document or {}).get("scenarios") or []:
        message = (sc.get("error") or {}).get("message")
        if message:
            return str(message)
    return None


def _last_error_line(log_path: Path) -> str | None:
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


def _failed_scenario(run: ScenarioRun, mode: str) -> dict[str, Any]:
    """A scenario whose Locust run produced no results: a failed check with the cause, in
    a scenario result the schema accepts, with whatever the sampler measured before the
    run died (the server's and the machine's series: often what explains the death)."""
    from harness.load.target import samples_left

    samples = samples_left(run.out_dir / "samples") or {}
    return {
        "name": Path(run.name).stem,
        "file": str(run.name),
        "mode": mode,
        "started_unix": run.started_unix,
        "duration_s": round(run.elapsed_s, 3),
        "partial": True,
        "no_results": True,
        "capacity_rps": None,
        "check_config": {},
        "time_to_ready_s": None,
        "stages": [],
        "classes": {},
        "counters": {**ZERO_COUNTERS, "failed": {}},
        "by_class": {},
        "by_stage": {},
        "windows": None,
        "first_requests": None,
        "dispatch_lag_hdr": None,
        "error_latency_hdr": None,
        "integrity": None,
        "linearity": None,
        "contention": None,
        "chaos": [],
        "server": samples.get("server"),
        "system": samples.get("system"),
        "metrics": samples.get("metrics"),
        "verdict": "fail",
        "checks": [
            {
                "id": "run.completed",
                "passed": False,
                "value": run.returncode,
                "threshold": int(ExitCode.PASS),
                "op": "==",
                "unit": "exit code",
                "n": None,
                "detail": f"the scenario produced no results: {run.error}. See {run.out_dir}/locust.log.",
                "skipped": None,
            }
        ],
    }


def run_plan(plan: Plan, show: Callable[[str], None] = print) -> Outcome:
    """Run every scenario of ``plan`` in order, then merge, judge and render."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[ScenarioRun] = []
    excluded: list[Exclusion] = list(plan.excluded)
    for e in plan.excluded:
        show(f"  {e.name}: NOT RUN — {e.reason}")
    with _Interrupt() as interrupt:
        current = plan
        pinned = any(a.startswith("--capacity-rps") for a in plan.extra_args)
        for i, name in enumerate(plan.scenarios, start=1):
            if interrupt.requested:
                break
            run = run_one(current, name, i, len(plan.scenarios), interrupt, show)
            while len(run.attempts) < plan.retry_invalid and not interrupt.requested:
                reasons = retry_reasons(run, plan)
                if not reasons:
                    break
                earlier = [*run.attempts, _set_aside(run, reasons)]
                show(
                    f"  {Path(name).stem}: INVALID — {reasons[0]}; the machine was disturbed, "
                    f"so it runs again (attempt {len(earlier) + 1} of {plan.retry_invalid + 1}; "
                    f"attempt {len(earlier)} kept in {earlier[-1]['dir']})"
                )
                run = run_one(current, name, i, len(plan.scenarios), interrupt, show)
                run.attempts = earlier
                if run.document is not None:
                    for sc in run.document.get("scenarios") or []:
                        sc["attempts"] = earlier
            if run.returncode == ExitCode.USAGE and not run.interrupted:
                # A usage error (found while preparing: a model without inputs, a missing
                # placeholder): the scenario was not measured, whatever the child wrote —
                # a configuration error is the user's to fix, not a disturbed run.
                message = (
                    _recorded_error(run.document)
                    or run.error
                    or _last_error_line(run.out_dir / "locust.log")
                    or f"locust exited {int(ExitCode.USAGE)} for scenario {name}"
                )
                if not any(r.document is not None for r in runs):
                    # before anything was measured: fail in seconds, one line
                    raise ConfigError(message)
                # found late (other scenarios measured something): keep what was measured;
                # this scenario counts as planned and not run (the verdict is at best
                # "not judged"), named with the error
                excluded.append(Exclusion(Path(name).stem, f"configuration error: {message}"))
                show(f"  {Path(name).stem}: NOT RUN — configuration error: {message}")
                continue
            runs.append(run)
            show(_scenario_summary(run))
            capacity = None if pinned else calibrated_capacity(run.document)
            if capacity is not None:
                # One capacity for the whole checklist: "0.6x" is the same rate in every
                # scenario, and the later ones skip their own probe.
                pinned = True
                current = replace(
                    plan, extra_args=(*plan.extra_args, "--capacity-rps", repr(capacity))
                )
                show(
                    f"  capacity {capacity:.1f} req/s (calibrated in {Path(name).stem}; "
                    "pinned for the scenarios after it)"
                )
    docs = [r.document for r in runs if r.document is not None]
    if docs:
        doc = merge_documents(docs)
    else:
        doc = new_document(machine=machine_metadata(), sut=plan.target.describe(), loadgen={})
        doc["scenarios"] = []
    by_name = {sc.get("name") for sc in doc["scenarios"]}
    for run in runs:
        if run.document is None and Path(run.name).stem not in by_name:
            doc["scenarios"].append(_failed_scenario(run, plan.mode))
    if excluded:
        doc["excluded"] = [
            {"name": e.name, "reason": e.reason, "optional": e.optional} for e in excluded
        ]
    if plan.allow_skip:
        doc["allow_skip"] = list(plan.allow_skip)
    attempted = len(runs) + len(excluded) - len(plan.excluded)
    interrupted = any(r.interrupted for r in runs) or attempted < len(plan.scenarios)
    if interrupted:
        doc["partial"] = True
        doc["not_run"] = list(plan.scenarios[attempted:])
    doc, code = finish(plan.out_dir, plan.checklist, doc=doc)
    return Outcome(document=doc, exit_code=code, runs=tuple(runs))


def retry_reasons(run: ScenarioRun, plan: Plan) -> list[str]:
    """Why ``run`` may be run again: its validity reasons when every one of them is a
    disturbance of the machine (``engine.disturbance_reasons``: requests that left late,
    another tenant's CPU) and nothing else is wrong; else none. A scenario invalid for
    what the same machine would give again (the generator saturated, a sampler gap,
    unbalanced accounting, chaos that did not apply), one that failed a check or ended
    with a dead server, and an attached server whose pid is gone are not retried."""
    if run.document is None or run.interrupted:
        return []
    if plan.target.sut_pid is not None and not psutil.pid_exists(plan.target.sut_pid):
        return []  # the next attempt could not sample the attached server
    from harness.checks import judge_scenario, load_checklist
    from harness.checks.engine import disturbance_reasons

    overrides = load_checklist(plan.checklist) if plan.checklist is not None else None
    reasons: list[str] = []
    for sc in run.document.get("scenarios") or []:
        judged = judge_scenario(copy.deepcopy(sc), overrides)
        if judged["verdict"] != "invalid":
            return []
        machine = set(disturbance_reasons(sc, overrides))
        if not set(judged["validity"]) <= machine:
            return []
        reasons += judged["validity"]
    return reasons


def _set_aside(run: ScenarioRun, reasons: Sequence[str]) -> dict[str, Any]:
    """Move an invalid attempt's directory to ``NAME.attempt-K`` (kept whole: its results,
    samples and logs) and describe it for the results of the attempt that replaces it."""
    k = len(run.attempts) + 1
    kept = run.out_dir.with_name(f"{run.out_dir.name}.attempt-{k}")
    if kept.exists():
        shutil.rmtree(kept)  # an older acceptance run's, in the same --out
    run.out_dir.rename(kept)
    return {
        "attempt": k,
        "verdict": "invalid",
        "validity": list(reasons),
        "dir": kept.name,
        "started_unix": run.started_unix,
        "elapsed_s": round(run.elapsed_s, 3),
    }


def calibrated_capacity(document: Mapping[str, Any] | None) -> float | None:
    """The capacity a scenario's calibration probe measured, if it ran one and was not
    judged disturbed (another tenant, a saturated generator: then the next scenario
    calibrates on its own)."""
    from harness.checks.engine import probe_reasons

    for sc in (document or {}).get("scenarios") or []:
        if sc.get("calibration") and sc.get("capacity_rps") and not probe_reasons(sc):
            return float(sc["capacity_rps"])
    return None


def _scenario_summary(run: ScenarioRun) -> str:
    name = Path(run.name).stem
    if run.document is None:
        return f"  {name}: FAIL — {run.error}"
    lines = []
    for sc in run.document.get("scenarios", []):
        checks = sc.get("checks") or []
        passed = sum(1 for c in checks if c.get("passed") is True)
        failed = [c for c in checks if c.get("passed") is False]
        skipped = sum(1 for c in checks if c.get("passed") is None)
        verdict = (sc.get("verdict") or "unjudged").upper()
        lines.append(
            f"  {name}: {verdict} — {passed} passed, {len(failed)} failed, {skipped} skipped"
            + ("" if not sc.get("partial") else " (partial)")
        )
        for c in failed:
            lines.append(f"    FAIL {c.get('id')}: {c.get('detail')}")
        lines += [
            f"    attempt {a.get('attempt')} set aside as invalid (kept in {a.get('dir')}/)"
            for a in sc.get("attempts") or []
        ]
    return "\n".join(lines) or f"  {name}: no scenarios in results"


def resolve_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """Check every scenario name/path before any load runs (a typo fails in a second)."""
    from harness.load.scenario import load_scenario

    for n in names:
        load_scenario(n, mode="quick")
    return tuple(names)


def preflight(plan: Plan) -> list[Exclusion]:
    """Each planned scenario this target cannot support, with the reason, found before
    any load starts (harness.load.preflight)."""
    from harness.checks import load_checklist
    from harness.load.preflight import TargetFacts, agent_facts, check_transport, exclusions
    from harness.load.scenario import load_scenario

    check_transport(plan.target.url, plan.target.client())  # https: verifies, or exit 2

    cores = None
    args = list(plan.extra_args)
    for i, a in enumerate(args):
        if a == "--sut-cores" and i + 1 < len(args):
            cores = args[i + 1]
        elif a.startswith("--sut-cores="):
            cores = a.split("=", 1)[1]
    t = plan.target
    remote = agent_facts(t.agent_url, t.agent_token, t.sut_pid)
    checklist = load_checklist(plan.checklist) if plan.checklist is not None else None
    facts = TargetFacts(
        sut_cmd=plan.target.sut_cmd,
        attached=plan.target.url is not None,
        sut_cores=cores,
        samples_server="--no-sample" not in args
        and bool(t.sut_cmd or t.sut_pid is not None or t.agent_url),
        allow_skip=frozenset(plan.allow_skip)
        | frozenset((checklist or {}).get("allow_skip") or ()),
        **remote,
    )
    loaded = [(Path(n).stem, load_scenario(n, mode=plan.mode)) for n in plan.scenarios]
    return exclusions(loaded, facts, checklist)


__all__ = [
    "CHECKLIST",
    "HarnessError",
    "Outcome",
    "Plan",
    "Target",
    "default_sut_cmd",
    "locustfile_path",
    "run_plan",
]
