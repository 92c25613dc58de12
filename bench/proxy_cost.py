"""What the network scenario's fault proxy costs when no toxic is on: added p50 latency
and the proxy process's own CPU, at the scenario's rate and above.

The same reference server is driven at a constant rate alternately straight and through
``harness.chaos.proxy.FaultProxy`` (blocks of ``--block-s``, ABAB so slow drift on a
shared box cancels), with keep-alive connections from a small thread pool, as the
harness's users hold them. Reported per rate: p50 and p99 direct vs proxied, the
difference, and the proxy's CPU % of one core (its user + system seconds over the
proxied blocks' wall time).

    python bench/proxy_cost.py                      # 80 req/s (network.toml) and 400
    python bench/proxy_cost.py --rates 80,400,800 --block-s 10

Run it alone (``flock /tmp/harness-cpu.lock nice -n 19 python bench/proxy_cost.py``):
the figures are timings.
"""

from __future__ import annotations

import argparse
import http.client
import json
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.chaos.proxy import FaultProxy  # noqa: E402 — needs the repo root on sys.path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(base: str) -> tuple[str, bytes]:
    meta = json.loads(urllib.request.urlopen(f"{base}/v2", timeout=5).read())
    model = meta.get("model") or "mlp"
    mm = json.loads(urllib.request.urlopen(f"{base}/v2/models/{model}", timeout=5).read())
    inp = mm["inputs"][0]
    shape = [1 if d == -1 else d for d in inp["shape"]]
    n = 1
    for d in shape:
        n *= d
    doc = {"inputs": [{"name": inp["name"], "shape": shape, "datatype": inp["datatype"],
                       "data": [0.5] * n}]}  # fmt: skip
    return f"/v2/models/{model}/infer", json.dumps(doc).encode()


def drive(port: int, path: str, body: bytes, rate: float, seconds: float) -> list[float]:
    """Constant-rate requests for ``seconds``; latencies (ms) from the intended send time."""
    due: queue.Queue[float | None] = queue.Queue()
    lat: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while (t := due.get()) is not None:
            wait = t - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            conn.getresponse().read()
            with lock:
                lat.append((time.perf_counter() - t) * 1000.0)
        conn.close()

    workers = [threading.Thread(target=worker) for _ in range(16)]
    for w in workers:
        w.start()
    t0 = time.perf_counter() + 0.2
    for i in range(int(rate * seconds)):
        due.put(t0 + i / rate)
    for _ in workers:
        due.put(None)
    for w in workers:
        w.join()
    return lat


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="80,400", help="req/s, comma-separated")
    ap.add_argument("--block-s", type=float, default=8.0)
    ap.add_argument("--cycles", type=int, default=2)
    a = ap.parse_args()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "harness_reference_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy = None
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if urllib.request.urlopen(f"{base}/v2/health/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        path, body = _body(base)
        proxy = FaultProxy("127.0.0.1", port).start(register=False)
        assert proxy.port is not None and proxy.pid is not None
        pp = psutil.Process(proxy.pid)
        drive(port, path, body, 50, 2)  # warm the server
        print(f"request body {len(body)} B; blocks of {a.block_s:g} s, {a.cycles} cycle(s)")
        print("| rate req/s | p50 direct ms | p50 proxied ms | added p50 ms | p99 direct ms | "
              "p99 proxied ms | proxy CPU % of a core |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for rate in (float(r) for r in a.rates.split(",")):
            direct: list[float] = []
            proxied: list[float] = []
            cpu_s = wall_s = 0.0
            for _ in range(a.cycles):
                direct += drive(port, path, body, rate, a.block_s)
                c0, w0 = sum(pp.cpu_times()[:2]), time.perf_counter()
                proxied += drive(proxy.port, path, body, rate, a.block_s)
                cpu_s += sum(pp.cpu_times()[:2]) - c0
                wall_s += time.perf_counter() - w0
            p50d, p50p = statistics.median(direct), statistics.median(proxied)
            print(
                f"| {rate:g} | {p50d:.2f} | {p50p:.2f} | {p50p - p50d:+.2f} | "
                f"{_pct(direct, 0.99):.2f} | {_pct(proxied, 0.99):.2f} | "
                f"{100.0 * cpu_s / wall_s:.1f} |"
            )
    finally:
        if proxy is not None:
            proxy.stop()
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
