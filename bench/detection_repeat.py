"""Detection and false-positive rates: every defect case and its healthy twin, K times each.

A check proves itself both ways only with repetition: a defect it catches 3 times in 3,
and the same scenario under the same conditions — same flags, same pinned capacity, same
durations, only the planted fault removed — that it passes 3 times in 3. For each case of
harness/testing/detection_cases.py this runs the defect and its *control* alternately K times (so
both see the same machine at the same time) and prints, per case, the detection rate of
its intended checks, the control's pass rate for those checks (false positives), the
spread of the measured values, and anything else that failed or went invalid.

    python bench/detection_repeat.py                      # every case, 3 runs each (~2 h)
    python bench/detection_repeat.py --runs 3 --cases stall,leak-fds,cross-wire
    python bench/detection_repeat.py --from DIR           # re-render runs made earlier
    python bench/detection_repeat.py --from DIR --write docs/detection-repeated.md
    python bench/detection_repeat.py --from DIR --merge docs/detection-repeated.md

CI keeps one run per case (tests/test_detection.py); this is the benchmark. Runs are
serial: two harness runs at once on a small box measure each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.testing.detection import (  # noqa: E402 — needs the repo root on sys.path
    BY_NAME,
    CAPACITY_CASE,
    CASES,
    DetectionCase,
    capacity_of,
    run_case,
    wrong_side,
)

# Server flags that *are* the defect (not a condition of the experiment): dropped in the
# control. Any other flag (a queue size, a batch cap) is kept so the twin differs only in
# the defect.
DEFECT_FLAGS = ("--warmup-delay-s",)


def control_of(case: DetectionCase) -> DetectionCase:
    """The healthy twin: the same case with the planted fault (and defect flags) removed."""
    args: list[str] = []
    skip = False
    for a in case.server_args:
        if skip:
            skip = False
            continue
        if a in DEFECT_FLAGS:
            skip = True
            continue
        args.append(a)
    return dataclasses.replace(
        case,
        name=f"{case.name}--control",
        defect="none (healthy twin of " + case.name + ")",
        fault=None,
        server_args=tuple(args),
        expect_pass=True,
    )


@dataclasses.dataclass
class Outcome:
    """One run, reduced to what the rates need."""

    case: str
    role: str  # "defect" | "control"
    rep: int
    exit_code: int
    valid: bool
    intended: dict[str, dict]  # check id → {passed, value, threshold, op, wrong_side}
    other_failed: list[str]
    verdict: str | None
    wall_s: float

    @property
    def caught(self) -> bool:
        """Every intended check failed, with the value on the wrong side (defect runs)."""
        return self.valid and all(
            c.get("passed") is False and c.get("wrong_side") for c in self.intended.values()
        )

    @property
    def clean(self) -> bool:
        """No intended check failed and the run was valid and judged them (control runs)."""
        return self.valid and all(c.get("passed") is True for c in self.intended.values())


def reduce(
    case: DetectionCase, role: str, rep: int, exit_code: int, doc: Mapping, wall: float
) -> Outcome:
    scs = doc.get("scenarios") or []
    sc = scs[0] if scs else {}
    checks = {c["id"]: c for c in sc.get("checks") or []}
    intended = {}
    for cid in case.intended:
        c = checks.get(cid) or {}
        intended[cid] = {
            "passed": c.get("passed"),
            "value": c.get("value"),
            "threshold": c.get("threshold"),
            "op": c.get("op"),
            "skipped": c.get("skipped"),
            "wrong_side": (
                wrong_side(c.get("value"), c["op"], c["threshold"])
                if c.get("op") and c.get("threshold") is not None
                else None
            ),
        }
    other = [
        cid for cid, c in checks.items() if cid not in case.intended and c.get("passed") is False
    ]
    return Outcome(
        case=case.name,
        role=role,
        rep=rep,
        exit_code=exit_code,
        valid=bool(scs) and not sc.get("validity"),
        intended=intended,
        other_failed=other,
        verdict=sc.get("verdict"),
        wall_s=round(wall, 1),
    )


def run_all(cases: Sequence[DetectionCase], runs: int, out: Path) -> list[Outcome]:
    out.mkdir(parents=True, exist_ok=True)
    pinned = out / "capacity.json"
    if pinned.exists():  # a later slice into the same directory keeps the first slice's pin
        capacity = json.loads(pinned.read_text())["capacity_rps"]
        print(f"capacity {capacity} req/s pinned by an earlier slice ({pinned})", flush=True)
    else:
        healthy = BY_NAME[CAPACITY_CASE]
        first = run_case(
            healthy,
            str(out / "capacity"),
            None,
            cwd=str(ROOT),
            golden_cache=str(out / "golden.json"),
        )
        capacity = capacity_of(first.doc)
        print(f"capacity {capacity} req/s from {CAPACITY_CASE}", flush=True)
        pinned.write_text(json.dumps({"capacity_rps": capacity}))
    outcomes: list[Outcome] = []
    for rep in range(1, runs + 1):
        for case in cases:
            pairs = [("defect", case), ("control", control_of(case))]
            if case.expect_pass:
                pairs = [("control", case)]
            for role, c in pairs:
                d = out / f"{case.name}" / f"{role}-{rep}"
                r = run_case(
                    c, str(d), capacity, cwd=str(ROOT), golden_cache=str(out / "golden.json")
                )
                o = reduce(case, role, rep, r.exit_code, r.doc, r.wall_s)
                (d / "outcome.json").write_text(json.dumps(dataclasses.asdict(o), indent=1))
                mark = (o.caught if role == "defect" else o.clean) and "ok" or "MISS"
                print(
                    f"[{rep}/{runs}] {case.name:<28} {role:<7} exit {o.exit_code} "
                    f"{mark}  {[(k, v['value']) for k, v in o.intended.items()]} "
                    f"other failed {o.other_failed}  {o.wall_s:.0f}s",
                    flush=True,
                )
                outcomes.append(o)
    return outcomes


def load_outcomes(base: Path) -> list[Outcome]:
    """Every run's outcome (runs set aside by ``--rerun-invalid`` not included)."""
    return [
        Outcome(**json.loads(p.read_text()))
        for p in sorted(base.glob("*/*/outcome.json"))
        if ".invalid-" not in p.parent.name
    ]


def set_aside(base: Path) -> dict[str, list[str]]:
    """Per case, the invalid runs ``--rerun-invalid`` replaced, with their reason."""
    out: dict[str, list[str]] = {}
    for p in sorted(base.glob("*/*.invalid-*/outcome.json")):
        o = Outcome(**json.loads(p.read_text()))
        doc = (
            json.loads((p.parent / "results.json").read_text())
            if (p.parent / "results.json").exists()
            else {}
        )
        reasons = [r for sc in doc.get("scenarios") or [] for r in sc.get("validity") or []]
        why = reasons[0].split(":")[0] if reasons else "invalid"
        out.setdefault(o.case, []).append(f"{o.role} {o.rep}: {why}")
    return out


def rerun_invalid(cases: Sequence[DetectionCase], out: Path) -> list[Outcome]:
    """Run again each run of ``cases`` whose outcome was invalid (the harness refused to
    judge it: e.g. dispatch lag from other work on the machine); the invalid run is kept
    beside it as ``ROLE-REP.invalid-K`` and counted in the table."""
    capacity = json.loads((out / "capacity.json").read_text())["capacity_rps"]
    names = {c.name for c in cases}
    for o in load_outcomes(out):
        if o.case not in names or o.valid:
            continue
        case = BY_NAME[o.case]
        d = out / o.case / f"{o.role}-{o.rep}"
        k = 1
        while d.with_name(f"{d.name}.invalid-{k}").exists():
            k += 1
        d.rename(d.with_name(f"{d.name}.invalid-{k}"))
        c = case if o.role == "defect" or case.expect_pass else control_of(case)
        r = run_case(c, str(d), capacity, cwd=str(ROOT), golden_cache=str(out / "golden.json"))
        new = reduce(case, o.role, o.rep, r.exit_code, r.doc, r.wall_s)
        (d / "outcome.json").write_text(json.dumps(dataclasses.asdict(new), indent=1))
        print(
            f"[rerun {o.rep}] {o.case:<28} {o.role:<7} exit {new.exit_code} valid {new.valid}",
            flush=True,
        )
    return load_outcomes(out)


def _spread(values: Sequence[object]) -> str:
    nums = sorted(float(v) for v in values if isinstance(v, int | float))
    nones = sum(1 for v in values if v is None)
    if not nums:
        return "never" if nones else "—"
    text = f"{nums[0]:.3g}" if len(nums) == 1 else f"{nums[0]:.3g}–{nums[-1]:.3g}"
    return text + (f" (+{nones}× never)" if nones else "")


def render(
    outcomes: Sequence[Outcome], note: str = "", aside: dict[str, list[str]] | None = None
) -> str:
    by_case: dict[str, dict[str, list[Outcome]]] = {}
    for o in outcomes:
        by_case.setdefault(o.case, {}).setdefault(o.role, []).append(o)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    lines = [
        "# Detection and false-positive rates (repeated)",
        "",
        "Generated by `python bench/detection_repeat.py`; do not edit. Each defect case of",
        "`harness/testing/detection_cases.py` ran K times beside its healthy twin (the same scenario,",
        "flags, pinned capacity and durations with the planted fault removed), alternately,",
        "so both saw the same machine. **Caught** = every intended check failed with its value",
        "on the wrong side of the threshold in a valid run; **control clean** = the intended",
        "checks passed in a valid run (a false positive is a control where one failed).",
        "",
        f"{dt.date.today().isoformat()} · commit `{commit}` · {platform.node()} · "
        f"{os.cpu_count()} CPUs · Python {platform.python_version()}"
        + (f" · {note}" if note else ""),
        "",
        "| case | intended checks | caught | defect values | control clean | control values | other failures |",
        "|---|---|---|---|---|---|---|",
    ]
    caught_total = runs_total = clean_total = control_total = 0
    for name, roles in by_case.items():
        case = BY_NAME.get(name)
        checks = ", ".join(f"`{c}`" for c in (case.intended if case else ()))
        defect = roles.get("defect", [])
        control = roles.get("control", [])
        caught = sum(o.caught for o in defect)
        clean = sum(o.clean for o in control)
        caught_total += caught
        runs_total += len(defect)
        clean_total += clean
        control_total += len(control)
        dvals = (
            "; ".join(
                f"{cid}: {_spread([o.intended[cid]['value'] for o in defect])}"
                for cid in (case.intended if case else ())
            )
            if defect
            else "—"
        )
        cvals = "; ".join(
            f"{cid}: {_spread([o.intended[cid]['value'] for o in control])}"
            for cid in (case.intended if case else ())
        )
        others = sorted(
            {f"{o.role}: {cid}" for o in (*defect, *control) for cid in o.other_failed}
            | {f"{o.role} invalid" for o in (*defect, *control) if not o.valid}
        ) + [f"rerun after an invalid run ({r})" for r in (aside or {}).get(name, [])]
        lines.append(
            f"| {name} | {checks} | {f'{caught}/{len(defect)}' if defect else '—'} | {dvals} | "
            f"{clean}/{len(control)} | {cvals} | {', '.join(others) or '—'} |"
        )
    lines += [
        "",
        f"**Totals:** caught {caught_total}/{runs_total} defect runs; controls clean "
        f"{clean_total}/{control_total}.",
        "",
    ]
    return "\n".join(lines)


def _row_name(line: str) -> str | None:
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not line.startswith("| ") or len(cells) < 7 or cells[0] in ("case", "---"):
        return None
    return cells[0]


def _fraction(cell: str) -> tuple[int, int]:
    a, _, b = cell.strip().partition("/")
    return (int(a), int(b)) if a.isdigit() and b.isdigit() else (0, 0)


def _totals(table: Sequence[str]) -> str:
    caught = [_fraction(ln.strip().strip("|").split("|")[2]) for ln in table]
    clean = [_fraction(ln.strip().strip("|").split("|")[4]) for ln in table]
    return (
        f"**Totals:** caught {sum(a for a, _ in caught)}/{sum(b for _, b in caught)} defect "
        f"runs; controls clean {sum(a for a, _ in clean)}/{sum(b for _, b in clean)}."
    )


def merge(existing: str, fresh: str) -> str:
    """``existing`` (a file of tables this script wrote) with the rows of ``fresh`` in
    place of the rows of the same cases, the totals of each table that changed counted
    again, a line under the first provenance saying which rows were measured when and on
    what; cases not in any table yet get a section of their own at the end.

    A case's row is replaced where it first appears: that is its current row (the main
    table, or the section that added the case). Later tables with the same case are the
    dated record of earlier measurements (a shorter run tried, a change measured) and are
    left as they were written."""
    fresh_lines = fresh.splitlines()
    rows = {n: ln for ln in fresh_lines if (n := _row_name(ln))}
    provenance = next(ln for ln in fresh_lines if ln[:4].isdigit() and " · commit " in ln)
    out: list[str] = []
    table: list[str] = []  # the rows of the table last seen
    changed = False  # a row of that table was replaced
    seen: set[str] = set()
    noted = False
    said = f"Rows {', '.join(rows)} measured again: "
    skip_blank = False
    for ln in existing.splitlines():
        name = _row_name(ln)
        if ln.startswith(said):
            skip_blank = True  # the same rows measured before: this note replaces that one
            continue
        if skip_blank and not ln.strip():
            skip_blank = False
            continue
        skip_blank = False
        if ln.startswith("| case |"):
            if not noted:
                out += [said + provenance, ""]
                noted = True
            table, changed = [], False
        if name is not None:
            if name in rows and name not in seen:
                ln, changed = rows[name], True
            seen.add(name)
            table.append(ln)
        elif ln.startswith("**Totals:**") and changed:  # the counts again, words kept
            ln = re.sub(r"^\*\*Totals:\*\*[^.]*\.", _totals(table).replace("\\", r"\\"), ln)
        out.append(ln)
    new = [rows[n] for n in rows if n not in seen]
    if new:
        while out and not out[-1].strip():
            out.pop()
        out += [
            "",
            f"## Cases added since ({provenance.split(' · ')[0]})",
            "",
            "| case | intended checks | caught | defect values | control clean | control values | other failures |",
            "|---|---|---|---|---|---|---|",
            *new,
            "",
            _totals(new),
        ]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--from", dest="from_dir", default=None, help="render runs made earlier")
    p.add_argument("--write", default=None, help="write the Markdown table to this file")
    p.add_argument("--note", default="", help="a provenance note printed under the title")
    p.add_argument(
        "--merge",
        default=None,
        help="replace these cases' rows in this table (written earlier by --write), say "
        "when they were measured, and count the totals again",
    )
    p.add_argument(
        "--rerun-invalid",
        action="store_true",
        help="with --out-dir: run again the runs of --cases that came out invalid (kept aside, "
        "counted in the table)",
    )
    args = p.parse_args(argv)
    aside: dict[str, list[str]] = {}
    if args.from_dir:
        outcomes = load_outcomes(Path(args.from_dir))
        aside = set_aside(Path(args.from_dir))
    elif args.rerun_invalid:
        names = [n.strip() for n in args.cases.split(",")] if args.cases else list(BY_NAME)
        out = Path(args.out_dir)
        outcomes = rerun_invalid([BY_NAME[n] for n in names], out)
        aside = set_aside(out)
    else:
        names = [n.strip() for n in args.cases.split(",")] if args.cases else None
        unknown = [n for n in names or () if n not in BY_NAME]
        if unknown:
            p.error(f"unknown case(s) {unknown}; valid: {', '.join(BY_NAME)}")
        cases = [c for c in CASES if names is None or c.name in names]
        out = Path(args.out_dir or tempfile.mkdtemp(prefix="detrep-"))
        print(f"results in {out}", flush=True)
        outcomes = run_all(cases, args.runs, out)
    text = render(outcomes, args.note, aside)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    if args.merge:
        target = Path(args.merge)
        target.write_text(merge(target.read_text(), text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
