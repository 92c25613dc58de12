"""Another tenant on the server's core: invalid with the figure, never a failure.

Runs the quick steady-state scenario on the reference server (calibrated, one attempt:
``--retry-invalid 0``) in three cases, K times each, one run at a time:

- ``none``: nothing else on the machine (the control: it must pass);
- ``steady``: once the load has started (after the capacity probe), a process the
  harness did not start takes 40 % of the server's core (busy 40 ms of every 100 ms,
  pinned to that core, its own session) until the run ends;
- ``onoff``: the same tenant 1.5 s on / 1.5 s off.

Prints per run the verdict, the failed checks, the share of the server's cores used by
work not the run's over the span nearest its allowance, and that allowance
(``validity_margins``), the whole run's share, the capacity probe's, what the old trip wire (50 % of a core held 3 s on
the run's cores) saw, and the validity reason — then per case the verdicts. A tenant
case must never FAIL; the control must PASS.

    python bench/foreign_cpu.py --runs 3

Each run takes ``--lock`` (default /tmp/harness-cpu.lock) while it runs, so other
CPU-heavy work on the box waits for it and it for them. Run it on an otherwise idle
machine: anything else running is, by design, a tenant.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.analysis.validity import sustained_level  # noqa: E402
from harness.checks.engine import foreign_shares, validity_margins  # noqa: E402

# DUTY of one core (busy DUTY x 0.1 s of every 0.1 s) pinned to CORE; ON/OFF > 0: busy
# ON s then idle OFF s. Runs until killed.
TENANT = """
import os, sys, time
core, duty, on, off = sys.argv[1:5]
os.sched_setaffinity(0, {int(core)})
duty, on, off = float(duty), float(on), float(off)
t0 = time.monotonic()
while True:
    now = time.monotonic()
    if off > 0 and (now - t0) % (on + off) >= on:
        time.sleep(0.02)
        continue
    end = now + 0.1 * duty
    while time.monotonic() < end:
        pass
    time.sleep(0.1 * (1 - duty))
"""
CASES = {"none": None, "steady": (0.4, 0.0, 0.0), "onoff": (0.4, 1.5, 1.5)}


@contextlib.contextmanager
def locked(path: str | None):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait_for_load(out: Path, harness: subprocess.Popen, after_s: float) -> int | None:
    """The server's pid once the load has run ``after_s`` (the probe is over)."""
    progress = out / "steady_state" / "progress.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and harness.poll() is None:
        try:
            if json.loads(progress.read_text()).get("elapsed_s", 0) >= after_s:
                return int((out / "steady_state" / "samples" / "sut.pid").read_text())
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return None


def run(out: Path, case: str, after_s: float) -> dict:
    sut = f"{sys.executable} -m harness_reference_server --port {{port}} --workers 1"
    harness = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "run", "steady_state", "--quick"),
            *("--sut-cmd", sut, "--out", str(out), "--retry-invalid", "0"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tenant = None
    try:
        server = _wait_for_load(out, harness, after_s)
        shape = CASES[case]
        if shape is not None and server is not None:
            core = max(os.sched_getaffinity(server))
            tenant = subprocess.Popen(
                [sys.executable, "-c", TENANT, str(core), *map(str, shape)],
                start_new_session=True,
            )
        harness.wait(timeout=300)
    finally:
        for p in (harness, *([tenant] if tenant else [])):
            if p.poll() is None:
                p.kill()
            p.wait()
    sc = json.loads((out / "results.json").read_text())["scenarios"][0]
    worst, budget = validity_margins(sc).get("foreign_cpu_share", (None, None))
    shares = foreign_shares(sc)
    series = (sc.get("system") or {}).get("series") or {}
    old = sustained_level(series.get("t") or [], series.get("other_cpu_pct") or [], 3.0)
    probe = (sc.get("calibration") or {}).get("cpu") or {}
    probe_share = (
        probe["foreign_core_s"] / (len(probe["server_cores"]) * probe["span_s"])
        if probe.get("measured")
        else None
    )
    reason = next((r for r in sc.get("validity") or [] if "per server core-s" in r), None)
    return {
        "verdict": sc["verdict"],
        "failed": [
            f"{c['id']} {c['value']}" for c in sc.get("checks") or [] if c.get("passed") is False
        ],
        "worst": worst,
        "budget": budget,
        "run_share": shares[0].share if shares and shares[0].where == "the run" else None,
        "probe_share": probe_share,
        "old_held": old,
        "capacity": sc.get("capacity_rps"),
        "reason": reason,
        "other_reasons": [r for r in sc.get("validity") or [] if r != reason],
        "named": reason is not None and tenant is not None and f"pid {tenant.pid} " in reason,
    }


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per case")
    ap.add_argument("--cases", default="none,steady,onoff")
    ap.add_argument(
        "--after-s", type=float, default=3.0, help="tenant starts this far into the load"
    )
    ap.add_argument("--lock", default="/tmp/harness-cpu.lock", help="'' for none")
    ap.add_argument("--keep", help="keep each run's output under this directory")
    args = ap.parse_args()
    cases = args.cases.split(",")
    verdicts: dict[str, Counter] = {c: Counter() for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        for i in range(args.runs):
            for case in cases:
                t0 = time.monotonic()
                with locked(args.lock):
                    r = run(base / f"{case}-{i + 1}", case, args.after_s)
                verdicts[case][r["verdict"]] += 1
                print(
                    f"{case:6} {i + 1}: {r['verdict']:8} nearest its limit {_f(r['worst'])} "
                    f"(limit {_f(r['budget'], '.2f')}) run {_f(r['run_share'])} probe "
                    f"{_f(r['probe_share'])} "
                    f"old-rule held {_f(r['old_held'], '.0f')} % | capacity "
                    f"{_f(r['capacity'], '.0f')} | failed {r['failed'] or '-'} | "
                    f"{'named' if r['named'] else ''} {(r['reason'] or '')[:140]} "
                    f"{r['other_reasons'] or ''} [{time.monotonic() - t0:.0f} s]",
                    flush=True,
                )
    for case in cases:
        print(f"{case}: " + ", ".join(f"{k} {v}/{args.runs}" for k, v in verdicts[case].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
