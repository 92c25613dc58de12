"""Does the healthy server pass the quick checklist every time, and with how much margin?

Runs ``harness acceptance --quick`` N times against the default target (the bundled
reference server), prints how many runs passed and, per check, the spread (min / median
/ max) of its measured value and of value relative to threshold — the margin each default
threshold has on this machine. A ratio near 1 is a threshold that will flake.

    python bench/flakiness.py                      # 5 runs, the whole checklist (~50 min)
    python bench/flakiness.py --runs 1 --scenarios steady_state,spike
    python bench/flakiness.py --from DIR1 DIR2 ... # summarise runs made earlier

Each run's results stay in --out-dir/run-K (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_acceptance(out_dir: Path, scenarios: str | None, timeout_s: float) -> int:
    """One ``harness acceptance --quick`` subprocess; SIGTERM then SIGKILL on timeout."""
    argv = [sys.executable, "-m", "harness", "acceptance", "--quick", "--out", str(out_dir)]
    if scenarios:
        argv += ["--scenarios", scenarios]
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "harness.log", "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the harness stops Locust and the server
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return -1
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def relative(value: float | None, op: str, threshold: float) -> float | None:
    """value/threshold oriented so that > 1 fails: for >= checks, threshold/value."""
    if value is None or threshold == 0:
        return None
    if op in ("<=", "<"):
        return value / threshold
    if op in (">=", ">"):
        return threshold / value if value else float("inf")
    return None


def _spread(xs: Sequence[float]) -> str:
    if not xs:
        return "—"
    return f"{min(xs):.3g} / {statistics.median(xs):.3g} / {max(xs):.3g}"


def summarise(docs: Sequence[Mapping]) -> str:
    passes = sum(1 for d in docs if d.get("verdict") == "pass")
    by_check: dict[str, list[Mapping]] = {}
    for d in docs:
        for sc in d.get("scenarios") or []:
            for c in sc.get("checks") or []:
                by_check.setdefault(c["id"], []).append(c)
    out = [f"healthy runs passed: {passes}/{len(docs)}"]
    for d in docs:
        bad = [
            f"{c['id']} ({c.get('detail')})"
            for sc in d.get("scenarios") or []
            for c in sc.get("checks") or []
            if c.get("passed") is False
        ]
        invalid = [
            f"{sc.get('name')}: {sc.get('validity')}"
            for sc in d.get("scenarios") or []
            if sc.get("validity")
        ]
        if bad or invalid:
            out.append(f"  run verdict {d.get('verdict')}: " + "; ".join(bad + invalid))
    out.append("")
    head = f"{'check':30s} {'pass':>5s} {'skip':>5s}  {'op':2s} {'threshold':>9s}  "
    head += f"{'value min / median / max':32s} value/threshold (>1 fails) min / median / max"
    out.append(head)
    for cid in sorted(by_check):
        cs = by_check[cid]
        vals = [
            float(c["value"]) for c in cs if c.get("value") is not None and not c.get("skipped")
        ]
        rel = [
            r
            for c in cs
            if not c.get("skipped")
            and (r := relative(c.get("value"), c.get("op", ""), float(c.get("threshold") or 0)))
            is not None
        ]
        npass = sum(1 for c in cs if c.get("passed") is True)
        nskip = sum(1 for c in cs if c.get("passed") is None)
        thr = cs[0].get("threshold")
        out.append(
            f"{cid:30s} {npass:>2d}/{len(cs):<2d} {nskip:>5d}  {cs[0].get('op', ''):2s} "
            f"{thr!s:>9s}  {_spread(vals):32s} {_spread(rel)}"
        )
    out.append(
        "(soak.*_trend checks fail only on a significant trend, so a noisy slope above the "
        "threshold can still pass: their ratio is the slope's, not the verdict's, margin)"
    )
    out += ["", *validity_summary(docs)]
    return "\n".join(out)


def validity_summary(docs: Sequence[Mapping]) -> list[str]:
    """Per scenario, how close the runs came to being judged invalid (ratio > 1 is)."""
    sys.path.insert(0, str(ROOT))
    from harness.checks.engine import validity_margins

    margins: dict[tuple[str, str], list[float]] = {}
    for doc in docs:
        for sc in doc.get("scenarios") or []:
            for name, (value, limit) in validity_margins(sc).items():
                if value is not None and limit:
                    margins.setdefault((str(sc.get("name")), name), []).append(value / limit)
    out = [f"{'validity (value/limit, >1 is invalid)':40s} min / median / max"]
    for (scenario, name), ratios in sorted(margins.items()):
        out.append(f"{scenario + ' ' + name:40s} {_spread(ratios)}")
    return out


def conditions(runs: int, scenarios: str | None, wall_s: float | None) -> str:
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    return (
        f"conditions: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, host {platform.node()}, "
        f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"git {sha or 'unknown'}, Python {platform.python_version()}, runs {runs}, "
        f"scenarios {scenarios or 'all (quick checklist)'}"
        + (f", wall {wall_s / 60:.1f} min" if wall_s is not None else "")
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="how many acceptance runs (default 5)")
    p.add_argument("--scenarios", default=None, help="comma-separated subset of the checklist")
    p.add_argument("--out-dir", default=None, help="keep each run in OUT_DIR/run-K")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run (bound)")
    p.add_argument("--from", dest="from_dirs", nargs="+", default=None, help="summarise these")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs has value {args.runs}; expected 1 or more")
    wall = None
    if args.from_dirs:
        dirs = [Path(d) for d in args.from_dirs]
    else:
        base = Path(args.out_dir or tempfile.mkdtemp(prefix="flakiness-"))
        dirs, t0 = [], time.monotonic()
        for k in range(1, args.runs + 1):
            d = base / f"run-{k}"
            code = run_acceptance(d, args.scenarios, args.timeout)
            print(f"run {k}/{args.runs}: exit {code} ({d})", flush=True)
            dirs.append(d)
        wall = time.monotonic() - t0
    docs = []
    for d in dirs:
        try:
            docs.append(json.loads((d / "results.json").read_text()))
        except (OSError, ValueError) as e:
            print(f"{d}: no readable results.json ({e}); counted as a failed run")
            docs.append({"verdict": "missing", "scenarios": []})
    print(summarise(docs))
    print(conditions(len(docs), args.scenarios, wall))
    return 0 if all(d.get("verdict") == "pass" for d in docs) else 1


if __name__ == "__main__":
    sys.exit(main())
