"""The ``harness`` command. The only place that prints errors and picks exit codes.

Each subcommand is a pair: ``_add_<name>(subparsers)`` declares its options and sets
``handler``; the handler takes the parsed namespace and returns an exit code. To add a
subcommand (``acceptance``, ``run``, ``report``, ``judge``, ``compare``), write the pair and list the
``_add_`` function in ``SUBCOMMANDS``. Library code below the CLI gets frozen config
objects, never the namespace.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from harness.errors import ConfigError, ExitCode, HarnessError


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line naming the fix (no usage dump on stderr)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return v


# --- harness sample ---------------------------------------------------------------------


def _add_sample(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sample",
        help="pidstat-style sampling of a running server (threads, memory, fds, CPU)",
        description="Sample a process tree (per-thread CPU like `pidstat -t`, RSS/USS/PSS, "
        "threads, fds), system CPU per core and optionally a /metrics URL; stream CSVs to "
        "--out. Runs until --duration or Ctrl-C.",
    )
    p.add_argument("--pid", type=int, default=None, help="pid of the server to watch")
    p.add_argument(
        "--pid-file",
        default=None,
        help="file holding the server's pid; followed when the server is restarted",
    )
    p.add_argument("--out", required=True, help="directory for process.csv, threads.csv, …")
    p.add_argument("--interval", type=_positive_float, default=1.0, help="seconds (default 1)")
    p.add_argument(
        "--duration", type=_positive_float, default=None, help="seconds (default: until Ctrl-C)"
    )
    p.add_argument("--metrics-url", default=None, help="Prometheus /metrics URL to scrape")
    p.add_argument("--metrics-match", default=None, help="regex of series names to keep")
    p.add_argument(
        "--loadgen-pid",
        type=int,
        action="append",
        default=None,
        help="load generator pid (repeatable; default: the sampler's parent process tree)",
    )
    p.add_argument(
        "--no-children", action="store_true", help="watch the pid only, not its children"
    )
    p.add_argument(
        "--uss-every", type=_positive_float, default=10.0, help="seconds between USS/PSS reads"
    )
    p.add_argument("--live", action="store_true", help="print a pidstat-like table every tick")
    p.add_argument(
        "--stop-with-parent",
        action="store_true",
        help="stop when the process that started the sampler exits (the harness sets it)",
    )
    p.set_defaults(handler=_run_sample)


def _run_sample(args: argparse.Namespace) -> int:
    from harness.collectors.metrics import DEFAULT_MATCH
    from harness.collectors.runner import SamplerConfig, SamplingSession

    config = SamplerConfig(
        pid=args.pid,
        out_dir=args.out,
        interval_s=args.interval,
        duration_s=args.duration,
        include_children=not args.no_children,
        uss_every_s=args.uss_every,
        metrics_url=args.metrics_url,
        metrics_match=args.metrics_match or DEFAULT_MATCH,
        loadgen_pids=tuple(args.loadgen_pid) if args.loadgen_pid else None,
        pid_file=args.pid_file,
        stop_with_parent=args.stop_with_parent,
    )
    stop = threading.Event()

    def live(text: str) -> None:
        print(text, flush=True)

    session = SamplingSession(config, stop=stop, live=live if args.live else None)
    with _stop_on_signals(stop):
        meta = session.run()
    print(
        f"sampled pid {meta['pid']}: {meta['ticks']} ticks, {meta['missed_ticks']} missed"
        f"{' (target exited)' if meta['target_exited'] else ''}"
        f"{' (its parent exited)' if meta['parent_exited'] else ''} → {config.out_dir}",
        file=sys.stderr,
    )
    return ExitCode.PASS


class _stop_on_signals:
    """SIGINT/SIGTERM set ``stop`` (the session then closes its files) instead of killing us."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: dict[int, object] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, lambda *_: self.stop.set())

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


# --- harness acceptance / run -------------------------------------------------------------


def _add_target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "target",
        "default: start the bundled reference server on a free loopback port",
    )
    g.add_argument(
        "--sut-cmd",
        default=None,
        help="start this server; {port} (and {threads}) are filled in, e.g. "
        '"tritonserver --model-repository /models --http-port {port}"',
    )
    g.add_argument("--target", default=None, metavar="URL", help="attach to a running server")
    g.add_argument(
        "--sut-pid", type=int, default=None, help="its pid, for server-side checks and chaos"
    )
    g.add_argument(
        "--model", default=None, help="model name on the server (V2 protocol); default: its own"
    )
    g.add_argument("--sut-cores", default=None, help="cores for a started server, e.g. 1 or 0-1")
    g.add_argument(
        "--header",
        action="append",
        default=None,
        metavar="NAME:VALUE",
        help="send this header with every request, e.g. 'Authorization: Bearer TOKEN' or "
        "'Host: model.example.com' (repeatable; default: $HARNESS_HEADER, one header or a "
        "JSON list). Results record the names only",
    )
    g.add_argument(
        "--ca-cert",
        default=None,
        metavar="FILE",
        help="https:// target: trust the CA in this PEM file (default: the system's CAs)",
    )
    g.add_argument(
        "--insecure", action="store_true", help="https:// target: do not verify its certificate"
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        metavar="URL",
        help="the server's Prometheus metrics when not at TARGET/metrics, e.g. "
        "http://HOST:8002/metrics (Triton)",
    )
    g.add_argument(
        "--agent",
        default=None,
        metavar="URL",
        help="the server runs on another host: sample it and apply chaos through the "
        "`harness agent` there (needs --target and --sut-pid, its pid on that host)",
    )
    g.add_argument(
        "--agent-token",
        default=None,
        metavar="TOKEN",
        help="the agent's --token (default: $HARNESS_AGENT_TOKEN; the environment keeps it "
        "out of `ps`)",
    )
    p.add_argument("--out", default=None, help="output directory (default: harness-results/NAME)")
    p.add_argument("--checklist", default=None, help="TOML overriding check thresholds")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DTYPE:SHAPE",
        help="a model input, when the server's metadata lists none (repeatable), e.g. "
        "--input input:FP32:1,256",
    )
    p.add_argument(
        "--sample-request",
        default=None,
        metavar="FILE",
        help="a V2 inference request JSON file whose inputs are the template of every request",
    )
    p.add_argument(
        "--allow-skip",
        action="append",
        default=[],
        metavar="ID",
        help="accept this check unjudged, or this scenario not run (comma-separated, "
        "repeatable): a scenario passes only when every check that defines it was judged, "
        "and every planned scenario counts; the verdict line names what you accepted",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="the CI variant of each scenario (default)",
    )
    mode.add_argument(
        "--full",
        dest="mode",
        action="store_const",
        const="full",
        help="the pre-release variant (1 h soak, longer stages)",
    )
    p.set_defaults(mode="quick")
    p.add_argument(
        "--locust-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to each locust run (repeatable), e.g. --locust-arg=--capacity-rps=400",
    )
    p.add_argument(
        "--capacity",
        choices=("probe", "peak"),
        default="probe",
        help='what "0.6x" multiplies: probe = the 5 s closed-loop capacity probe (default); '
        "peak = `harness peak`'s rate under --capacity-slo-p99-ms, searched first",
    )
    p.add_argument(
        "--capacity-slo-p99-ms",
        type=_positive_float,
        default=500.0,
        help="with --capacity=peak: the p99 SLO (ms) of that search (default 500, the "
        "packaged steady_state SLO)",
    )
    p.add_argument(
        "--retry-invalid",
        type=int,
        default=1,
        metavar="N",
        help="run a scenario up to N more times when it is invalid only because the machine "
        "was disturbed (requests left late, another tenant's CPU); every attempt is kept "
        "and reported (default 1; 0 = never)",
    )


def _add_acceptance(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "acceptance",
        help="run the whole delivery checklist (CI gate: exit code, junit.xml, summary.md)",
        description="Run every checklist scenario as a headless Locust run against the target, "
        "then judge and report. Exit 0 pass, 1 a check failed, 2 usage error, 3 invalid run, 4 nothing judged.",
    )
    _add_target_options(p)
    p.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated subset of the checklist to run (default: all of it)",
    )
    p.set_defaults(handler=_run_acceptance)


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run one scenario (a name from scenarios/ or a .toml path)",
        description="Run one scenario as a headless Locust run, then judge and report.",
    )
    p.add_argument("scenario", help="e.g. spike, or path/to/my_scenario.toml")
    p.add_argument(
        "--duration", type=_positive_float, default=None, help="total seconds (stages scaled)"
    )
    _add_target_options(p)
    p.set_defaults(handler=_run_run)


def _plan(args: argparse.Namespace, scenarios: Sequence[str], default_out: str) -> Any:
    from pathlib import Path

    from harness.acceptance import Plan, Target, default_sut_cmd, resolve_scenarios

    if args.target is None and args.sut_pid is not None:
        raise ConfigError("--sut-pid needs --target URL (the server's address)")
    if args.retry_invalid < 0:
        raise ConfigError(f"--retry-invalid has value {args.retry_invalid}; expected 0 or more")
    if args.agent is not None and args.target is None:
        raise ConfigError(
            "--agent needs --target URL (the server's address; its pid on the agent's host "
            "is --sut-pid, or none when the agent started it with --sut-cmd)"
        )
    sut_cmd = args.sut_cmd
    if sut_cmd is None and args.target is None:
        sut_cmd = default_sut_cmd()
    target = Target(
        sut_cmd=sut_cmd,
        url=args.target,
        sut_pid=args.sut_pid,
        model=args.model,
        **_deployment(args),
        **_agent(args),
    )
    from harness.checks.registry import validate_allow_skip

    if args.checklist is not None:
        from harness.checks import load_checklist

        load_checklist(args.checklist)  # a bad checklist fails before any load runs
    allow_skip = validate_allow_skip(
        [n.strip() for a in args.allow_skip for n in a.split(",") if n.strip()], "--allow-skip"
    )
    extra = list(args.locust_arg)
    for spec in args.input:
        extra += ["--input", spec]
    if args.sample_request:
        extra += ["--sample-request", str(Path(args.sample_request).resolve())]
    loadgen_cores = None
    if target.sut_cmd is not None and target.agent_url is None:
        from harness.acceptance import core_split

        split = core_split(args.sut_cores)
        if split is not None:
            # Locust runs on the generator's cores, so it is told the server's (it would
            # otherwise split its own, narrower affinity)
            loadgen_cores = split[1]
            if not args.sut_cores:
                extra += ["--sut-cores", ",".join(map(str, split[0]))]
    if args.sut_cores:
        extra += ["--sut-cores", args.sut_cores]
    plan = Plan(
        scenarios=resolve_scenarios(scenarios),
        mode=args.mode,
        out_dir=Path(args.out or default_out),
        target=target,
        checklist=Path(args.checklist) if args.checklist else None,
        duration_s=getattr(args, "duration", None),
        extra_args=tuple(extra),
        retry_invalid=args.retry_invalid,
        loadgen_cores=loadgen_cores,
        allow_skip=tuple(allow_skip),
    )
    plan = _without_unsupported(plan, single=getattr(args, "scenario", None) is not None)
    if getattr(args, "capacity", "probe") == "peak":
        plan = _with_peak_capacity(args, plan)
    return plan


def _with_peak_capacity(args: argparse.Namespace, plan: Any) -> Any:
    """--capacity=peak: find the peak under the SLO first (harness.peak, into OUT/peak)
    and pin it as every scenario's capacity (--capacity-rps), so "0.6x" is 60 % of what
    the server sustains within the SLO rather than of the raw closed-loop probe."""
    from dataclasses import replace

    from harness.peak.runner import PeakConfig, run_peak

    if any(a.startswith("--capacity-rps") for a in plan.extra_args):
        raise ConfigError("--capacity=peak and --capacity-rps are both set; give one")
    t = plan.target
    doc, code = run_peak(
        PeakConfig(slo_p99_ms=args.capacity_slo_p99_ms, repeats=1).validate(),
        plan.out_dir / "peak",
        sut_cmd=t.sut_cmd,
        url=t.url,
        sut_pid=t.sut_pid,
        sut_cores=args.sut_cores,
        model=t.model,
        show=lambda text: print(text, file=sys.stderr, flush=True),
    )
    peak = doc["peak"].get("peak_rps")
    if code != ExitCode.PASS or not peak:
        from harness.peak.report import peak_sentence

        raise HarnessError(
            f"--capacity=peak found no peak: {peak_sentence(doc['peak'])} "
            f"(see {plan.out_dir / 'peak' / 'summary.md'})"
        )
    print(
        f"capacity: peak {peak:.1f} req/s under p99 <= {args.capacity_slo_p99_ms:g} ms",
        file=sys.stderr,
    )
    return replace(plan, extra_args=(*plan.extra_args, "--capacity-rps", repr(float(peak))))


def _deployment(args: argparse.Namespace) -> dict[str, Any]:
    """--header/--ca-cert/--insecure/--metrics-url validated the way the Locust plugin
    validates them (one ConfigError naming the fix, before anything starts)."""
    import json
    import os

    from harness.load.options import deployment_options

    headers = args.header
    if headers is None and os.environ.get("HARNESS_HEADER"):
        raw = os.environ["HARNESS_HEADER"]
        try:
            headers = json.loads(raw) if raw.startswith("[") else [raw]
        except ValueError:
            raise ConfigError(
                "HARNESS_HEADER starts with '[' but is not a JSON list of strings; write "
                '\'["Authorization: Bearer TOKEN", "Host: model.example.com"]\''
            ) from None
    ns = argparse.Namespace(
        harness_header=headers,
        ca_cert=args.ca_cert,
        insecure=args.insecure,
        metrics_url=args.metrics_url,
    )
    return deployment_options(ns)


def _agent(args: argparse.Namespace) -> dict[str, Any]:
    """--agent/--agent-token: the agent answers, the token is right and the pid runs on
    its host, checked now (exit 2 naming the fix) rather than after the first server start."""
    import os

    if args.agent is None:
        return {}
    from harness.agent.client import AgentClient, RemoteSut

    token = args.agent_token or os.environ.get("HARNESS_AGENT_TOKEN")
    RemoteSut(AgentClient(args.agent, token), args.sut_pid)
    return {"agent_url": args.agent, "agent_token": token}


def _without_unsupported(plan: Any, single: bool) -> Any:
    """Leave out (acceptance) or refuse (run, exit 2) what the target cannot support."""
    from dataclasses import replace
    from pathlib import Path

    from harness.acceptance import preflight

    excluded = preflight(plan)
    if not excluded:
        return plan
    if single:
        e = excluded[0]
        raise ConfigError(f"scenario {e.name!r} cannot run against this target: {e.reason}")
    names = {e.name for e in excluded}
    kept = tuple(s for s in plan.scenarios if Path(s).stem not in names)
    if not kept:
        raise ConfigError(
            "no scenario of the plan can run against this target: "
            + "; ".join(f"{e.name}: {e.reason}" for e in excluded)
        )
    return replace(plan, scenarios=kept, excluded=tuple(excluded))


def _execute(plan: Any) -> int:
    from harness.acceptance import run_plan

    live = _LiveLine(sys.stderr)
    outcome = run_plan(plan, show=live.show)
    live.done()
    from harness.report.common import verdict_sentence

    doc = outcome.document
    sentence = verdict_sentence(doc)
    if doc.get("partial"):
        sentence += " (partial)"
    print(
        f"{sentence}: {plan.out_dir / 'summary.md'} · {plan.out_dir / 'report.html'} · "
        f"exit {int(outcome.exit_code)}"
    )
    return int(outcome.exit_code)


def _run_acceptance(args: argparse.Namespace) -> int:
    from harness.acceptance import CHECKLIST, FULL_ONLY, checklist

    names = checklist(args.mode)
    if args.scenarios:
        names = tuple(n.strip() for n in args.scenarios.split(",") if n.strip())
        unknown = [n for n in names if n not in CHECKLIST + FULL_ONLY]
        if unknown:
            raise ConfigError(
                f"--scenarios has {', '.join(unknown)!s}, not in the checklist. "
                f"Valid: {', '.join(CHECKLIST + FULL_ONLY)} (use `harness run FILE` for your own)"
            )
    return _execute(_plan(args, names, "harness-results/acceptance"))


def _run_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    return _execute(_plan(args, [args.scenario], f"harness-results/{Path(args.scenario).stem}"))


class _LiveLine:
    """One progress line rewritten in place on a terminal; plain lines otherwise (CI logs)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.last_plain = 0.0

    def show(self, text: str) -> None:
        import time

        if "\n" in text or text.startswith("  "):  # a scenario's summary: keep it
            self.done()
            print(text, file=self.stream, flush=True)
            return
        if self.tty:
            pad = max(0, len(self.last) - len(text))
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
            self.last = text
        elif time.monotonic() - self.last_plain >= 10.0:  # CI logs: every 10 s
            print(text, file=self.stream, flush=True)
            self.last_plain = time.monotonic()

    def done(self) -> None:
        if self.tty and self.last:
            self.stream.write("\n")
            self.stream.flush()
            self.last = ""


# --- harness report / compare -----------------------------------------------------------


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="re-render report.html, junit.xml and summary.md from DIR/results.json",
    )
    p.add_argument("dir", help="a directory holding results.json")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from harness.finish import exit_code_for
    from harness.report import render_dir
    from harness.results import load_document

    written = render_dir(args.dir)
    for path in written.values():
        print(path)
    from pathlib import Path

    return exit_code_for(load_document(Path(args.dir) / "results.json"))


def _add_judge(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "judge",
        help="judge DIR/results.json (checks, validity, verdict), rewrite it, render the reports",
    )
    p.add_argument("dir", help="a directory holding results.json")
    p.add_argument("--checklist", default=None, help="TOML file overriding check thresholds")
    p.set_defaults(handler=_run_judge)


def _run_judge(args: argparse.Namespace) -> int:
    """The same judging as the end of a run (``harness.finish``): for results written by a
    run that was killed before it judged them, or judged again under another checklist."""
    from harness.finish import finish, verdict_line

    doc, code = finish(args.dir, args.checklist)
    print(f"{verdict_line(doc)} (exit {int(code)})")
    return code


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="regression verdict between two runs (exit 1 if NEW regressed)",
    )
    p.add_argument("base", help="results directory of the baseline run")
    p.add_argument("new", help="results directory of the new run")
    p.add_argument(
        "--force", action="store_true", help="compare even if the machines' metadata differ"
    )
    p.add_argument("--markdown", default=None, help="also write the comparison table here")
    p.set_defaults(handler=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.report.compare import compare_dirs

    comparison = compare_dirs(args.base, args.new, force=args.force)
    print(comparison.to_text(), end="")
    if args.markdown:
        Path(args.markdown).write_text(comparison.to_markdown())
    by_verdict = {"regressed": ExitCode.FAIL, "invalid": ExitCode.INVALID}
    return by_verdict.get(comparison.verdict, ExitCode.PASS)


# --- harness agent ----------------------------------------------------------------------


def _add_agent(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="serve the sampler and chaos actions on the server's host (for --agent URL)",
        description="Run beside the server under test (same host, or a sidecar sharing its "
        "process namespace) so a Locust master on another host samples it and applies "
        "chaos through it (--agent URL --agent-token TOKEN --sut-pid PID there). Every "
        "request needs the bearer token; applied actions are reverted when the master's "
        "heartbeat stops for --lease seconds and when the agent exits.",
    )
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: loopback only; 0.0.0.0 for all)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="shared secret every request must carry (default: $HARNESS_AGENT_TOKEN; the "
        "environment keeps it out of `ps`)",
    )
    p.add_argument(
        "--allow",
        default="cpu_hog,pause,kill",
        help="chaos actions the master may apply here, comma-separated (default "
        "cpu_hog,pause,kill; '' for none): anything else is refused with 403",
    )
    p.add_argument(
        "--lease",
        type=_positive_float,
        default=10.0,
        help="seconds without a word from the master before the agent reverts every "
        "applied action and stops its samplers (default 10)",
    )
    p.add_argument("--dir", default=None, help="where sampler files go (default: a temp dir)")
    p.add_argument(
        "--sut-cmd",
        default=None,
        help="start the server under test here and own it: the master needs no --sut-pid, "
        "kill chaos may restart it (on this host), and it is stopped when the agent exits. "
        "{port} is filled from --sut-port; bind it where the load can reach it",
    )
    p.add_argument(
        "--sut-port", type=int, default=None, help="{port} of --sut-cmd (default: a free port)"
    )
    p.set_defaults(handler=_run_agent)


def _run_agent(args: argparse.Namespace) -> int:
    import os

    from harness.agent.server import AgentConfig, serve

    config = AgentConfig(
        token=args.token or os.environ.get("HARNESS_AGENT_TOKEN", ""),
        allow=tuple(a.strip() for a in args.allow.split(",") if a.strip()),
        bind=args.bind,
        port=args.port,
        lease_s=args.lease,
        root=args.dir,
        sut_cmd=args.sut_cmd,
        sut_port=args.sut_port,
    ).validate()
    if args.sut_cmd:
        from harness.load.preflight import check_sut_cmd

        check_sut_cmd(args.sut_cmd)

    def ready(url: str) -> None:
        print(
            f"harness agent: listening on {url} (allow: {', '.join(config.allow) or 'none'}; "
            f"lease {config.lease_s:g} s)",
            file=sys.stderr,
            flush=True,
        )

    return serve(config, ready=ready)


# --- harness peak / tune (harness/peak/) ---------------------------------------


def _fraction(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _positive_ms(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ms") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a latency > 0 ms, e.g. 100")
    return v


def _add_peak_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slo-p99-ms",
        type=_positive_ms,
        required=True,
        help="the latency SLO: p99 over all requests (failures count as over it), in ms",
    )
    p.add_argument(
        "--max-error-rate",
        type=_fraction,
        default=0.01,
        help="failed + dropped share a point may have (default 0.01)",
    )
    p.add_argument(
        "--confidence",
        type=_fraction,
        default=0.95,
        help="early-stopping confidence of each point's p99 verdict; sets the requests per "
        "point (default 0.95: 1182)",
    )
    p.add_argument(
        "--tolerance",
        type=_fraction,
        default=0.05,
        help="stop bisecting when the bracket is this fraction wide (default 0.05)",
    )
    p.add_argument(
        "--start-rps",
        type=_positive_float,
        default=None,
        help="first rate to measure (default: half the harness's capacity probe)",
    )
    p.add_argument(
        "--warmup-s",
        type=_fraction,
        default=3.0,
        help="seconds of each point not judged (default 3)",
    )
    p.add_argument(
        "--min-point-s",
        type=_positive_float,
        default=5.0,
        help="shortest measured part of a point (default 5 s)",
    )
    p.add_argument(
        "--max-point-s",
        type=_positive_float,
        default=60.0,
        help="longest measured part of a point (default 60 s)",
    )
    p.add_argument(
        "--max-points", type=int, default=30, help="point budget (peak: 48, tune: 16 each)"
    )
    p.add_argument(
        "--locust-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to each point's locust run (repeatable)",
    )


def _peak_config(args: argparse.Namespace, repeats: int) -> Any:
    from harness.peak.runner import PeakConfig

    return PeakConfig(
        slo_p99_ms=args.slo_p99_ms,
        max_error_rate=args.max_error_rate,
        confidence=args.confidence,
        tolerance=args.tolerance,
        repeats=repeats,
        start_rps=args.start_rps,
        warmup_s=args.warmup_s,
        min_point_s=args.min_point_s,
        max_point_s=args.max_point_s,
        max_points=args.max_points,
        precision=_precision(args),
        searches=getattr(args, "searches", 1),
    ).validate()


def _precision(args: argparse.Namespace) -> float | None:
    """harness peak's refine target: --precision, 0.15 by default for one search, none
    (0 or unset) with several (their spread is the interval)."""
    if not hasattr(args, "precision"):  # harness tune: no refine phase
        return None
    given = args.precision
    if given is None:
        return 0.15 if getattr(args, "searches", 0) == 1 else None
    return given or None


def _add_repeats(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--repeats",
        type=int,
        default=default,
        help=f"outcomes per edge rate: L must meet the SLO and U miss it in every one "
        f"(default {default}; 1: no edge repeats)",
    )


def _add_peak(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "peak",
        help="the highest open-loop rate at which p99 (over all requests) and errors meet an SLO",
        description="Bracketing then bisection over open-loop Poisson rates, each point one "
        "headless Locust run judged by the harness (p99 over all requests with MLPerf early "
        "stopping, error rate, validity); the edge measured --repeats times for an interval. "
        "Writes results.json, summary.md, report.html. Exit 0 a peak, 1 no rate met the SLO "
        "or the server died during a point, 2 usage, 3 the generator (not the server) was the "
        "limit or the search was cut short.",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--sut-cmd",
        default=None,
        help="start this server once, kept running between points; {port} is filled in "
        "(default: the bundled reference server)",
    )
    g.add_argument("--target", default=None, metavar="URL", help="attach to a running server")
    p.add_argument("--sut-pid", type=int, default=None, help="with --target: its pid")
    p.add_argument("--sut-cores", default=None, help="cores for a started server, e.g. 1")
    p.add_argument("--model", default=None, help="model name (default: the server's own)")
    p.add_argument("--out", default="harness-results/peak", help="output directory")
    # 3: at 4 the edge on a shared 2-core box is mixed often enough that one run
    # of two spent its 30-point budget before the repeats held (interval 44 % wide)
    _add_repeats(p, 3)
    _add_peak_options(p)
    p.add_argument(
        "--searches",
        type=int,
        default=6,
        help="independent searches, each on a freshly started server (the same server with "
        "--target); the peak is their mean and its 95 %% interval Student's t over them, so "
        "it holds how far the peak moves between server lifetimes and over the run's "
        "minutes (default 6; 1: one search, its interval from its own points)",
    )
    p.add_argument(
        "--precision",
        type=_fraction,
        default=None,
        help="with --searches 1: after the edge repeats, measure near the fitted edge until "
        "its 95 %% interval is at most this fraction of the peak (default 0.15; 0: no "
        "refine phase)",
    )
    # the refine phase needs points: a gradual edge (outcomes mixed over +-10 %) takes
    # ~25-45 of them to reach 15 % (tests/test_peak_edge_fit.py)
    p.set_defaults(handler=_run_peak, max_points=48)


def _peak_target(args: argparse.Namespace) -> dict[str, Any]:
    import shlex

    if args.target is None and args.sut_pid is not None:
        raise ConfigError("--sut-pid needs --target URL (the server's address)")
    if args.target is not None and not args.target.startswith(("http://", "https://")):
        raise ConfigError(
            f"--target has value {args.target!r}; expected an http:// URL such as "
            "http://127.0.0.1:8000"
        )
    sut_cmd = args.sut_cmd
    if sut_cmd is None and args.target is None:
        sut_cmd = f"{shlex.quote(sys.executable)} -m reference_server --port {{port}}"
    return {
        "sut_cmd": sut_cmd,
        "url": args.target,
        "sut_pid": args.sut_pid,
        "sut_cores": args.sut_cores,
        "model": args.model,
        "extra_args": tuple(args.locust_arg),
    }


def _run_peak(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.peak.report import peak_sentence
    from harness.peak.runner import run_peak

    cfg = _peak_config(args, args.repeats)
    target = _peak_target(args)
    out = Path(args.out)
    doc, code = run_peak(cfg, out, **target, show=lambda t: print(t, file=sys.stderr, flush=True))
    print(
        f"{peak_sentence(doc['peak'])}\n{out / 'summary.md'} · {out / 'report.html'} · exit {int(code)}"
    )
    return int(code)


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="find the server configuration with the highest peak under an SLO",
        description="For each configuration of --space filled into --sut-cmd: start the "
        "server, find its peak under the SLO (as `harness peak`, with --repeats), record "
        "CPU per request and RSS; quick mode hill-climbs from --default and prunes dominated "
        "directions (Triton model_analyzer's quick search), --brute measures every "
        "configuration. A separation that alone keeps a configuration out of rank 1 and is "
        "inside --prune-margin is measured again head to head (the two alternately, each "
        "point on a fresh server), so a drift over minutes cannot make it. "
        "Ranks, writes results.json, summary.md, report.html (a throughput-p99 "
        "Pareto plot), runs the quick checklist on the winner. Exit: the winner's checklist "
        "verdict (0 pass, 1 fail: then nothing is recommended, 3 invalid, 4 not judged); 1 if "
        "no configuration met the SLO or every one's server died; 3 if none was measured (its "
        "search stopped by the load generator, the point budget or the ceiling) or one not "
        "measured may beat the winner. Resumable: run it again with the same arguments and "
        "--out to continue.",
    )
    p.add_argument(
        "--sut-cmd",
        required=True,
        help="server command template: {port} and one {NAME} per --space, e.g. "
        "'python -m reference_server --port {port} --max-batch-size {max_batch}'",
    )
    p.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="a dimension and its values, in order (repeatable)",
    )
    p.add_argument(
        "--default",
        default=None,
        metavar="NAME=V,...",
        help="the configuration to compare with and to start the quick search from "
        "(default: the first value of each --space)",
    )
    p.add_argument(
        "--append-for",
        action="append",
        default=[],
        metavar="NAME=V,...:ARGS",
        help="add ARGS to the command of the configurations NAME=V selects (repeatable), "
        "e.g. a planted regression 'max_batch=8:--fault no-batching'",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--brute", action="store_true", help="measure every configuration")
    mode.add_argument("--quick", action="store_true", help="hill-climb and prune (default)")
    p.add_argument(
        "--prune-margin",
        type=_fraction,
        default=0.2,
        help="a neighbour this much below its origin prunes its direction in quick mode; "
        "a separation closer than this is measured again head to head (0.2)",
    )
    p.add_argument("--sut-cores", default=None, help="cores for each server, e.g. 1")
    p.add_argument("--model", default=None, help="model name (default: the server's own)")
    p.add_argument("--out", default="harness-results/tune", help="output directory (+ state)")
    p.add_argument(
        "--fresh", action="store_true", help="ignore (delete) a state file left in --out"
    )
    p.add_argument(
        "--no-checklist",
        action="store_true",
        help="do not run `harness acceptance --quick` on the recommended configuration",
    )
    _add_repeats(p, 3)
    _add_peak_options(p)
    # a coarser bracket and shorter points than `harness peak`: the ranking needs each
    # configuration's peak to 10 %. The edge repeats stay: one unlucky point (a p99 of
    # 158 ms against a 150 ms SLO at 416 req/s on a server that held 552) would otherwise
    # cap a configuration's peak for good, and reorder the ranking from tune to tune
    p.set_defaults(handler=_run_tune, tolerance=0.1, max_points=16, max_point_s=20.0)


def _run_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness.peak.report import tune_sentence
    from harness.peak.tune import Space, TuneConfig, run_tune

    pc = _peak_config(args, args.repeats)
    space = Space.parse(args.space, args.sut_cmd)
    default = (
        space.parse_config(args.default, "--default")
        if args.default
        else tuple((n, v[0]) for n, v in space.dims)
    )
    append = []
    for spec in args.append_for:
        selector, sep, extra = spec.partition(":")
        if not sep or not extra.strip():
            raise ConfigError(
                f"--append-for has value {spec!r}; expected NAME=V,...:ARGS such as "
                "'max_batch=8:--fault no-batching'"
            )
        append.append((tuple(space.partial(selector, "--append-for").items()), extra.strip()))
    if not 0 < args.prune_margin < 1:
        raise ConfigError(f"--prune-margin has value {args.prune_margin}; expected (0, 1)")
    tc = TuneConfig(
        template=args.sut_cmd,
        space=space,
        default=default,
        peak=pc,
        mode="brute" if args.brute else "quick",
        prune_margin=args.prune_margin,
        append=tuple(append),
        sut_cores=args.sut_cores,
        model=args.model,
        extra_args=tuple(args.locust_arg),
    )
    out = Path(args.out)
    doc, code = run_tune(
        tc,
        out,
        checklist=not args.no_checklist,
        fresh=args.fresh,
        show=lambda t: print(t, file=sys.stderr, flush=True),
    )
    print(
        f"{tune_sentence(doc['tune'])}\n{out / 'summary.md'} · {out / 'report.html'} · exit {int(code)}"
    )
    return int(code)


# --- entry point ------------------------------------------------------------------------

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_acceptance,
    _add_run,
    _add_sample,
    _add_report,
    _add_judge,
    _add_compare,
    _add_agent,
    _add_peak,
    _add_tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harness",
        description="Load-testing and chaos harness for ML inference servers.",
    )
    from harness import __version__

    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``harness = harness.cli:main``). Returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
