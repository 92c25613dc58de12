"""The ``harness`` command. The only place that prints errors and picks exit codes.

One module per command family; each subcommand is a pair: ``add_<name>(subparsers)``
declares its options and sets ``handler``; the handler takes the parsed namespace and
returns an exit code. To add a subcommand, write the pair in its family's module and list
the ``add_`` function in ``SUBCOMMANDS``. What several commands share (the parser, the
argument types, the options and their checks) is ``common``. Library code below the CLI
gets typed plans and configs (``harness.acceptance.PlanRequest``, ``PeakConfig``, …),
never the namespace.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from harness.cli.agent import add_agent
from harness.cli.common import Parser, Subparsers
from harness.cli.peak import add_peak, add_tune
from harness.cli.results import add_compare, add_judge, add_report
from harness.cli.run import add_acceptance, add_locust_options, add_run, add_where
from harness.cli.sample import add_sample
from harness.errors import ExitCode, HarnessError

SUBCOMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_acceptance,
    add_run,
    add_locust_options,
    add_where,
    add_sample,
    add_report,
    add_judge,
    add_compare,
    add_agent,
    add_peak,
    add_tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="harness",
        description="Load-testing and chaos harness for ML inference servers.",
    )
    from harness import __version__

    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``harness = harness.cli:main``). Returns the exit code.

    As the process's own command (``argv`` None) of a subcommand that sets
    ``exit_at_end`` (``run``, ``acceptance``: every file written and every child process
    reaped when its handler returns), the process ends here with that code, its output
    flushed, without Python's finalisation (freeing numpy, scipy and matplotlib: about
    0.25 s of every run)."""
    args = build_parser().parse_args(argv)
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
