"""``harness sample``: the sampler alone, on a running server (also the harness's own
sampler subprocess: ``harness.collectors.child``)."""

from __future__ import annotations

import argparse
import sys
import threading

from harness.cli.common import Subparsers, positive_float
from harness.errors import ExitCode
from harness.primitives import trapped_signals


def add_sample(sub: Subparsers) -> None:
    p = sub.add_parser(
        "sample",
        help="pidstat-style sampling of a running server (threads, memory, fds, CPU)",
        description="Sample a process tree (per-thread CPU like `pidstat -t`, RSS/USS/PSS, "
        "threads, fds), system CPU per core and optionally a /metrics URL; stream CSVs to "
        "--out. Runs until --duration or Ctrl-C.",
    )
    p.add_argument(
        "--sut-pid",
        "--pid",
        dest="pid",
        type=int,
        default=None,
        help="pid of the server to watch (--pid is the same option)",
    )
    p.add_argument(
        "--pid-file",
        default=None,
        help="file holding the server's pid; followed when the server is restarted",
    )
    p.add_argument("--out", required=True, help="directory for process.csv, threads.csv, …")
    p.add_argument("--interval", type=positive_float, default=1.0, help="seconds (default 1)")
    p.add_argument(
        "--duration", type=positive_float, default=None, help="seconds (default: until Ctrl-C)"
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
        "--uss-every", type=positive_float, default=10.0, help="seconds between USS/PSS reads"
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
    # SIGINT/SIGTERM set ``stop`` (the session then closes its files) instead of killing us
    with trapped_signals(lambda _signum: stop.set()):
        meta = session.run()
    print(
        f"sampled pid {meta['pid']}: {meta['ticks']} ticks, {meta['missed_ticks']} missed"
        f"{' (target exited)' if meta['target_exited'] else ''}"
        f"{' (its parent exited)' if meta['parent_exited'] else ''} → {config.out_dir}",
        file=sys.stderr,
    )
    return ExitCode.PASS
