"""The pre-release soak, for real: `harness run soak --full` (1 hour) twice — on the healthy
reference server and on one leaking ~10 MiB/h — then the figures a release sign-off needs.

    python bench/soak_hour.py                       # both soaks side by side (~62 min)
    python bench/soak_hour.py --serial              # one after the other (~2 h)
    python bench/soak_hour.py --from DIR            # re-read runs made earlier

Conditions: capacity is pinned (``--capacity-rps``, default 200, so the soak rate 0.6x is
120 req/s) for both runs, so the leak's size in MiB/h is known before the run: 4096 bytes
retained every EVERY-th request, EVERY chosen for ``--leak-mib-h`` at that rate (a 4096 B
block costs ~4.1 KiB of heap). Side by side, the two servers share the SUT core and the
two Locust processes the generator core (about 240 req/s in all on 2 cores); say so when
quoting. Printed per run: the verdict and exit code, each soak check's value, the
server's RSS at start / after warm-up / at the end, the harness's own RSS (every load
generator process, recorded in ``system.loadgen_processes``) at start, 10 min, 30 min and
the end, and how long ``harness report`` takes to re-render the hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BLOCK_BYTES = 4096
BLOCK_HEAP_BYTES = 4096 + 33 + 16  # bytes object header + malloc chunk overhead


def leak_every(rate_rps: float, mib_per_h: float) -> int:
    """Requests per retained 4 KiB block for a leak of ``mib_per_h`` at ``rate_rps``."""
    blocks_per_s = mib_per_h * 2**20 / 3600 / BLOCK_HEAP_BYTES
    return max(1, round(rate_rps / blocks_per_s))


def harness_argv(out: Path, capacity: float, fault: str | None) -> list[str]:
    server = [sys.executable, "-m", "harness_reference_server"]
    if fault:
        server += ["--fault", fault]
    cmd = " ".join(server) + " --port {port} --workers {threads}"
    return [
        sys.executable, "-m", "harness", "run", "soak", "--full",
        f"--locust-arg=--capacity-rps={capacity:g}", "--sut-cmd", cmd, "--out", str(out),
    ]  # fmt: skip


def run(runs: dict[str, list[str]], serial: bool, out: Path) -> None:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in runs.items():
            log = open(out / f"{name}.log", "wb")  # noqa: SIM115 — closed with the process
            print(f"+ {' '.join(argv)}", flush=True)
            procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            if serial:
                procs[name].wait()
        for p in procs.values():
            p.wait()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()  # the harness undoes its faults and stops its server
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def mib(v: float | None) -> str:
    return "—" if v is None else f"{v / 2**20:.1f}"


def at(series: list, t: list, second: float) -> float | None:
    """The first non-empty value at or after ``second`` seconds."""
    for ts, v in zip(t, series, strict=False):
        if ts is not None and ts >= second and v is not None:
            return v
    return None


def describe(name: str, run_dir: Path) -> None:
    doc = json.loads((run_dir / "results.json").read_text())
    sc = doc["scenarios"][0]
    print(f"\n== {name}: {doc.get('verdict')} ({run_dir})")
    for c in sc.get("checks", []):
        state = "skip" if c.get("skipped") else ("pass" if c.get("passed") else "FAIL")
        print(f"   {c['id']:<22} {state:<5} {c.get('value')} {c.get('unit', '')}")
    srv = sc["server"]["series"]
    end = srv["t"][-1]
    print(
        f"   server RSS MiB: start {mib(at(srv['rss_bytes'], srv['t'], 0))}, 15 min "
        f"{mib(at(srv['rss_bytes'], srv['t'], 900))}, end {mib(srv['rss_bytes'][-1])}"
    )
    t = sc["system"]["series"]["t"]
    for p in sc["system"].get("loadgen_processes", []):
        rss = p.get("rss_bytes") or []
        marks = ", ".join(f"{m} {mib(at(rss, t, s))}" for m, s in (("start", 0), ("10 min", 600)))
        print(
            f"   harness RSS MiB (pid {p['pid']} {p['name']}): {marks}, 30 min "
            f"{mib(at(rss, t, 1800))}, end {mib(at(rss, t, end - 5))}"
        )
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "harness", "report", str(run_dir)],
        check=False,
        stdout=subprocess.DEVNULL,
    )
    print(f"   harness report re-rendered the run in {time.perf_counter() - t0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-results/soak-hour"))
    ap.add_argument("--capacity-rps", type=float, default=200.0)
    ap.add_argument("--leak-mib-h", type=float, default=10.0)
    ap.add_argument("--serial", action="store_true", help="one soak after the other")
    ap.add_argument("--from", dest="from_dir", type=Path, help="re-read earlier runs")
    a = ap.parse_args()
    out = a.from_dir or a.out
    if a.from_dir is None:
        out.mkdir(parents=True, exist_ok=True)
        every = leak_every(0.6 * a.capacity_rps, a.leak_mib_h)
        fault = f"leak-memory:{BLOCK_BYTES},{every}"
        print(f"conditions: {os.cpu_count()} CPUs, capacity pinned {a.capacity_rps:g} req/s, "
              f"soak at {0.6 * a.capacity_rps:g} req/s, leak {fault} (~{a.leak_mib_h:g} MiB/h), "
              f"{'serial' if a.serial else 'side by side'}")  # fmt: skip
        runs = {
            "healthy": harness_argv(out / "healthy", a.capacity_rps, None),
            "leak": harness_argv(out / "leak", a.capacity_rps, fault),
        }
        run(runs, a.serial, out)
    for name in ("healthy", "leak"):
        describe(name, out / name / "soak")


if __name__ == "__main__":
    main()
