"""Render docs/detection.md: defect → scenario → check → measured value → threshold → caught?

Either runs the detection matrix itself (every case of harness/testing/detection_cases.py, in order,
the healthy steady-state run first because its capacity sizes the leaks), or reads the
result directories a test run left behind::

    python bench/detection_table.py                       # run the matrix (~15 min)
    python bench/detection_table.py --cases stall,leak-fds
    HARNESS_DETECTION_OUT=/tmp/det pytest -m slow tests/test_detection.py
    python bench/detection_table.py --from /tmp/det       # render what the tests measured

The page is generated; edit this script, not the page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.testing.detection import (  # noqa: E402 — needs the repo root on sys.path
    BY_NAME,
    CAPACITY_CASE,
    CASES,
    NOT_PLANTABLE,
    CaseRun,
    DetectionCase,
    capacity_of,
    judge,
    run_case,
)


def _fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _check(doc: Mapping, check_id: str) -> Mapping | None:
    for sc in doc.get("scenarios") or []:
        for c in sc.get("checks") or []:
            if c.get("id") == check_id:
                return c
    return None


def _rows(run: CaseRun) -> list[str]:
    """One row per check the case must see fail (one for a healthy control)."""
    case = run.case
    problems = judge(case, run.exit_code, run.doc)
    if case.expect_pass:
        outcome = "passes ✓" if not problems else "**FAILED** ✗"
    else:
        outcome = "caught ✓" if not problems else "**missed** ✗"
    fault = case.fault_spec(_capacity_hint(run)) if case.fault else None
    planted = f"`--fault {fault}`" if fault else ""
    if case.server_args:
        planted = (planted + " " if planted else "") + f"`{' '.join(case.server_args)}`"
    defect = case.defect + (" *(generalisation)*" if case.generalisation else "")
    also = [
        f"{x['id']}"
        for sc in run.doc.get("scenarios") or []
        for x in sc.get("checks") or []
        if x.get("passed") is False and x.get("id") not in case.intended
    ]
    note = "; ".join(problems) if problems else ("also failed: " + ", ".join(also) if also else "")
    rows = []
    for check_id in case.intended:
        c = _check(run.doc, check_id) or {}
        unit = c.get("unit") or ""
        measured = _fmt(c.get("value"))
        if c.get("skipped"):
            measured = f"skipped: {c['skipped']}"
        elif c.get("value") is None and c.get("passed") is False:
            measured = "never"
        threshold = f"{c.get('op', '')} {_fmt(c.get('threshold'))} {unit}".strip()
        cells = [
            defect,
            planted or "—",
            f"`{case.scenario}`",
            f"`{check_id}`",
            measured if c.get("skipped") or measured == "never" else f"{measured} {unit}".strip(),
            threshold,
            outcome,
            f"exit {run.exit_code}, {run.wall_s:.0f} s",
            note.replace("|", "/").replace("\n", " ")[:300],
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _coverage() -> list[str]:
    """Which defect cases fail each check of the checklist (from the case list)."""
    from harness.checks import CHECK_IDS

    out = [
        "## Coverage",
        "",
        "Every check of the checklist and the defect cases that must fail it:",
        "",
        "| check | failed by |",
        "|---|---|",
    ]
    for cid in CHECK_IDS:
        names = [c.name for c in CASES if not c.expect_pass and cid in c.intended]
        cell = ", ".join(f"`{n}`" for n in names) or f"— {NOT_PLANTABLE.get(cid, '**none**')}"
        out.append(f"| `{cid}` | {cell} |")
    return out


def _capacity_hint(run: CaseRun) -> float | None:
    """The capacity the case's fault was sized from (recorded as its pinned capacity)."""
    cap = capacity_of(run.doc)
    return cap if run.case.pin_capacity else None


def _harness_version() -> str:
    """Package version plus the commit, so a table names exactly what was measured."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("inference-harness")
    except PackageNotFoundError:
        v = "unknown"
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{v} (git {sha or 'unknown'})"


def render(
    runs: Sequence[CaseRun], command: str, total_wall_s: float | None, note: str | None = None
) -> str:
    caught = sum(1 for r in runs if not judge(r.case, r.exit_code, r.doc))
    started = [
        sc.get("started_unix")
        for r in runs
        for sc in r.doc.get("scenarios") or []
        if sc.get("started_unix")
    ]
    when = (
        dt.datetime.fromtimestamp(min(started), dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        if started
        else "unknown"
    )
    cap = next((capacity_of(r.doc) for r in runs if r.case.name == CAPACITY_CASE), None)
    wall = total_wall_s if total_wall_s is not None else sum(r.wall_s for r in runs)
    lines = [
        "# Detection matrix",
        "",
        "<!-- generated by bench/detection_table.py from real runs; do not edit by hand -->",
        "",
        "Each row plants one realistic defect in the reference server, runs the scenario "
        "that should catch it through `harness run --quick --sut-cmd ...`, and records the "
        "intended check's measured value (a case that must fail two checks has a row for "
        "each). *Caught* means: exit code 1, every intended check "
        "failed with its value on the wrong side of its threshold, and no check failed "
        "that the case's allow-list (in `harness/testing/detection_cases.py`, each with its reason) "
        "does not explain. Healthy controls must exit 0. The same cases run as "
        "`tests/test_detection.py` (marked `slow`).",
        "",
        f"**{caught} of {len(runs)} cases as expected.**",
        "",
        "| defect | planted | scenario | check | measured | threshold | result | run | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [row for r in runs for row in _rows(r)]
    lines += ["", *_coverage()]
    lines += [
        "",
        "## Conditions",
        "",
        f"- date: {when}",
        f"- host: {platform.node() or 'unknown'}, {os.cpu_count()} cores "
        f"({platform.machine()}, {platform.system()} {platform.release()}), "
        f"Python {platform.python_version()}; the box is shared with other jobs",
        f"- harness version: {_harness_version()}",
        f"- healthy capacity (calibrated by `healthy-steady`, pinned where the case says so): "
        f"{_fmt(cap)} req/s",
        f"- matrix wall time: {wall / 60:.1f} min",
        f"- command: `{command}`",
        *([f"- provenance: {note}"] if note else []),
        "",
        "## Why each pairing",
        "",
    ]
    lines += [f"- **{r.case.name}** — {r.case.why}." for r in runs]
    return "\n".join(lines) + "\n"


def load_runs(base: Path, cases: Sequence[DetectionCase]) -> list[CaseRun]:
    runs = []
    for case in cases:
        d = base / case.name
        try:
            doc = json.loads((d / "results.json").read_text())
        except (OSError, ValueError):
            print(f"skip {case.name}: no results.json in {d}", file=sys.stderr)
            continue
        try:
            meta = json.loads((d / "detection_case.json").read_text())
        except (OSError, ValueError):  # results copied without the runner's record
            meta = {"exit_code": _exit_code_of(doc), "wall_s": 0.0, "argv": []}
        runs.append(
            CaseRun(
                case,
                int(meta["exit_code"]),
                doc,
                float(meta["wall_s"]),
                tuple(meta["argv"]),
                str(d),
            )
        )
    return runs


def _exit_code_of(doc: Mapping) -> int:
    """The CLI's exit code from a results document."""
    verdict = doc.get("verdict")
    return {"pass": 0, "fail": 1, "invalid": 3}.get(str(verdict), 2)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--from", dest="from_dir", default=None, help="render from these results")
    p.add_argument("--cases", default=None, help="comma-separated case names (default all)")
    p.add_argument("--out-dir", default=None, help="keep each run's results here")
    p.add_argument("--doc", default=str(ROOT / "docs" / "detection.md"), help="page to write")
    p.add_argument("--note", default=None, help="where the results came from (printed)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",")] if args.cases else [c.name for c in CASES]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"--cases has {unknown}; valid: {', '.join(BY_NAME)}")
    cases = [BY_NAME[n] for n in names]
    shown = list(argv or sys.argv[1:])
    if "--note" in shown:  # the note is printed on its own line
        i = shown.index("--note")
        del shown[i : i + 2]
    shown = [a for a in shown if not a.startswith("--note=")]
    command = "python bench/detection_table.py " + " ".join(shown)
    if args.from_dir:
        command = (
            f"HARNESS_DETECTION_OUT={args.from_dir} pytest -m slow tests/test_detection.py, "
            f"then {command}"
        )
        runs = load_runs(Path(args.from_dir), cases)
        total = None
    else:
        base = Path(args.out_dir or tempfile.mkdtemp(prefix="detection-"))
        if CAPACITY_CASE not in names:  # the leaks are sized from it
            cases.insert(0, BY_NAME[CAPACITY_CASE])
        cases.sort(key=lambda c: c.name != CAPACITY_CASE)
        runs, capacity, t0 = [], None, time.monotonic()
        for case in cases:
            run = run_case(
                case,
                str(base / case.name),
                capacity,
                cwd=str(ROOT),
                golden_cache=str(base / "golden.json"),
            )
            if case.name == CAPACITY_CASE:
                capacity = capacity_of(run.doc)
            problems = judge(case, run.exit_code, run.doc)
            print(
                f"{case.name:28s} exit {run.exit_code} {run.wall_s:5.0f} s  "
                f"{'ok' if not problems else 'PROBLEM: ' + '; '.join(problems)}",
                flush=True,
            )
            runs.append(run)
        total = time.monotonic() - t0
        print(f"results in {base}; matrix wall time {total / 60:.1f} min")
    Path(args.doc).write_text(render(runs, command, total, args.note), encoding="utf-8")
    print(f"wrote {args.doc}")
    bad = [r.case.name for r in runs if judge(r.case, r.exit_code, r.doc)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
