"""The load generator's CPU on the master's host, while the server is sampled on another.

On one host, ``harness sample`` records both the server and the load generator (its
parent's process tree), and a run without generator CPU samples is invalid: saturation
could not be judged. With ``--agent`` the sampler runs on the server's host, where the
generator is not, so the master runs this beside it: the system sampler alone, over
the master's process tree (its ``--processes`` children included; workers on other hosts
are measured by nobody, as before), into ``samples/local/``. ``merge`` then puts its
figures on the agent's tick grid — by wall clock, the agent's times moved by the offset
measured at connect — so ``system.loadgen_cpu_pct`` and ``loadgen_processes`` read as
they do on one host. The CPU on the generator's cores that the master's tree did not use
(another tenant on this host) is merged too, as ``system.series.loadgen_foreign_cpu_pct``
over ``loadgen_foreign_cores`` cores: recorded, and judged through what it does to the
generator (dispatch lag, saturation), as on one host (docs/checks.md "Invalid runs").

Run as ``python -m harness.agent.loadgen --out DIR --loadgen-pid PID``: a subprocess, so
the sampling never shares the Locust process's gevent loop.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from harness.collectors.loop import TickLoop
from harness.collectors.run_processes import loadgen_pids, run_pids
from harness.collectors.system import SystemSampler
from harness.primitives import atomic_write, trapped_signals

META = "loadgen.json"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.agent.loadgen")
    ap.add_argument("--out", required=True)
    ap.add_argument("--loadgen-pid", type=int, action="append", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    with trapped_signals(lambda _signum: stop.set()):
        return _sample(out, args.loadgen_pid, args.interval, stop)


def _sample(out: Path, pids: list[int], interval: float, stop: threading.Event) -> int:
    """Sample this host's CPU into ``out`` every ``interval`` s until ``stop`` is set or
    the master (this process's parent) is gone."""
    # the run on this host is the master's tree (by ancestry): the rest is another tenant's
    system = SystemSampler(out, loadgen_pids=loadgen_pids(pids), run_pids=run_pids(pids))
    loop = TickLoop(interval, stop=stop)
    t0 = loop.start()
    system.baseline(time.monotonic() - t0)
    (out / META).write_text(json.dumps({"started_unix": loop.stats.started_unix}))
    parent = os.getppid()

    def tick(t: float, late: float) -> None:
        system.sample(t, time.time(), late)
        if os.getppid() != parent:  # the master is gone: nobody will read this
            stop.set()

    try:
        loop.run(tick)
    finally:
        system.close()
    return 0


def _rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.reader(f))


def merge(samples: Path, local: Path, offset_s: float, tolerance_s: float = 0.75) -> int:
    """Fill ``samples/system.csv``'s ``loadgen_cpu_pct`` (and, when the local sampler
    recorded it, ``loadgen_foreign_cpu_pct`` / ``loadgen_foreign_cores``: the CPU on this
    host's generator cores that was not the run's) and write ``samples/loadgen.csv`` from
    the local measurement in ``local``; each agent tick takes the local tick nearest in
    wall-clock time (within ``tolerance_s``, else left empty). Returns the ticks filled."""
    agent_rows = _rows(samples / "system.csv")
    local_rows = _rows(local / "system.csv")
    if len(agent_rows) < 2 or len(local_rows) < 2:
        return 0
    ah, lh = agent_rows[0], local_rows[0]
    a_t, a_ts, a_lg = ah.index("t"), ah.index("ts"), ah.index("loadgen_cpu_pct")
    l_t, l_ts, l_lg = lh.index("t"), lh.index("ts"), lh.index("loadgen_cpu_pct")
    # (local column → agent column) copied tick by tick besides the generator's CPU
    extra = [
        (lh.index(src), dst)
        for src, dst in (
            ("foreign_cpu_pct", "loadgen_foreign_cpu_pct"),
            ("foreign_cores", "loadgen_foreign_cores"),
        )
        if src in lh
    ]
    for _, dst in extra:
        if dst not in ah:
            ah.append(dst)
            for row in agent_rows[1:]:
                row.append("")
    extra_at = [(src, ah.index(dst)) for src, dst in extra]
    local_ts = [float(r[l_ts]) for r in local_rows[1:]]
    t_map: dict[float, str] = {}  # local t → the agent's t (as written) it stands for
    filled = 0
    for row in agent_rows[1:]:
        when = float(row[a_ts]) - offset_s  # the agent's tick on the master's clock
        i = bisect.bisect_left(local_ts, when)
        near = [j for j in (i - 1, i) if 0 <= j < len(local_ts)]
        j = min(near, key=lambda k: abs(local_ts[k] - when))
        if abs(local_ts[j] - when) > tolerance_s:
            row[a_lg] = ""
            for _, dst in extra_at:
                row[dst] = ""
            continue
        lrow = local_rows[1 + j]
        row[a_lg] = lrow[l_lg]
        for src, dst in extra_at:
            row[dst] = lrow[src]
        t_map.setdefault(float(lrow[l_t]), row[a_t])
        filled += 1
    _write(samples / "system.csv", agent_rows)
    lg = _rows(local / "loadgen.csv")
    if lg:
        t_col = lg[0].index("t")
        out = [lg[0]]
        for r in lg[1:]:
            agent_t = t_map.get(float(r[t_col]))
            if agent_t is not None:
                out.append([agent_t if k == t_col else v for k, v in enumerate(r)])
        _write(samples / "loadgen.csv", out)
    return filled


def _write(path: Path, rows: list[list[str]]) -> None:
    text = io.StringIO()
    csv.writer(text).writerows(rows)
    atomic_write(path, text.getvalue())


if __name__ == "__main__":
    raise SystemExit(main())
