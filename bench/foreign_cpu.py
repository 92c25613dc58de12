"""Does the "foreign CPU" validity rule catch another tenant, and only then?

Alternates two real runs of the quick steady-state scenario (20 s, capacity pinned) on
the reference server: a *tenant* run, where a busy process the harness did not start (a
build job, another test) takes what it can of the box for 10 s mid-run, and its *control*,
the same run with nothing else on the machine. Prints, per run, the verdict, the
unattributed CPU the run's cores held for ``foreign_sustain_s`` against its limit, and the
validity reason — then the detection rate and the false-positive rate.

    python bench/foreign_cpu.py --runs 5

Run it on an otherwise idle machine: anything else running is, by design, a tenant.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.checks.engine import validity_margins  # noqa: E402

TENANT = "import time\nt = time.time()\nwhile time.time() - t < 10: pass"


def run(out: Path, tenant: bool, capacity: float) -> dict:
    sut = f"{sys.executable} -m reference_server --port {{port}} --workers 1"
    harness = subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "run", "steady_state", "--quick"),
            *("--duration", "20", "--sut-cmd", sut, "--out", str(out)),
            f"--locust-arg=--capacity-rps={capacity:g}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    other = None
    try:
        progress = out / "steady_state" / "progress.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and harness.poll() is None:
            try:
                if json.loads(progress.read_text()).get("elapsed_s", 0) >= 3:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        if tenant:
            other = subprocess.Popen([sys.executable, "-c", TENANT], start_new_session=True)
        harness.wait(timeout=180)
    finally:
        for p in (harness, *([other] if other else [])):
            if p.poll() is None:
                p.kill()
            p.wait()
    sc = json.loads((out / "results.json").read_text())["scenarios"][0]
    held, limit = validity_margins(sc).get("foreign_cpu_pct", (None, None))
    reason = next((r for r in sc["validity"] if "not the run's" in r), None)
    named = reason is not None and other is not None and f"pid {other.pid} " in reason
    return {
        "verdict": sc["verdict"],
        "held": held,
        "limit": limit,
        "reason": reason,
        "named": named,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="tenant/control pairs")
    ap.add_argument("--capacity-rps", type=float, default=500.0, help="pinned (0.6x is offered)")
    args = ap.parse_args()
    caught = clean = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for tenant in (True, False):
                r = run(Path(tmp) / f"{i}-{int(tenant)}", tenant, args.capacity_rps)
                kind = "tenant " if tenant else "control"
                held = "n/a" if r["held"] is None else f"{r['held']:.1f}"
                print(
                    f"{kind} {i + 1}: {r['verdict']:8} held {held} % (limit {r['limit']}) "
                    f"{'named' if r['named'] else ''} {(r['reason'] or '')[:110]}",
                    flush=True,
                )
                if tenant:
                    caught += r["reason"] is not None
                else:
                    clean += r["reason"] is None
    print(
        f"caught {caught}/{args.runs} tenant runs; controls clean {clean}/{args.runs} "
        f"(steady_state --quick, 20 s at 0.6 x {args.capacity_rps:g} req/s, a 10 s busy loop)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
