"""What ``harness agent`` costs the server's host: its CPU while it samples a 200-thread
server at 1 Hz and a master copies the samples and keeps the lease, as during a run.

Usage: python bench/agent_cost.py [--seconds 60] [--threads 200]

Spawns a python process with ``--threads`` idle threads (the server), a real
``harness agent`` subprocess, and plays the master in this process: the sampler started
through the agent, the files copied every 2 s (``RemoteSampler.follow``'s cadence), the
watchdog's liveness call every 0.5 s, a heartbeat every third of the lease. Reports the
CPU seconds of the agent process and of its ``harness sample`` subprocess over the
measured window (after a warm-up that skips the interpreters' start), as % of one core.
The issue's target: ≤ 1 % of a core in all.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.agent.client import AgentClient, RemoteSut  # noqa: E402
from harness.primitives import cpu_model  # noqa: E402
from harness.sut import free_port  # noqa: E402

SERVER = """
import sys, threading
stop = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=stop.wait, daemon=True).start()
print("ready", flush=True)
stop.wait()
"""
TOKEN = "bench-agent-token"
WARMUP_S = 5.0


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window (default 60)")
    ap.add_argument("--threads", type=int, default=200, help="server threads (default 200)")
    args = ap.parse_args()

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.threads)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agent-cost-") as tmp:
        agent = subprocess.Popen(
            [sys.executable, "-m", "harness", "agent", "--port", str(port), "--dir", tmp],
            cwd=REPO,
            env={**os.environ, "HARNESS_AGENT_TOKEN": TOKEN},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert agent.stderr is not None and "listening" in agent.stderr.readline()
            sut = RemoteSut(AgentClient(f"http://127.0.0.1:{port}", TOKEN), server.pid)
            sut.start_heartbeat()
            out = Path(tmp) / "master-samples"
            sampler = sut.start_sampler(out, None)
            sampler_pid = next(
                c.pid for c in psutil.Process(agent.pid).children() if "sample" in c.cmdline()
            )
            t_end = time.monotonic() + WARMUP_S + args.seconds
            marks: dict[str, tuple[float, float, float]] = {}
            next_fetch = next_alive = time.monotonic()
            while (now := time.monotonic()) < t_end:
                if "start" not in marks and now >= t_end - args.seconds:
                    marks["start"] = (now, cpu_s(agent.pid), cpu_s(sampler_pid))
                if now >= next_alive:
                    sut.alive()
                    next_alive += 0.5
                if now >= next_fetch:
                    sampler.fetch()
                    next_fetch += 2.0
                time.sleep(max(0.0, min(next_alive, next_fetch) - time.monotonic()))
            end = (time.monotonic(), cpu_s(agent.pid), cpu_s(sampler_pid))
            samples = sampler.finish()
            sut.close()
        finally:
            agent.terminate()
            agent.wait(15)
            server.kill()
            server.wait(5)

    t0, a0, s0 = marks["start"]
    t1, a1, s1 = end
    wall = t1 - t0
    agent_pct = 100.0 * (a1 - a0) / wall
    sampler_pct = 100.0 * (s1 - s0) / wall
    threads = (samples or {}).get("server", {}).get("series", {}).get("threads") or []
    ticks = len(threads)
    cpu = cpu_model() or platform.processor()
    print(
        f"harness agent cost, {wall:.0f} s measured after a {WARMUP_S:g} s warm-up: server "
        f"with {max(threads, default=0)} threads sampled at 1 Hz ({ticks} ticks), samples "
        "copied every 2 s, liveness every 0.5 s, heartbeat every lease/3"
    )
    print(f"  agent process (HTTP, lease, copies): {agent_pct:.2f} % of a core")
    print(f"  its harness sample subprocess:       {sampler_pct:.2f} % of a core")
    print(
        f"  total:                               {agent_pct + sampler_pct:.2f} % of a core "
        f"(target <= 1 %)"
    )
    print(f"  on {cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    return 0 if agent_pct + sampler_pct <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
