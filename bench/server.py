"""Benchmark of the reference server: model ceiling, served throughput, batching ratio.

    python bench/server.py [--duration 3] [--rounds 3] [--repeat 1] [--model-args "..."]
                           [--small-model-args "..."]

Prints its conditions, then:
  * in-process model throughput at batch 1 and at max batch (its undisturbed speed, the
    best of short windows);
  * served throughput, p50 and p99 at concurrency 1, 8, 32, 64 with batching on and with
    --max-batch-size 1, their ratio, and server CPU seconds per request;
  * the same at concurrency 32 for a small model (HTTP-bound: the server's own overhead);
  * the goals, each beside its anchor measured in the same run, and whether it is met:
    batching at 1 user >= 0.95x no batching, at 32 users >= 90 % of the in-process
    ceiling and >= 4x no batching, and the small model >= 1,500 req/s at 32 users.

Both servers of a model (batching on, max batch 1) run side by side; each concurrency's
``--duration`` seconds are split into ``--rounds`` rounds that alternate between them
(each round after a 0.5 s warm-up), and the in-process model is timed right before and
right after each batching round, as long as the round: every ratio compares figures
taken seconds apart, pooled over rounds, so a slow or fast moment of a shared box falls
on both sides alike. The load generator is a keep-alive raw-socket HTTP/1.1 client in
2 processes x threads, closed loop, on the same box as the server (loopback only); the
cores it used are printed beside the server's, so a run where it was the bottleneck says
so. The whole run takes about 3 minutes. With ``--repeat N`` the whole measurement runs N
times, one after the other, and each goal is judged on the median of its N figures (the
lower middle one for an even N), every run's figure printed beside it
(docs/performance.md says why one run does not decide).
"""

from __future__ import annotations

import os

# BLAS threads must be fixed before numpy loads (same default as the server: 1).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.testing.server import start_server  # noqa: E402
from harness_reference_server.config import parse_config  # noqa: E402
from harness_reference_server.models import build_model  # noqa: E402

CONCURRENCY = (1, 8, 32, 64)
# The goals: (batching / no batching at 1 user), (served at 32 users / in-process ceiling
# at max batch), (batching / no batching at 32 users), small model req/s at 32 users.
GOAL_LONE_RATIO = 0.95
GOAL_CEILING_SHARE = 0.90
GOAL_BATCHING_RATIO = 4.0
GOAL_SMALL_RPS = 1500.0


# -- in-process ceiling -----------------------------------------------------------------


class InProcessModel:
    """The server's model in this process, one thread: its throughput at a batch size."""

    def __init__(self, argv: list[str]) -> None:
        self.model = build_model(parse_config(argv))
        self._x: dict[int, np.ndarray] = {}

    def _input(self, batch: int) -> np.ndarray:
        if batch not in self._x:
            rng = np.random.default_rng(0)
            self._x[batch] = rng.standard_normal((batch, self.model.input.width), dtype=np.float32)
            for _ in range(3):
                self.model.predict(self._x[batch])
        return self._x[batch]

    def best(self, batch: int, seconds: float, windows: int = 5) -> float:
        """Samples/s of the best of ``windows`` short windows (noise on a shared box only
        slows): the model's speed when nothing disturbs it."""
        return max(self.mean(batch, seconds / windows) for _ in range(windows))

    def mean(self, batch: int, seconds: float) -> float:
        """Samples/s over one window of ``seconds``: the statistic a served point reports."""
        x = self._input(batch)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.model.predict(x)
            n += 1
        return n * batch / (time.perf_counter() - t0)


# -- fast client ----------------------------------------------------------------------


def _request_bytes(port: int, model: str, width: int) -> bytes:
    body = json.dumps(
        {
            "id": "b",
            "inputs": [
                {"name": "input", "shape": [1, width], "datatype": "FP32", "data": [0.25] * width}
            ],
        }
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def _exchange(sock: socket.socket, req: bytes, buf: bytearray) -> int:
    sock.sendall(req)
    while (end := buf.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    head = bytes(buf[: end + 2]).lower()  # keep the last header line's CRLF
    status = int(head[9:12])
    i = head.find(b"content-length:")
    length = int(head[i + 15 : head.find(b"\r\n", i)]) if i >= 0 else 0
    total = end + 4 + length
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    del buf[:total]
    return status


def _client_process(
    port: int, req: bytes, threads: int, warmup: float, seconds: float, out
) -> None:  # type: ignore[no-untyped-def]
    start = time.perf_counter() + warmup
    stop = start + seconds
    cpu0 = time.process_time()  # all of this process's threads
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads

    def run(k: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        mine = lat[k]
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop:
                    return
                status = _exchange(sock, req, buf)
                t1 = time.perf_counter()
                if t0 >= start:
                    if status == 200:
                        mine.append(t1 - t0)
                    else:
                        errors[k] += 1
        finally:
            sock.close()

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put(
        (
            np.concatenate([np.asarray(x) for x in lat]) if any(lat) else np.zeros(0),
            sum(errors),
            time.process_time() - cpu0,
        )
    )


def model_counters(port: int, model: str) -> tuple[int, int, int]:
    """(executions, inferences, model ns) so far, from the server's statistics extension."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)["model_stats"][0]
    infer_ns = sum(b["compute_infer"]["ns"] for b in doc["batch_stats"])
    return doc["execution_count"], doc["inference_count"], infer_ns


def served_point(
    port: int, pid: int, req: bytes, concurrency: int, seconds: float, model: str
) -> dict[str, Any]:
    """One closed-loop window's raw figures (``pooled`` turns rounds of them into a point)."""
    procs = 1 if concurrency == 1 else 2
    per = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    warmup = 0.5
    q: mp.Queue = mp.Queue()
    server = psutil.Process(pid)
    workers = [
        mp.Process(target=_client_process, args=(port, req, n, warmup, seconds, q)) for n in per
    ]
    for w in workers:
        w.start()
    time.sleep(warmup)  # the clients measure from the same instant
    cpu0 = sum(server.cpu_times()[:2])
    stats0 = model_counters(port, model)
    t0 = time.perf_counter()
    results = [q.get(timeout=seconds + 60) for _ in workers]
    elapsed = time.perf_counter() - t0
    cpu1 = sum(server.cpu_times()[:2])
    executions, inferences, infer_ns = (
        b - a for a, b in zip(stats0, model_counters(port, model), strict=True)
    )
    for w in workers:
        w.join(30)
    return {
        "lat": np.concatenate([r[0] for r in results]),
        "window_s": min(elapsed, seconds),
        "elapsed_s": elapsed,
        "server_cpu_s": cpu1 - cpu0,
        # the clients' CPU over their warm-up and window: an upper bound for the window
        "client_cpu_s": sum(r[2] for r in results),
        "client_s": seconds + warmup,
        "errors": sum(r[1] for r in results),
        "executions": executions,
        "inferences": inferences,
        "infer_ns": infer_ns,
    }


def pooled(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """One point's figures from its rounds, pooled: every request and second counted once."""
    lat = np.concatenate([r["lat"] for r in rounds])
    n = len(lat)
    elapsed = sum(r["elapsed_s"] for r in rounds)
    cpu = sum(r["server_cpu_s"] for r in rounds)
    executions = sum(r["executions"] for r in rounds)
    infer_ns = sum(r["infer_ns"] for r in rounds)
    return {
        "rps": n / sum(r["window_s"] for r in rounds),
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if n else float("nan"),
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if n else float("nan"),
        "cpu_s_per_req": cpu / n if n else float("nan"),
        "server_cores": cpu / elapsed,
        "client_cores": sum(r["client_cpu_s"] for r in rounds) / sum(r["client_s"] for r in rounds),
        "errors": sum(r["errors"] for r in rounds),
        "n": n,
        "mean_batch": sum(r["inferences"] for r in rounds) / executions
        if executions
        else float("nan"),
        "model_busy": infer_ns / 1e9 / elapsed,
        "model_ms_per_batch": infer_ns / 1e6 / executions if executions else float("nan"),
    }


def served_pairs(
    server_args: list[str],
    model: str,
    width: int,
    levels: tuple[int, ...],
    seconds: float,
    ceiling: Callable[[float], float] | None = None,
    rounds: int = 3,
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """(batching on, --max-batch-size 1): both servers run at once, and each concurrency's
    ``seconds`` are split into ``rounds`` that alternate between them, pooled per server.
    With ``ceiling``, the in-process model's throughput is also measured right before and
    right after each batching round, as long as the round (the servers idle meanwhile), as
    ``ceiling_before`` and ``ceiling_after`` (means over the rounds). This box's speed
    drifts by ten percent and more within seconds: a ratio between two figures is only
    honest when slow and fast moments fall on both alike."""
    batched: dict[int, dict[str, float]] = {}
    single: dict[int, dict[str, float]] = {}
    per_round = seconds / rounds
    with contextlib.ExitStack() as stack:
        on = stack.enter_context(
            start_server(*server_args, "--queue-size", "1024", ready_timeout=60)
        )
        off = stack.enter_context(
            start_server(
                *server_args, "--max-batch-size", "1", "--queue-size", "1024", ready_timeout=60
            )
        )
        req_on = _request_bytes(on.port, model, width)
        req_off = _request_bytes(off.port, model, width)
        for c in levels:
            a: list[dict[str, Any]] = []
            b: list[dict[str, Any]] = []
            before: list[float] = []
            after: list[float] = []
            for _ in range(rounds):
                if ceiling is not None:
                    before.append(ceiling(per_round))
                a.append(served_point(on.port, on.pid, req_on, c, per_round, model))
                if ceiling is not None:
                    after.append(ceiling(per_round))
                b.append(served_point(off.port, off.pid, req_off, c, per_round, model))
            batched[c], single[c] = pooled(a), pooled(b)
            if ceiling is not None:
                batched[c]["ceiling_before"] = sum(before) / rounds
                batched[c]["ceiling_after"] = sum(after) / rounds
    return batched, single


def adjacent_ceiling(point: dict[str, float]) -> float:
    """The in-process ceiling a served point is judged against: the mean of the
    measurements right before and right after each of its rounds, each as long as a round."""
    return (point["ceiling_before"] + point["ceiling_after"]) / 2


def _ms(cfg: Any, samples_per_s: float) -> str:
    return f"{cfg.max_batch_size / samples_per_s * 1e3:.1f}"


def goal_figures(
    batched: dict[int, dict[str, float]],
    single: dict[int, dict[str, float]],
    small_rps: float,
) -> dict[str, float]:
    """Each goal's figure, from one run: the keys of GOALS."""
    return {
        "lone": batched[1]["rps"] / single[1]["rps"],
        "share": batched[32]["rps"] / adjacent_ceiling(batched[32]),
        "ratio": batched[32]["rps"] / single[32]["rps"],
        "small": small_rps,
    }


# goal key -> (what it says, its target, how its figure prints)
GOALS: dict[str, tuple[str, float, str]] = {
    "lone": (
        f"batching at 1 user >= {GOAL_LONE_RATIO:.2f}x no batching",
        GOAL_LONE_RATIO,
        "{:.2f}x",
    ),
    "share": (
        f"batching at 32 users >= {GOAL_CEILING_SHARE:.0%} of the in-process ceiling",
        GOAL_CEILING_SHARE,
        "{:.1%}",
    ),
    "ratio": (
        f"batching at 32 users >= {GOAL_BATCHING_RATIO:.0f}x no batching",
        GOAL_BATCHING_RATIO,
        "{:.1f}x",
    ),
    "small": (
        f"small model at 32 users >= {GOAL_SMALL_RPS:,.0f} req/s",
        GOAL_SMALL_RPS,
        "{:,.0f} req/s",
    ),
}


def median_goals(runs: list[dict[str, float]]) -> list[tuple[str, str, str, bool]]:
    """(goal, median, every run's figure, met) for each goal over runs: the median is the
    lower middle figure for an even count, so an even split is not rounded up to a pass."""
    rows = []
    for key, (goal, target, fmt) in GOALS.items():
        figures = [run[key] for run in runs]
        middle = sorted(figures)[(len(figures) - 1) // 2]
        each = ", ".join(fmt.format(f) for f in figures)
        rows.append((goal, fmt.format(middle), each, middle >= target))
    return rows


def goal_rows(
    batched: dict[int, dict[str, float]],
    single: dict[int, dict[str, float]],
    small_rps: float,
) -> list[tuple[str, str, str, bool]]:
    """(goal, measured, anchor, met) for each goal, from figures of the same run."""
    figures = goal_figures(batched, single, small_rps)
    ceiling = adjacent_ceiling(batched[32])
    served = {  # what each figure was computed from, printed beside it
        "lone": (
            f" ({batched[1]['rps']:,.0f} req/s)",
            f"max-batch 1 at 1 user: {single[1]['rps']:,.0f} req/s",
        ),
        "share": (
            f" ({batched[32]['rps']:,.0f} req/s)",
            f"in-process model at max batch, right before and after: {ceiling:,.0f} samples/s "
            f"({batched[32]['ceiling_before']:,.0f} / {batched[32]['ceiling_after']:,.0f})",
        ),
        "ratio": (
            f" ({batched[32]['rps']:,.0f} req/s)",
            f"max-batch 1 at 32 users: {single[32]['rps']:,.0f} req/s",
        ),
        "small": ("", "(absolute)"),
    }
    rows = []
    for key, (goal, target, fmt) in GOALS.items():
        beside, anchor = served[key]
        rows.append((goal, fmt.format(figures[key]) + beside, anchor, figures[key] >= target))
    return rows


# -- table ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measured point")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds each point's seconds are split into, alternating between the servers",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="whole measurements, one after the other (each goal judged on the median)",
    )
    p.add_argument("--model-args", default="--model mlp", help="server flags of the main model")
    p.add_argument(
        "--small-model-args",
        default="--model mlp --mlp-dims 256,64,10",
        help="server flags of the small (HTTP-bound) model",
    )
    ns = p.parse_args(argv)
    model_args = shlex.split(ns.model_args)
    small_args = shlex.split(ns.small_model_args)
    cfg = parse_config(model_args)
    small = parse_config(small_args)

    print("# harness_reference_server benchmark")
    print(
        f"machine: {platform.node()} cpus={os.cpu_count()} python={platform.python_version()} "
        f"affinity={sorted(os.sched_getaffinity(0))} load_avg={os.getloadavg()[0]:.2f}"
    )
    print(
        f"model: {shlex.join(model_args)} dims={list(cfg.mlp_dims) if cfg.model == 'mlp' else list(cfg.sim_dims)} "
        f"max_batch={cfg.max_batch_size} max_delay_ms={cfg.max_delay_ms} workers={cfg.workers} "
        f"BLAS threads={os.environ['OPENBLAS_NUM_THREADS']}"
    )
    print(
        f"client: raw-socket keep-alive HTTP/1.1, closed loop, 2 processes x threads, same box; "
        f"{ns.duration:g} s per point in {ns.rounds} rounds alternating between the two servers, "
        "each after a 0.5 s warm-up; batch-1 requests; queue-size 1024"
    )
    print()

    runs = []
    for i in range(max(1, ns.repeat)):
        if ns.repeat > 1:
            print(f"# run {i + 1} of {ns.repeat} (load_avg={os.getloadavg()[0]:.2f})")
            print()
        runs.append(measure(ns, cfg, small, model_args, small_args))
    if len(runs) > 1:
        print(f"## goals at the median of {len(runs)} runs")
        print("| goal | median | each run | met |")
        print("|---|---:|---|---|")
        for goal, middle, each, met in median_goals(runs):
            print(f"| {goal} | {middle} | {each} | {'yes' if met else '**no**'} |")
    return 0


def measure(
    ns: argparse.Namespace, cfg: Any, small: Any, model_args: list[str], small_args: list[str]
) -> dict[str, float]:
    """One whole measurement, its tables printed; returns its goal figures (goal_figures)."""
    inproc = InProcessModel(model_args)
    b1 = inproc.best(1, 1.5)
    bmax = inproc.best(cfg.max_batch_size, 1.5)
    print("## in-process model (one thread, best of 5 windows: its undisturbed speed)")
    print("| batch | samples/s | cost vs batch 1 |")
    print("|---:|---:|---:|")
    print(f"| 1 | {b1:,.0f} | 1.0x |")
    print(f"| {cfg.max_batch_size} | {bmax:,.0f} | {cfg.max_batch_size * b1 / bmax:.1f}x |")
    print()

    width = cfg.mlp_dims[0] if cfg.model == "mlp" else cfg.sim_dims[0]
    name = cfg.served_name
    batched, single = served_pairs(
        model_args,
        name,
        width,
        CONCURRENCY,
        ns.duration,
        ceiling=lambda seconds: inproc.mean(cfg.max_batch_size, seconds),
        rounds=ns.rounds,
    )
    print(f"## served: {shlex.join(model_args)}")
    print(
        "| concurrency | batching req/s | p50 ms | p99 ms | CPU s/req | "
        "max-batch 1 req/s | p50 ms | p99 ms | CPU s/req | ratio | errors | "
        "cores: server / load generator (batching) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in CONCURRENCY:
        a, s = batched[c], single[c]
        print(
            f"| {c} | {a['rps']:,.0f} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} | {a['cpu_s_per_req'] * 1e3:.2f}e-3 "
            f"| {s['rps']:,.0f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {s['cpu_s_per_req'] * 1e3:.2f}e-3 "
            f"| {a['rps'] / s['rps']:.1f}x | {a['errors'] + s['errors']:.0f} "
            f"| {a['server_cores']:.2f} / {a['client_cores']:.2f} |"
        )
    print()
    print("## the batching server's own statistics (statistics extension), per point")
    print(
        f"model ms per batch in the server, beside the in-process model's ms per batch of "
        f"{cfg.max_batch_size} over {ns.duration / ns.rounds:g} s right before and right after "
        "each of the point's rounds; "
        "model busy = share of the window the model computed"
    )
    print(
        "| concurrency | mean batch | model busy | model ms per batch | in-process ms before / "
        "after | served / in-process ceiling (mean of both) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for c in CONCURRENCY:
        a = batched[c]
        print(
            f"| {c} | {a['mean_batch']:.1f} | {a['model_busy']:.0%} | "
            f"{a['model_ms_per_batch']:.1f} | {_ms(cfg, a['ceiling_before'])} / "
            f"{_ms(cfg, a['ceiling_after'])} | {a['rps'] / adjacent_ceiling(a):.0%} |"
        )
    print()

    swidth = small.mlp_dims[0] if small.model == "mlp" else small.sim_dims[0]
    small_on, small_off = served_pairs(
        small_args, small.served_name, swidth, (32,), ns.duration, rounds=ns.rounds
    )
    sb, ss = small_on[32], small_off[32]
    print(f"## served, small model: {shlex.join(small_args)} (concurrency 32)")
    print("| batching | req/s | p50 ms | p99 ms | CPU s/req | errors |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in (("on (32)", sb), ("max-batch 1", ss)):
        print(
            f"| {label} | {r['rps']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['cpu_s_per_req'] * 1e3:.2f}e-3 | {r['errors']:.0f} |"
        )
    print()
    print("## goals (each beside its anchor, both from this run)")
    print("| goal | measured | anchor | met |")
    print("|---|---:|---|---|")
    for goal, measured, anchor, met in goal_rows(batched, single, sb["rps"]):
        print(f"| {goal} | {measured} | {anchor} | {'yes' if met else '**no**'} |")
    a = batched[32]
    print()
    print(
        f"at 32 users, served / ceiling = model busy {a['model_busy']:.0%} x in-process / "
        f"in-server model time {_ms(cfg, adjacent_ceiling(a))} / {a['model_ms_per_batch']:.1f} "
        f"ms x mean batch {a['mean_batch']:.1f} / {cfg.max_batch_size}; the undisturbed "
        f"in-process speed (best window, at the start) was {_ms(cfg, bmax)} ms"
    )
    print()
    return goal_figures(batched, single, sb["rps"])


if __name__ == "__main__":
    sys.exit(main())
