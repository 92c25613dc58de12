"""``harness acceptance`` and ``harness run``: the options, typed into a
``harness.acceptance.PlanRequest``; the plan's live progress and its verdict line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.common import (
    SUT_CMD_HELP,
    Subparsers,
    add_checklist,
    add_deployment_options,
    add_forwarded_load_options,
    add_locust_arg,
    add_model,
    add_protocol,
    add_sut_cores,
    add_sut_pid,
    add_target_url,
    forwarded_load_args,
    positive_float,
    to_stderr,
)

if TYPE_CHECKING:
    from harness.acceptance import Plan, PlanRequest


def _add_target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "target",
        "default: start the bundled reference server on a free loopback port",
    )
    g.add_argument("--sut-cmd", default=None, help=SUT_CMD_HELP)
    add_target_url(g)
    add_sut_pid(g)
    add_model(g)
    add_protocol(g)
    add_sut_cores(g)
    add_deployment_options(g)
    p.add_argument("--out", default=None, help="output directory (default: harness-results/NAME)")
    add_checklist(p)
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DTYPE:SHAPE[:LOW..HIGH]",
        help="a model input, when the server's metadata lists none or to set its values' "
        "half-open range (repeatable), e.g. --input input:FP32:1,256 or "
        "--input ids:INT64:1,128:0..30522",
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
    add_forwarded_load_options(p)
    add_locust_arg(p, "scenario's", ", e.g. --locust-arg=--calibrate-s=10")
    p.add_argument(
        "--capacity",
        choices=("probe", "peak"),
        default="probe",
        help='what "0.6x" multiplies: probe = the 5 s closed-loop capacity probe (default); '
        "peak = `harness peak`'s rate under --capacity-slo-p99-ms, searched first",
    )
    p.add_argument(
        "--capacity-slo-p99-ms",
        type=positive_float,
        default=500.0,
        help="with --capacity=peak: the p99 SLO (ms) of that search (default 500, the "
        "packaged steady_state SLO)",
    )
    p.add_argument(
        "--retry-invalid",
        type=int,
        default=2,
        metavar="N",
        help="run a scenario up to N more times when it is invalid only because the machine "
        "was disturbed (requests left late, another tenant's CPU); every attempt is kept "
        "and reported (default 2; 0 = never)",
    )
    p.add_argument(
        "--no-html-report",
        dest="html_report",
        action="store_false",
        help="write results.json, summary.md and junit.xml but not report.html (its plots "
        "cost about a second a run; `harness report DIR` draws it later from results.json)",
    )


def add_acceptance(sub: Subparsers) -> None:
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
    p.set_defaults(handler=_run_acceptance, exit_at_end=True)


def add_run(sub: Subparsers) -> None:
    p = sub.add_parser(
        "run",
        help="run one scenario (a name from scenarios/ or a .toml path)",
        description="Run one scenario as a headless Locust run, then judge and report.",
    )
    p.add_argument("scenario", help="e.g. spike, or path/to/my_scenario.toml")
    p.add_argument(
        "--duration", type=positive_float, default=None, help="total seconds (stages scaled)"
    )
    _add_target_options(p)
    p.set_defaults(handler=_run_run, exit_at_end=True)


def add_locust_options(sub: Subparsers) -> None:
    p = sub.add_parser(
        "locust-options",
        help="list the options the harness adds to Locust (locust -f locustfiles/inference.py)",
        description="Print the harness's Locust options and their HARNESS_* environment "
        "variables. Locust prints its own --help before it loads a locustfile, so "
        "`locust -f locustfiles/inference.py --help` cannot show them.",
    )
    p.set_defaults(handler=_print_locust_options)


def add_where(sub: Subparsers) -> None:
    p = sub.add_parser(
        "where",
        help="print where the shipped scenarios and locustfiles are installed",
        description="Print the path of the shipped scenarios directory and locustfiles, "
        'e.g. locust -f "$(harness where locustfile)" or '
        'cp "$(harness where scenarios)/spike.toml" my_spike.toml.',
    )
    p.add_argument(
        "what",
        nargs="?",
        choices=("scenarios", "locustfile", "llm-locustfile"),
        help="print this one path alone (default: all three, one per line with its name)",
    )
    p.set_defaults(handler=_print_where)


def _print_where(args: argparse.Namespace) -> int:
    from harness.packaged import locustfile, packaged_dir

    paths = {
        "scenarios": packaged_dir("scenarios"),
        "locustfile": locustfile("inference"),
        "llm-locustfile": locustfile("llm"),
    }
    if args.what:
        print(paths[args.what])
    else:
        for name, path in paths.items():
            print(f"{name:<15} {path}")
    return 0


def _print_locust_options(args: argparse.Namespace) -> int:
    import configargparse

    from harness.load.options import add_options

    parser = configargparse.ArgumentParser(
        prog="locust -f locustfiles/inference.py",
        usage="locust -f locustfiles/inference.py [locust options] [harness options]",
        add_help=False,
        add_env_var_help=True,
        add_config_file_help=False,
    )
    add_options(parser)
    parser.print_help()
    return 0


def plan_request(
    args: argparse.Namespace, scenarios: tuple[str, ...], default_out: str
) -> PlanRequest:
    """The options of ``harness acceptance`` / ``harness run``, typed for the library."""
    from harness.acceptance import PlanRequest

    return PlanRequest(
        scenarios=scenarios,
        out_dir=Path(args.out or default_out),
        single=getattr(args, "scenario", None) is not None,
        mode=args.mode,
        duration_s=getattr(args, "duration", None),
        sut_cmd=args.sut_cmd,
        url=args.target,
        sut_pid=args.sut_pid,
        model=args.model,
        protocol=args.protocol,
        sut_cores=args.sut_cores,
        headers=tuple(args.header) if args.header is not None else None,
        ca_cert=args.ca_cert,
        insecure=args.insecure,
        metrics_url=args.metrics_url,
        agent_url=args.agent,
        agent_token=args.agent_token,
        agent_ca_cert=args.agent_ca_cert,
        checklist=Path(args.checklist) if args.checklist else None,
        inputs=tuple(args.input),
        sample_request=args.sample_request,
        allow_skip=tuple(args.allow_skip),
        locust_args=(*forwarded_load_args(args), *tuple(args.locust_arg)),
        capacity=args.capacity,
        capacity_slo_p99_ms=args.capacity_slo_p99_ms,
        retry_invalid=args.retry_invalid,
        html_report=args.html_report,
    )


def plan_from(args: argparse.Namespace, scenarios: tuple[str, ...], default_out: str) -> Plan:
    """The checked plan of these options (progress of a --capacity=peak search on stderr)."""
    from harness.acceptance import make_plan

    return make_plan(plan_request(args, scenarios, default_out), show=to_stderr)


def _execute(plan: Plan) -> int:
    from harness.acceptance import run_plan

    live = LiveLine(sys.stderr)
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
    from harness.acceptance import acceptance_scenarios

    names = acceptance_scenarios(args.mode, args.scenarios, args.protocol)
    return _execute(plan_from(args, names, "harness-results/acceptance"))


def _run_run(args: argparse.Namespace) -> int:
    return _execute(
        plan_from(args, (args.scenario,), f"harness-results/{Path(args.scenario).stem}")
    )


class LiveLine:
    """One progress line rewritten in place on a terminal; plain lines otherwise (CI logs)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.last_plain = 0.0

    def show(self, text: str) -> None:
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
