"""The fixed cost of ``harness run`` / ``harness acceptance``: the wall time a run spends
outside its load (start-up before the first request, wrap-up after the last), by phase.

Each run is ``python -m harness run SCENARIO --quick --duration D --out DIR
--locust-arg=--capacity-rps=R`` (or ``harness acceptance --scenarios A,B`` with
``--scenarios``), timed from outside. Every Python process of the run (the CLI, Locust,
the server, its guard, the sampler) loads a ``sitecustomize`` from a scratch directory
that logs, with the wall clock, its own start and exit, the first import of a few heavy
packages, the processes it spawns and the report files it writes (``os.replace`` of
``results.json``, ``junit.xml``, ``summary.md``, ``report.html``: ``atomic_write``). The
results document adds when the load started, how long it ran and the server's time to
ready. Nothing in the harness is changed to be measured.

    python bench/run_overhead.py                          # steady_state, 5 s, 3 runs
    python bench/run_overhead.py --runs 5 --duration 5
    python bench/run_overhead.py --scenarios steady_state,spike --runs 1
    python bench/run_overhead.py --processes 2            # Locust master + 2 workers

Each run's line also says how late its sends left (the results' dispatch lag: its
maximum, which a first send made late by a short start-up lead would set) and the p50
of its first requests' latency, taken from their intended send times.

Run it alone (``flock /tmp/harness-cpu.lock python bench/run_overhead.py``): the figures
are timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Loaded by every Python process of the run (PYTHONPATH): one tab-separated line per event.
SITECUSTOMIZE = r"""
import atexit, os, sys, time
_LOG = os.environ.get("RUN_OVERHEAD_LOG")
if _LOG:
    _PID = os.getpid()
    _SEEN = set()
    _WATCH = {"numpy", "scipy", "gevent", "locust", "matplotlib", "harness.checks",
              "harness.report.html", "harness.load.plugin"}
    _NAMES = ("results.json", "junit.xml", "summary.md", "report.html")

    def _log(event, detail=""):
        with open(_LOG, "a") as f:
            f.write(f"{time.time():.6f}\t{_PID}\t{os.getppid()}\t{event}\t{detail}\n")

    _log("start", " ".join(sys.orig_argv[1:4]))

    def _hook(event, args):
        if event == "import":
            if args[0] in _WATCH and args[0] not in _SEEN:
                _SEEN.add(args[0])
                _log("import", args[0])
        elif event == "os.rename":
            if str(args[1]).endswith(_NAMES):
                _log("write", str(args[1]))

    sys.addaudithook(_hook)
    atexit.register(_log, "exit")
"""


@dataclass
class Proc:
    pid: int
    ppid: int
    argv: str
    start: float
    exit: float | None = None
    imports: dict[str, float] = field(default_factory=dict)
    writes: list[tuple[float, str]] = field(default_factory=list)


def read_log(path: Path) -> dict[int, Proc]:
    procs: dict[int, Proc] = {}
    for line in path.read_text().splitlines():
        ts, pid, ppid, event, detail = line.split("\t")
        t, p = float(ts), int(pid)
        if event == "start":
            procs[p] = Proc(p, int(ppid), detail, t)
        elif p in procs:
            if event == "exit":
                procs[p].exit = t
            elif event == "import":
                procs[p].imports[detail] = t
            elif event == "write":
                procs[p].writes.append((t, detail))
    return procs


def first_write(proc: Proc, name: str) -> float | None:
    return next((t for t, d in proc.writes if d.endswith(name)), None)


def last_write(proc: Proc, names: tuple[str, ...]) -> float | None:
    ts = [t for t, d in proc.writes if d.endswith(names)]
    return max(ts) if ts else None


def phases(procs: dict[int, Proc], out: Path, launched: float, ended: float) -> list[dict]:
    """One row per scenario: the phases of its run, in seconds (None: not observed)."""
    cli = min(procs.values(), key=lambda p: p.start)
    children = sorted((p for p in procs.values() if "-m locust" in p.argv), key=lambda p: p.start)
    rows = []
    prev_end = launched
    for i, loc in enumerate(children):
        server = min(
            (
                p
                for p in procs.values()
                if p.ppid == loc.pid and "harness_reference_server" in p.argv
            ),
            key=lambda p: p.start,
            default=None,
        )
        scenario_dirs = sorted(d for d in out.iterdir() if (d / "results.json").exists())
        doc = None
        for d in scenario_dirs:
            cand = json.loads((d / "results.json").read_text())
            sc = (cand.get("scenarios") or [{}])[0]
            t0 = sc.get("started_unix")
            if t0 is not None and loc.start < t0 < (loc.exit or ended):
                doc = sc
        if doc is None:
            continue
        load_start = doc["started_unix"]
        load_end = load_start + doc["duration_s"]
        ready = (
            server.start + doc["time_to_ready_s"] if server and doc.get("time_to_ready_s") else None
        )
        written = first_write(loc, "results.json")
        last = i == len(children) - 1
        top = first_write(cli, "/results.json") if last else None
        reports = last_write(cli, ("junit.xml", "summary.md", "report.html")) if last else None
        row = {
            "scenario": doc["name"],
            "before Locust (CLI: imports, plan)": loc.start - prev_end,
            "Locust start → server spawned": (server.start - loc.start) if server else None,
            "server spawned → ready": doc.get("time_to_ready_s"),
            "ready → first request": (load_start - ready) if ready else None,
            "LOAD": doc["duration_s"],
            "load end → scenario results.json": (written - load_end) if written else None,
            "→ Locust exit (judging, stop)": (loc.exit - written) if loc.exit and written else None,
        }
        if last:
            row["Locust exit → results.json (CLI)"] = (top - loc.exit) if top and loc.exit else None
            row["→ reports written"] = (reports - top) if reports and top else None
            row["→ harness exit"] = (ended - reports) if reports else None
        rows.append(row)
        prev_end = loc.exit or prev_end
    return rows


def lateness(out: Path) -> str:
    """The sends' lateness of every scenario of a run: dispatch lag max, first-requests p50."""
    from harness.analysis import hdr

    said = []
    for d in sorted(p.parent for p in out.glob("*/results.json")):
        sc = json.loads((d / "results.json").read_text())["scenarios"][0]
        lag = hdr.decode(sc.get("dispatch_lag_hdr"))
        first = hdr.decode((sc.get("first_requests") or {}).get("latency_hdr"))
        p50 = hdr.percentile_ms(first, 50.0)
        said.append(
            f"{sc['name']}: dispatch lag max {lag.get_max_value() / 1000:.1f} ms, "
            f"first requests p50 {'–' if p50 is None else f'{p50:.1f}'} ms"
        )
    return "; ".join(said)


def one_run(args: argparse.Namespace, work: Path, index: int) -> tuple[list[dict], float]:
    out = work / f"run{index}"
    log = work / f"events{index}.tsv"
    site = work / "site"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RUN_OVERHEAD_LOG": str(log),
    }
    if args.scenarios:
        cmd = ["acceptance", "--scenarios", args.scenarios]
    else:
        cmd = ["run", args.scenario, "--duration", str(args.duration)]
    argv = [sys.executable, "-m", "harness", *cmd, "--quick", "--out", str(out)]
    argv.append(f"--locust-arg=--capacity-rps={args.capacity_rps}")
    if args.processes:
        argv.append(f"--locust-arg=--processes={args.processes}")
    launched = time.time()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    ended = time.time()
    if proc.returncode not in (0, 1):
        sys.exit(f"harness exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    verdict = json.loads((out / "results.json").read_text())["verdict"]
    rows = phases(read_log(log), out, launched, ended)
    load = sum(r["LOAD"] for r in rows)
    wall = ended - launched
    print(f"run {index}: wall {wall:.2f} s, load {load:.2f} s, fixed cost {wall - load:.2f} s, "
          f"verdict {verdict}; {lateness(out)}")  # fmt: skip
    return rows, wall - load


def conditions() -> str:
    load1, load5, _ = os.getloadavg()
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
         if ln.startswith("model name")), platform.processor()
    )  # fmt: skip
    return (
        f"{os.cpu_count()} CPUs ({cpu}), load average {load1:.2f}/{load5:.2f}, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="steady_state")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--scenarios", default=None, help="run `harness acceptance --scenarios`")
    ap.add_argument("--capacity-rps", type=float, default=600.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--processes", type=int, default=0, help="Locust workers (--processes N)")
    ap.add_argument("--keep", default=None, help="keep the runs' directories here")
    args = ap.parse_args()
    print(conditions())
    work = Path(args.keep or tempfile.mkdtemp(prefix="run_overhead-"))
    (work / "site").mkdir(parents=True, exist_ok=True)
    (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    all_rows: list[list[dict]] = []
    fixed: list[float] = []
    for i in range(1, args.runs + 1):
        rows, cost = one_run(args, work, i)
        all_rows.append(rows)
        fixed.append(cost)
    print(f"\nphase medians over {args.runs} run(s), seconds:")
    for s, scenario_rows in enumerate(zip(*all_rows, strict=False)):
        print(f"  scenario {s + 1}: {scenario_rows[0]['scenario']}")
        for key in scenario_rows[0]:
            if key == "scenario":
                continue
            vals = [r[key] for r in scenario_rows if r.get(key) is not None]
            med = f"{statistics.median(vals):6.2f}" if vals else "     –"
            each = " ".join(f"{v:5.2f}" for v in vals)
            print(f"    {key:<36} {med}   ({each})")
    print(
        f"\nfixed cost (wall − load): median {statistics.median(fixed):.2f} s "
        f"({', '.join(f'{c:.2f}' for c in fixed)})"
    )
    print(f"(the runs' directories and event logs: {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
