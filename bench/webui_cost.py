"""What the web UI's Checklist tab costs the load generator while a run is at ~1,000 req/s.

    python bench/webui_cost.py [--rate 1000] [--duration 60] [--poll-s 2]

Starts the bundled reference server with the ``sim`` model (a batching server whose
model time is a sleep, so one core answers well over 1,000 req/s) and ``locust -f
locustfiles/inference.py`` with its web UI on loopback, starts ``steady_state`` from the
UI's ``/swarm`` endpoint with the capacity pinned so that its 0.6x stage is ``--rate``
req/s, and polls ``/stats/requests`` every ``--poll-s`` seconds as Locust's browser UI
does (the Checklist tab's rows ride on that poll). It prints:

- the tab's own CPU: every poll's extra work (rows, live judging of the run so far,
  JSON), counted by the plugin with ``time.thread_time`` around it, over the run's wall
  time — the figure the target (< 2 % of a core) is about;
- the whole Locust process's CPU over the same window (psutil), for scale;
- the rate achieved, so a run where the generator or the server fell short shows.

Conditions are printed with the figures. Processes are stopped by pid in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    return urllib.request.urlopen(url, timeout=10).read()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="req/s of the measured stage")
    ap.add_argument("--duration", type=float, default=60.0, help="the scenario's length, s")
    ap.add_argument("--poll-s", type=float, default=2.0, help="the UI's poll interval")
    args = ap.parse_args()

    port = _free_port()
    out = Path(tempfile.mkdtemp(prefix="webui-cost-"))
    server = (
        f"{sys.executable} -m harness_reference_server --model sim --sim-base-ms 2 --sim-item-ms 0.05 "
        "--max-batch-size 64 --port {port} --workers {threads}"
    )
    cmd = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "inference.py"),
        "--web-host", "127.0.0.1", "--web-port", str(port),
        "--scenario", "steady_state", "--quick", "--out", str(out),
        "--capacity-rps", str(args.rate / 0.6), "--duration", str(args.duration),
        "--sut-cmd", server,
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=(out / "locust.log").open("w"), stderr=subprocess.STDOUT
    )
    try:
        for _ in range(120):
            try:
                _get(base + "/")
                break
            except OSError:
                time.sleep(0.5)
        me = psutil.Process(proc.pid)
        req = urllib.request.Request(base + "/swarm", data=urllib.parse.urlencode({}).encode())
        started = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert started.get("success"), started
        t0 = time.monotonic()
        cpu0 = sum(me.cpu_times()[:2])
        while True:
            _get(base + "/stats/requests")  # what the browser polls; the tab rides on it
            live = json.loads(_get(base + "/harness/live.json"))
            if live["run"]["judged"] or time.monotonic() - t0 > args.duration + 300:
                break
            time.sleep(args.poll_s)
        wall = time.monotonic() - t0
        cpu = sum(me.cpu_times()[:2]) - cpu0
        cost = live["cost"]
        doc = json.loads((Path(live["run"]["dir"]) / "results.json").read_text())
        ok = doc["scenarios"][0]["counters"]["ok"]
        print(f"# web UI Checklist tab cost — {time.strftime('%Y-%m-%d %H:%M')}")
        print(
            f"machine: {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()}"
            f" · locust + reference server (sim model) + sampler on the same cores"
        )
        print(
            f"run: steady_state --quick, {args.duration:.0f} s at {args.rate:.0f} req/s offered "
            f"(0.6x of a pinned {args.rate / 0.6:.0f} req/s); UI poll every {args.poll_s:g} s"
        )
        print(
            f"achieved: {ok} ok requests over the run ({ok / args.duration:.0f} req/s mean over its length)"
        )
        print(
            f"tab: {cost['polls']} polls, {cost['snapshots']} live snapshots, "
            f"{cost['poll_cpu_s']:.3f} CPU s over {wall:.1f} s wall = "
            f"{100 * cost['poll_cpu_s'] / wall:.2f} % of a core (target < 2 %)"
        )
        print(
            f"locust process: {cpu:.1f} CPU s over the same {wall:.1f} s = {100 * cpu / wall:.1f} % "
            f"of a core (the tab is {100 * cost['poll_cpu_s'] / max(cpu, 1e-9):.2f} % of it)"
        )
        print(f"verdict: {doc['verdict']} · results in {live['run']['dir']}")
    finally:
        _stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
