"""``harness peak`` (the highest open-loop rate under an SLO) and ``harness tune`` (the
server configuration with the highest peak): their options, typed into
``harness.peak``'s configs."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from harness.cli.common import (
    Subparsers,
    add_deployment_options,
    add_locust_arg,
    add_model,
    add_protocol,
    add_sut_cores,
    add_sut_pid,
    add_target_url,
    check_attach,
    check_sut_cmd,
    fraction,
    positive_float,
    positive_ms,
    to_stderr,
)
from harness.errors import ConfigError
from harness.locust_run import default_sut_cmd


def _add_peak_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slo-p99-ms",
        type=positive_ms,
        default=None,
        help="the latency SLO: p99 over all requests (failures count as over it), in ms; "
        "required but with --protocol openai, which is judged in tokens",
    )
    p.add_argument(
        "--slo-ttft-ms",
        type=positive_ms,
        default=None,
        help="--protocol openai: the p99 time to first token a point must hold, in ms "
        "(default 2000, MLPerf's Server bound for an 8B model; interactive: 500)",
    )
    p.add_argument(
        "--slo-tpot-ms",
        type=positive_ms,
        default=None,
        help="--protocol openai: the p99 time per output token a point must hold, in ms "
        "(default 100, MLPerf's Server bound for an 8B model; interactive: 30)",
    )
    p.add_argument(
        "--max-error-rate",
        type=fraction,
        default=0.01,
        help="failed + dropped share a point may have (default 0.01)",
    )
    p.add_argument(
        "--confidence",
        type=fraction,
        default=0.95,
        help="early-stopping confidence of each point's p99 verdict; sets the requests per "
        "point (default 0.95: 1182)",
    )
    p.add_argument(
        "--tolerance",
        type=fraction,
        default=0.05,
        help="stop bisecting when the bracket is this fraction wide (default 0.05)",
    )
    p.add_argument(
        "--start-rps",
        type=positive_float,
        default=None,
        help="first rate to measure (default: half the harness's capacity probe, in "
        "streams of the workload with --protocol openai)",
    )
    p.add_argument(
        "--warmup-s",
        type=fraction,
        default=3.0,
        help="seconds of each point not judged (default 3)",
    )
    p.add_argument(
        "--min-point-s",
        type=positive_float,
        default=5.0,
        help="shortest measured part of a point (default 5 s)",
    )
    p.add_argument(
        "--max-point-s",
        type=positive_float,
        default=60.0,
        help="longest measured part of a point (default 60 s)",
    )
    p.add_argument(
        "--max-points", type=int, default=30, help="point budget (peak: 48, tune: 16 each)"
    )
    add_locust_arg(p, "point's")


def _peak_config(args: argparse.Namespace, repeats: int) -> Any:
    from harness import protocols
    from harness.peak.config import PeakConfig

    if args.protocol is not None:
        protocols.get(args.protocol)  # before anything is written or started
    slo_p99_ms, slo_tpot_ms = _slos(args)
    return PeakConfig(
        slo_p99_ms=slo_p99_ms,
        slo_tpot_ms=slo_tpot_ms,
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


# MLPerf Inference's Server-scenario bounds for Llama-3.1-8B, as llm.ttft_p99 and
# llm.tpot_p99 take them (docs/llm-metrics.md)
DEFAULT_SLO_TTFT_MS = 2000.0
DEFAULT_SLO_TPOT_MS = 100.0


def _slos(args: argparse.Namespace) -> tuple[float, float | None]:
    """(the p99 bound a point's curve is drawn against, the TPOT bound or None): in
    tokens for --protocol openai, else the latency SLO; an SLO of the other kind is a
    usage error naming the right one."""
    if args.protocol == "openai":
        if args.slo_p99_ms is not None:
            raise ConfigError(
                "--slo-p99-ms judges a request's whole latency; an OpenAI-compatible "
                "server is judged in tokens: give --slo-ttft-ms and --slo-tpot-ms"
            )
        ttft = args.slo_ttft_ms if args.slo_ttft_ms is not None else DEFAULT_SLO_TTFT_MS
        tpot = args.slo_tpot_ms if args.slo_tpot_ms is not None else DEFAULT_SLO_TPOT_MS
        return ttft, tpot
    if args.slo_ttft_ms is not None or args.slo_tpot_ms is not None:
        raise ConfigError(
            "--slo-ttft-ms and --slo-tpot-ms judge token streams (--protocol openai); "
            "this server is judged by --slo-p99-ms"
        )
    if args.slo_p99_ms is None:
        raise ConfigError("--slo-p99-ms is required: the p99 latency a point must hold, e.g. 100")
    return args.slo_p99_ms, None


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


def add_peak(sub: Subparsers) -> None:
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
    add_target_url(g)
    add_sut_pid(p)
    add_sut_cores(p)
    add_model(p)
    add_protocol(p)
    add_deployment_options(p)
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
        type=fraction,
        default=None,
        help="with --searches 1: after the edge repeats, measure near the fitted edge until "
        "its 95 %% interval is at most this fraction of the peak (default 0.15; 0: no "
        "refine phase)",
    )
    # the refine phase needs points: a gradual edge (outcomes mixed over +-10 %) takes
    # ~25-45 of them to reach 15 % (tests/test_peak_edge_fit.py)
    p.set_defaults(handler=_run_peak, max_points=48)


def _peak_target(args: argparse.Namespace) -> dict[str, Any]:
    from harness.acceptance.plan import agent_of, deployment_of
    from harness.load.preflight import check_transport
    from harness.locust_run import Target, check_target_url

    check_attach(args.target, args.sut_pid)
    if args.target is not None:
        check_target_url(args.target)
    check_sut_cmd(args.sut_cmd)
    sut_cmd = args.sut_cmd
    if sut_cmd is None and args.target is None:
        sut_cmd = (
            default_sut_cmd(protocol="openai")  # the bundled LLM server
            if args.protocol == "openai"
            else f"{shlex.quote(sys.executable)} -m harness_reference_server --port {{port}}"
        )
    deployment = {
        **deployment_of(args.header, args.ca_cert, args.insecure, args.metrics_url),
        **agent_of(args.agent, args.agent_token, args.target, args.sut_pid, args.agent_ca_cert),
    }
    if args.target is not None:  # https: one handshake now, or exit 2 naming --ca-cert
        check_transport(args.target, Target(url=args.target, **deployment).client())
    return {
        "sut_cmd": sut_cmd,
        "url": args.target,
        "sut_pid": args.sut_pid,
        "sut_cores": args.sut_cores,
        "model": args.model,
        "protocol": args.protocol,
        "extra_args": tuple(args.locust_arg),
        "deployment": deployment,
    }


def _run_peak(args: argparse.Namespace) -> int:
    from harness.peak.runner import run_peak
    from harness.report.peak import peak_sentence

    cfg = _peak_config(args, args.repeats)
    target = _peak_target(args)
    out = Path(args.out)
    doc, code = run_peak(cfg, out, **target, show=to_stderr)
    print(
        f"{peak_sentence(doc['peak'])}\n{out / 'summary.md'} · {out / 'report.html'} · exit {int(code)}"
    )
    return int(code)


def add_tune(sub: Subparsers) -> None:
    p = sub.add_parser(
        "tune",
        help="find the server configuration with the highest peak under an SLO",
        description="For each configuration of --space filled into --sut-cmd: start the "
        "server, find its peak under the SLO (as `harness peak`, with --repeats), record "
        "CPU per request and RSS; --hill-climb (the default) climbs from --default and prunes dominated "
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
        "'python -m harness_reference_server --port {port} --max-batch-size {max_batch}'",
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
    mode.add_argument(
        "--hill-climb", action="store_true", help="hill-climb and prune (the default)"
    )
    p.add_argument(
        "--prune-margin",
        type=fraction,
        default=0.2,
        help="a neighbour this much below its origin prunes its direction in the hill climb; "
        "a separation closer than this is measured again head to head (0.2)",
    )
    add_sut_cores(p)
    add_model(p)
    add_protocol(p)
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
    from harness.peak.tune import Space, TuneConfig, run_tune
    from harness.report.tune import tune_sentence

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
        protocol=args.protocol,
        extra_args=tuple(args.locust_arg),
    )
    out = Path(args.out)
    doc, code = run_tune(
        tc,
        out,
        checklist=not args.no_checklist,
        fresh=args.fresh,
        show=to_stderr,
    )
    print(
        f"{tune_sentence(doc['tune'])}\n{out / 'summary.md'} · {out / 'report.html'} · exit {int(code)}"
    )
    return int(code)
