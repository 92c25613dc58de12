"""The ``harness`` command. The only place that prints errors and picks exit codes.

Each subcommand is a pair: ``_add_<name>(subparsers)`` declares its options and sets
``handler``; the handler takes the parsed namespace and returns an exit code. To add a
subcommand (``acceptance``, ``run``, ``report``, ``compare``), write the pair and list the
``_add_`` function in ``SUBCOMMANDS``. Library code below the CLI gets frozen config
objects, never the namespace.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from harness.errors import HarnessError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INVALID = 3


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line naming the fix (no usage dump on stderr)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    )
    stop = threading.Event()

    def live(text: str) -> None:
        print(text, flush=True)

    session = SamplingSession(config, stop=stop, live=live if args.live else None)
    with _stop_on_signals(stop):
        meta = session.run()
    print(
        f"sampled pid {meta['pid']}: {meta['ticks']} ticks, {meta['missed_ticks']} missed"
        f"{' (target exited)' if meta['target_exited'] else ''} → {config.out_dir}",
        file=sys.stderr,
    )
    return EXIT_OK


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


# --- entry point ------------------------------------------------------------------------

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_add_sample,)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harness",
        description="Load-testing and chaos harness for ML inference servers.",
    )
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
        print(f"harness: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
