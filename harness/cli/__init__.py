"""The ``harness`` command. The only place that prints errors and picks exit codes.

One module per command family; each subcommand is a pair: ``add_<name>(subparsers)``
declares its options and sets ``handler``; the handler takes the parsed namespace and
returns an exit code. To add a subcommand, write the pair in its family's module and list
it in ``SUBCOMMANDS`` (its name, module and ``add_`` function). What several commands
share (the parser, the argument types, the options and their checks) is ``common``.
Library code below the CLI gets typed plans and configs (``harness.acceptance.PlanRequest``,
``PeakConfig``, …), never the namespace.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from harness.cli.common import Parser, Subparsers
from harness.errors import ExitCode, HarnessError

# (subcommand, module, its add_ function), in the order ``harness --help`` lists them. The
# modules are imported when the parser is built; ``harness sample`` (the run's sampler,
# started 0.3 s before the load's t = 0) builds only its own, so it does not import the
# load, peak and report machinery before its first read (docs/performance.md, "A run's
# fixed cost").
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("acceptance", "harness.cli.run", "add_acceptance"),
    ("run", "harness.cli.run", "add_run"),
    ("locust-options", "harness.cli.run", "add_locust_options"),
    ("where", "harness.cli.run", "add_where"),
    ("sample", "harness.cli.sample", "add_sample"),
    ("report", "harness.cli.results", "add_report"),
    ("judge", "harness.cli.results", "add_judge"),
    ("compare", "harness.cli.results", "add_compare"),
    ("agent", "harness.cli.agent", "add_agent"),
    ("peak", "harness.cli.peak", "add_peak"),
    ("tune", "harness.cli.peak", "add_tune"),
)


_IMPORT_ORDER = (
    "harness.cli.agent",
    "harness.cli.peak",
    "harness.cli.results",
    "harness.cli.run",
    "harness.cli.sample",
)


def _adder(module: str, function: str) -> Callable[[Subparsers], None]:
    adder: Callable[[Subparsers], None] = getattr(importlib.import_module(module), function)
    return adder


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``harness`` parser: every subcommand, or only the one named ``only``."""
    parser = Parser(
        prog="harness",
        description="Load-testing and chaos harness for ML inference servers.",
    )
    from harness import __version__

    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    if only is None:
        # every command's module, imported in the order they always were (Locust's gevent
        # patching among them), so the other commands run in the process they were
        # measured in; importing only its own changed no capacity probe (docs/performance.md)
        for module in _IMPORT_ORDER:
            importlib.import_module(module)
    for name, module, function in SUBCOMMANDS:
        if only is None or name == only:
            _adder(module, function)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``harness = harness.cli:main``). Returns the exit code.

    As the process's own command (``argv`` None) of a subcommand that sets
    ``exit_at_end`` (``run``, ``acceptance``: every file written and every child process
    reaped when its handler returns), the process ends here with that code, its output
    flushed, without Python's finalisation (freeing numpy, scipy and matplotlib: about
    0.25 s of every run)."""
    words = sys.argv[1:] if argv is None else list(argv)
    first = words[0] if words else None
    # the sampler alone builds only its own parser: a process of its own, whose first
    # read must come before the load's t = 0; every other command runs in the process
    # every command's imports make
    only = "sample" if first == "sample" else None
    args = build_parser(only).parse_args(argv)
    code = _handle(args)
    if argv is None and getattr(args, "exit_at_end", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _handle(args: argparse.Namespace) -> int:
    try:
        return int(args.handler(args))
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)


__all__ = ["SUBCOMMANDS", "build_parser", "main"]
