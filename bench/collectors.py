"""Benchmark: what the process sampler costs, and how well it agrees with pidstat.

    python bench/collectors.py [--threads 200] [--seconds 20] [--interval 1]

1. Cost per tick, in-process: CPU time of ``ProcessSampler.sample()`` on a target with
   ``--threads`` threads (→ % of one core at 1 Hz).
2. Cost end to end: CPU of a real ``python -m harness sample`` subprocess at 1 Hz, measured
   from its 3rd second (interpreter start-up excluded) to its end.
3. Agreement with ``pidstat -t -p PID 1`` (if installed), per thread over the same run:
   run averages, and per-1 s-interval differences (intervals aligned by index; the two
   tools start within a few ms of each other).

Prints figures with their conditions; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.collectors.process import ProcessSampler  # noqa: E402

# N threads: 2 spin (GIL-bound), 4 wake every 1 ms; then, in profile "pool" (a server's
# idle worker pool), 20 wake every 0.2 s and the rest block on an Event; in profile
# "allwake" (worst case) every other thread wakes every 0.2 s.
TARGET = textwrap.dedent(
    """
    import sys, threading, time
    n, profile = int(sys.argv[1]), sys.argv[2]
    idle = threading.Event()
    def name(s):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(s)
    def spin(i):
        name(f"spin{i}")
        while True:
            pass
    def waker(i):
        name(f"wake{i}")
        while True:
            time.sleep(0.001)
    def sleeper(i):
        name(f"sleep{i}")
        while True:
            time.sleep(0.2)
    def blocked(i):
        name(f"pool{i}")
        idle.wait()
    kinds = [spin, spin] + [waker] * 4
    for i in range(n - 1):
        if i < len(kinds):
            f = kinds[i]
        elif profile == "allwake" or i < len(kinds) + 20:
            f = sleeper
        else:
            f = blocked
        threading.Thread(target=f, args=(i,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(3600)
    """
)


def start_target(threads: int, profile: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", TARGET, str(threads), profile], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while psutil.Process(p.pid).num_threads() < threads and time.monotonic() < deadline:
        time.sleep(0.05)
    return p


def cost_in_process(pid: int, ticks: int, interval: float) -> dict:
    sampler = ProcessSampler(pid, None)
    sampler.baseline(time.monotonic())
    cpu, wall = [], []
    for _ in range(ticks):
        time.sleep(interval)
        c0, w0 = time.thread_time(), time.perf_counter()
        sampler.sample(time.monotonic(), time.time())
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {
        "tick_cpu_ms_median": statistics.median(cpu) * 1e3,
        "tick_cpu_ms_p90": sorted(cpu)[int(0.9 * len(cpu))] * 1e3,
        "tick_wall_ms_median": statistics.median(wall) * 1e3,
        "pct_of_core_at_1hz": statistics.median(cpu) * 100,
        "threads_seen": len(sampler.last_threads),
    }


def pidstat_series(text: str) -> dict[int, list[float]]:
    """Per-TID %CPU per interval (non-Average thread rows)."""
    out: dict[int, list[float]] = {}
    header = None
    for line in text.splitlines():
        parts = line.split()
        if "TID" in parts and "%CPU" in parts:
            header = {name: i for i, name in enumerate(parts)}
            continue
        if header and len(parts) >= len(header) and parts[0] != "Average:" and parts[2] == "-":
            out.setdefault(int(parts[header["TID"]]), []).append(float(parts[header["%CPU"]]))
    return out


def cost_and_agreement(pid: int, seconds: int, interval: float) -> dict:
    out = tempfile.mkdtemp(prefix="bench-sample-")
    have_pidstat = shutil.which("pidstat") is not None
    ps = None
    if have_pidstat:
        ps = subprocess.Popen(
            ["pidstat", "-t", "-p", str(pid), "1", str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    sampler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "sample",
            "--pid",
            str(pid),
            "--out",
            out,
            "--interval",
            str(interval),
            "--duration",
            str(seconds),
            "--loadgen-pid",
            str(os.getpid()),
        ],  # fmt: skip
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )
    sp = psutil.Process(sampler.pid)
    time.sleep(3.0)
    t_a, c_a = time.monotonic(), sum(sp.cpu_times()[:2])
    last = (t_a, c_a)
    while sampler.poll() is None:
        try:
            last = (time.monotonic(), sum(sp.cpu_times()[:2]))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    sampler.wait()
    result = {
        "sampler_pct_of_core": 100 * (last[1] - c_a) / max(1e-9, last[0] - t_a),
        "measured_over_s": round(last[0] - t_a, 1),
    }
    meta = json.loads((Path(out) / "sampler.json").read_text())
    result["ticks"], result["missed_ticks"] = meta["ticks"], meta["missed_ticks"]
    result["max_late_ms"] = meta["max_late_s"] * 1e3
    if ps is None:
        result["pidstat"] = "not installed (apt-get install sysstat)"
        return result
    text, _ = ps.communicate(timeout=60)
    theirs = pidstat_series(text)
    ours: dict[int, list[float]] = {}
    import csv

    with open(Path(out) / "threads.csv") as f:
        for row in csv.DictReader(f):
            ours.setdefault(int(row["tid"]), []).append(float(row["cpu_pct"]))
    run_diffs, tick_diffs = [], []
    for tid, ref in theirs.items():
        mine = ours.get(tid)
        if not mine:
            continue
        n = min(len(ref), len(mine))
        run_diffs.append(abs(statistics.mean(mine[:n]) - statistics.mean(ref[:n])))
        tick_diffs += [abs(a - b) for a, b in zip(mine[:n], ref[:n], strict=True)]
    busiest = sorted(theirs, key=lambda t: -statistics.mean(theirs[t]))[:3]
    result["pidstat"] = {
        "threads_compared": len(run_diffs),
        "run_mean_abs_diff_points": {
            "median": statistics.median(run_diffs),
            "max": max(run_diffs),
        },
        "per_interval_abs_diff_points": {
            "median": statistics.median(tick_diffs),
            "p99": sorted(tick_diffs)[int(0.99 * len(tick_diffs))],
            "max": max(tick_diffs),
        },
        "busiest_threads": {
            str(t): {
                "pidstat_mean": round(statistics.mean(theirs[t]), 2),
                "sampler_mean": round(statistics.mean(ours.get(t, [0.0])), 2),
            }
            for t in busiest
        },
    }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--ticks", type=int, default=20, help="in-process ticks to time")
    ap.add_argument("--profile", choices=("pool", "allwake", "both"), default="both")
    args = ap.parse_args()
    for profile in ("pool", "allwake") if args.profile == "both" else (args.profile,):
        run_profile(profile, args)


def run_profile(profile: str, args: argparse.Namespace) -> None:
    target = start_target(args.threads, profile)
    try:
        conditions = {
            "profile": profile,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "loadavg_before": os.getloadavg(),
            "python": platform.python_version(),
            "target_threads": psutil.Process(target.pid).num_threads(),
            "interval_s": args.interval,
        }
        print("\n== conditions:", json.dumps(conditions))
        inproc = cost_in_process(target.pid, args.ticks, 0.2)
        print("in-process tick cost:", json.dumps(inproc, default=lambda v: round(v, 3)))
        e2e = cost_and_agreement(target.pid, args.seconds, args.interval)
        print("harness sample subprocess:", json.dumps(e2e, indent=1, default=str))
        print("loadavg after:", os.getloadavg())
    finally:
        target.kill()
        target.wait()


if __name__ == "__main__":
    main()
