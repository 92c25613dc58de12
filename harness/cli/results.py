"""``harness report``, ``harness judge`` and ``harness compare``: results already written."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import Subparsers, add_checklist
from harness.errors import ExitCode


def add_report(sub: Subparsers) -> None:
    p = sub.add_parser(
        "report",
        help="re-render report.html, junit.xml and summary.md from DIR/results.json (a "
        "harness peak or tune directory: its summary.md and report.html)",
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
    doc = load_document(Path(args.dir) / "results.json")
    if doc.get("tune"):  # a harness tune directory: its own exit code, as the tune gave it
        from harness.peak.tune import exit_code as tune_exit

        return int(tune_exit(doc["tune"]))
    if doc.get("peak"):  # a harness peak directory: likewise
        from harness.peak.answer import exit_code as peak_exit

        return int(peak_exit(doc["peak"]))
    return exit_code_for(doc)


def add_judge(sub: Subparsers) -> None:
    p = sub.add_parser(
        "judge",
        help="judge DIR/results.json (checks, validity, verdict), rewrite it, render the reports",
    )
    p.add_argument("dir", help="a directory holding results.json")
    add_checklist(p)
    p.set_defaults(handler=_run_judge)


def _run_judge(args: argparse.Namespace) -> int:
    """The same judging as the end of a run (``harness.finish``): for results written by a
    run that was killed before it judged them, or judged again under another checklist."""
    from harness.finish import finish, verdict_line

    doc, code = finish(args.dir, args.checklist)
    print(f"{verdict_line(doc)} (exit {int(code)})")
    return code


def add_compare(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compare",
        help="regression verdict between two runs (exit 1 if NEW regressed)",
    )
    p.add_argument("base", help="results directory of the baseline run")
    p.add_argument("new", help="results directory of the new run")
    p.add_argument(
        "--force", action="store_true", help="compare even if the machines' metadata differ"
    )
    p.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="METRIC=REL[:FLOOR]",
        help="noise margin of a metric (repeatable): a change is real beyond max(FLOOR, REL x "
        "base); metrics p50_ms, p99_ms, throughput_rps, error_rate, rss_slope_mib_min, check "
        "(defaults and why: docs/outputs.md), e.g. --margin p99_ms=0.3:2",
    )
    p.add_argument("--markdown", default=None, help="also write the comparison table here")
    p.set_defaults(handler=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from harness.report.compare import Margins, compare_dirs, parse_margin

    margins = Margins()
    for text in args.margin:
        margins = parse_margin(text, margins)
    comparison = compare_dirs(args.base, args.new, force=args.force, margins=margins)
    print(comparison.to_text(), end="")
    if args.markdown:
        Path(args.markdown).write_text(comparison.to_markdown())
    by_verdict = {"regressed": ExitCode.FAIL, "invalid": ExitCode.INVALID}
    return by_verdict.get(comparison.verdict, ExitCode.PASS)
