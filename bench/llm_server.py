"""Benchmark of the LLM reference server (``python -m harness_reference_server --api openai``):
how faithfully it follows its cost model, and what its streaming costs.

    python bench/llm_server.py [--only fidelity,knee,prefix,cost,timer] [--rate-seconds 20]
        [--record-timings]

Prints, with its conditions:
  * fidelity: at concurrency 1, median TTFT and TPOT against the cost model's
    time_scale x (β0 + β1·prefill tokens + β2·decoding sequences); with
    --record-timings also the client's readings against the server's timestamps
    (GET /debug/timings): the trip in, the server's part of TTFT, the trip out;
  * knee: open-loop Poisson arrivals at rising rates (prompts 156-356 tokens, outputs
    78-178, ignore_eos): TTFT p50/p99, output tokens/s, 429s, and the step loop's
    timing error (actual minus modelled step end, from the server's histogram), against
    the saturation the cost model and max_num_seqs predict;
  * prefix: 1024-token prompts whose first S tokens are shared: hit rate and TTFT;
  * cost: tokens/s streamed at one token per event with --time-scale 0 (no modelled
    time: the server's CPU is the limit), and the server's CPU seconds per 1,000 tokens;
  * timer: how late the step loop's wait (a timerfd at an absolute deadline) and
    asyncio.sleep wake under uvloop, in this process (no server).

The client is one asyncio process of raw HTTP/1.0 sockets on the same box (loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.testing.server import (
    ServerHandle,
    http_status,
    parse_metrics,
    start_server,
    wait_until,
)
from harness_reference_server.llm.config import LLMConfig
from harness_reference_server.llm.tokens import VOCABULARY, count_tokens

D = LLMConfig()
MODEL = D.model_name
SERVER_ARGS: list[str] = []  # added to every server's command line (--record-timings)


def step_s(prefill: int, decodes: int, scale: float = D.time_scale) -> float:
    return scale * (D.beta0_ms / 1e3 + D.beta1_us / 1e6 * prefill + D.beta2_us / 1e6 * decodes)


def words(rng: random.Random, n: int) -> str:
    """A prompt of exactly ``n`` tokens."""
    text = "".join(" " + rng.choice(VOCABULARY) for _ in range(n))
    assert count_tokens(text) == n
    return text


class Stream:
    """One streamed completion as the client saw it."""

    def __init__(self) -> None:
        self.status = 0
        self.sent = 0.0
        self.token_times: list[float] = []


async def stream(port: int, prompt: str, max_tokens: int) -> Stream:
    """POST /v1/completions with stream, read it line by line, time every token."""
    out = Stream()
    doc = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
           "stream": True}  # fmt: skip
    body = json.dumps(doc).encode()
    head = (
        f"POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        out.sent = time.perf_counter()
        writer.write(head + body)
        status_line = await reader.readline()
        out.status = int(status_line.split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        async for line in reader:
            if line.startswith(b"data: {") and b'"text":"' in line and b'"text":""' not in line:
                out.token_times.append(time.perf_counter())
    finally:
        writer.close()
    return out


def scrape(srv: ServerHandle) -> dict[str, float]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return parse_metrics(conn.getresponse().read().decode())
    finally:
        conn.close()


def started(*args: str):
    srv_cm = start_server("--api", "openai", *args, *SERVER_ARGS, wait_for_ready=False)
    srv = srv_cm.__enter__()
    wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
    return srv_cm, srv


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# -- fidelity -------------------------------------------------------------------------


def fidelity(n: int) -> None:
    cm, srv = started()
    try:
        rng = random.Random(1)
        ttft, tpot, streams = [], [], []
        for _ in range(n):
            s = asyncio.run(stream(srv.port, words(rng, 256), 64))
            streams.append(s)
            ttft.append(s.token_times[0] - s.sent)
            tpot.append((s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1))
        records = server_timings(srv) if SERVER_ARGS else None
    finally:
        cm.__exit__(None, None, None)
    if records is not None:
        against_server(streams, records)
    for name, got, want in (
        ("TTFT (256-token prompt)", statistics.median(ttft), step_s(256, 0)),
        ("TPOT (1 sequence)", statistics.median(tpot), step_s(0, 1)),
    ):
        print(f"  {name:26s} measured {got * 1e3:7.2f} ms   model {want * 1e3:7.2f} ms   "
              f"{(got / want - 1) * 100:+5.1f} %")  # fmt: skip


def server_timings(srv: ServerHandle) -> list[dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("GET", "/debug/timings")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def against_server(streams: list[Stream], records: list[dict]) -> None:
    """The client's readings against the server's timestamps (the same clock: the
    client's perf_counter and the server's monotonic_ns are both CLOCK_MONOTONIC)."""
    assert len(records) == len(streams)  # sequential requests: the same order
    into, server, out, gap = [], [], [], []
    for s, r in zip(streams, records, strict=True):
        writes = [t / 1e9 for t, _ in r["events"]]
        into.append(r["arrival_ns"] / 1e9 - s.sent)
        server.append(writes[0] - r["arrival_ns"] / 1e9)
        out.append(s.token_times[0] - writes[0])
        gap += [
            abs((b - a) - (y - x))
            for a, b, x, y in zip(
                s.token_times, s.token_times[1:], writes, writes[1:], strict=False
            )
        ]
    print(f"  against --record-timings (medians): send to server arrival "
          f"{statistics.median(into) * 1e3:.2f} ms, arrival to first write "
          f"{statistics.median(server) * 1e3:.2f} ms, first write to client read "
          f"{statistics.median(out) * 1e3:.2f} ms; |client gap - server gap| "
          f"{statistics.median(gap) * 1e3:.3f} ms (p99 {pct(gap, 0.99) * 1e3:.3f} ms)")  # fmt: skip


# -- knee -----------------------------------------------------------------------------


def step_error_p99(before: dict[str, float], after: dict[str, float]) -> tuple[str, int]:
    name = "refserver_llm_step_error_seconds_bucket"
    rows = []
    for key, value in after.items():
        if key.startswith(name + "{"):
            le = key.split('le="')[1].split('"')[0]
            rows.append((float(le), value - before.get(key, 0.0)))
    rows.sort()
    total = rows[-1][1] if rows else 0
    for le, count in rows:
        if total and count >= 0.99 * total:
            return ("<= %g ms" % (le * 1e3) if le != float("inf") else "> 50 ms"), int(total)
    return "n/a", int(total)


async def open_loop(port: int, rate: float, seconds: float, seed: int) -> list[Stream]:
    rng = random.Random(seed)
    tasks = []
    t_end = time.perf_counter() + seconds
    next_at = time.perf_counter()
    while next_at < t_end:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        prompt = words(rng, rng.randint(156, 356))
        tasks.append(asyncio.create_task(stream(port, prompt, rng.randint(78, 178))))
        next_at += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


def knee(rates: list[float], seconds: float) -> None:
    # predicted saturation: 64 decodes per step, each request's 256 prefill tokens spread
    # over the steps: 128·λ = 64 / T with T = step(256·λ·T, 64), so λ·T = 64 / 128
    n, prompt, out = D.max_num_seqs, 256, 128
    t_sat = step_s(prompt * n // out, n)  # each step prefills 256 x λ x T = 256 x 64 / 128
    lam = n / out / t_sat
    print(f"  predicted saturation: {lam:.1f} req/s, {lam * out:.0f} output tokens/s, TPOT "
          f"{t_sat * 1e3:.1f} ms (max_num_seqs {n} binds before the KV cache: {n} x {prompt + out} "
          f"tokens on average < {D.kv_blocks} x {D.block_size})")  # fmt: skip
    print(f"  {'rate':>6s} {'offered':>8s} {'ok':>5s} {'429':>4s} {'TTFT p50':>9s} {'TTFT p99':>9s} "
          f"{'TPOT p50':>9s} {'tok/s':>6s} {'step error p99':>15s} {'steps':>6s}")  # fmt: skip
    cm, srv = started()
    try:
        for i, rate in enumerate(rates):
            before = scrape(srv)
            t0 = time.perf_counter()
            streams = asyncio.run(open_loop(srv.port, rate, seconds, seed=i))
            after = scrape(srv)
            ok = [s for s in streams if s.status == 200 and s.token_times]
            ttft = [s.token_times[0] - s.sent for s in ok]
            tpot = [(s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1) for s in ok]
            # output tokens/s over the arrival window's second half (steady state)
            lo, hi = t0 + seconds / 2, t0 + seconds
            toks = sum(1 for s in ok for t in s.token_times if lo <= t < hi) / (hi - lo)
            late, steps = step_error_p99(before, after)
            print(f"  {rate:6.1f} {len(streams) / seconds:8.2f} {len(ok):5d} {sum(s.status == 429 for s in streams):4d} "
                  f"{pct(ttft, 0.5) * 1e3:7.0f}ms {pct(ttft, 0.99) * 1e3:7.0f}ms "
                  f"{pct(tpot, 0.5) * 1e3:7.1f}ms {toks:6.0f} {late:>15s} {steps:6d}")  # fmt: skip
    finally:
        cm.__exit__(None, None, None)


# -- prefix ---------------------------------------------------------------------------


def prefix(shares: list[int], n: int) -> None:
    cm, srv = started()
    try:
        rng = random.Random(2)
        name = 'vllm:prefix_cache_{}_total{{model_name="reference-llm"}}'
        for shared in shares:
            common = words(rng, shared)
            before = scrape(srv)
            ttft = []
            for _ in range(n):
                s = asyncio.run(stream(srv.port, common + words(rng, 1024 - shared), 1))
                ttft.append(s.token_times[0] - s.sent)
            after = scrape(srv)
            q = after[name.format("queries")] - before[name.format("queries")]
            h = after[name.format("hits")] - before[name.format("hits")]
            model = step_s(1024 - (shared // D.block_size) * D.block_size, 0)
            print(f"  shared {shared:5d} of 1024   hit rate {h / q:5.2f}   TTFT median "
                  f"{statistics.median(ttft[1:]) * 1e3:6.1f} ms   model (after the first) "
                  f"{model * 1e3:6.1f} ms")  # fmt: skip
    finally:
        cm.__exit__(None, None, None)


# -- cost -----------------------------------------------------------------------------


async def closed_loop(port: int, clients: int, seconds: float) -> int:
    t_end = time.perf_counter() + seconds
    rng = random.Random(3)

    async def client() -> int:
        n = 0
        while time.perf_counter() < t_end:
            s = await stream(port, words(rng, 32), 500)
            n += sum(1 for t in s.token_times if t < t_end)
        return n

    return sum(await asyncio.gather(*(client() for _ in range(clients))))


def cost(clients: int, seconds: float) -> None:
    cm, srv = started("--time-scale", "0")
    try:
        proc = psutil.Process(srv.pid)
        me = psutil.Process()
        c0, m0, t0 = proc.cpu_times(), me.cpu_times(), time.perf_counter()
        tokens = asyncio.run(closed_loop(srv.port, clients, seconds))
        c1, m1, wall = proc.cpu_times(), me.cpu_times(), time.perf_counter() - t0
    finally:
        cm.__exit__(None, None, None)
    server_cpu = (c1.user + c1.system) - (c0.user + c0.system)
    client_cpu = (m1.user + m1.system) - (m0.user + m0.system)
    print(f"  {clients} streams, {seconds:.0f} s: {tokens / wall:,.0f} tokens/s at one token per "
          f"event; server CPU {server_cpu / wall:.0%} of a core "
          f"({server_cpu / tokens * 1e6:.0f} µs a token: {tokens / server_cpu:,.0f} tokens per "
          f"server CPU-second); client CPU {client_cpu / wall:.0%}")  # fmt: skip


# -- timer ----------------------------------------------------------------------------


def timer(n: int, wait_s: float = 0.0123) -> None:
    import uvloop

    from harness_reference_server.llm.timer import DeadlineTimer

    async def lateness(use_timerfd: bool) -> list[float]:
        t, out = DeadlineTimer(), []
        try:
            for _ in range(n):
                deadline = time.monotonic() + wait_s
                if use_timerfd:
                    await t.wait_until(deadline)
                else:
                    await asyncio.sleep(deadline - time.monotonic())
                out.append(time.monotonic() - deadline)
        finally:
            t.close()
        return out

    for name, use_timerfd in (("asyncio.sleep", False), ("timerfd", True)):
        late = uvloop.run(lateness(use_timerfd))
        print(f"  {name:14s} {n} waits of {wait_s * 1e3:.1f} ms, lateness p1 "
              f"{pct(late, 0.01) * 1e3:+.2f} ms  p50 {pct(late, 0.5) * 1e3:+.2f} ms  p99 "
              f"{pct(late, 0.99) * 1e3:+.2f} ms")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="fidelity,knee,prefix,cost,timer")
    p.add_argument("--rates", default="2,4,6,7,8,10,12")
    p.add_argument("--rate-seconds", type=float, default=20.0)
    p.add_argument("--cost-seconds", type=float, default=10.0)
    p.add_argument(
        "--record-timings", action="store_true", help="start the servers with --record-timings"
    )
    args = p.parse_args()
    if args.record_timings:
        SERVER_ARGS.append("--record-timings")
    only = set(args.only.split(","))
    print(f"LLM reference server, defaults: time_scale {D.time_scale}, β = ({D.beta0_ms} ms, "
          f"{D.beta1_us} µs/prefill token, {D.beta2_us} µs/decoding seq), max_num_seqs "
          f"{D.max_num_seqs}, max_num_batched_tokens {D.max_num_batched_tokens}, KV "
          f"{D.kv_blocks} x {D.block_size}; {psutil.cpu_count()} CPUs, Python "
          f"{platform.python_version()}{'; --record-timings' if SERVER_ARGS else ''}")  # fmt: skip
    if "fidelity" in only:
        print("fidelity at concurrency 1 (20 requests, medians):")
        fidelity(20)
    if "knee" in only:
        print(f"knee: open-loop Poisson arrivals, {args.rate_seconds:.0f} s per rate:")
        knee([float(r) for r in args.rates.split(",")], args.rate_seconds)
    if "prefix" in only:
        print("prefix caching, 1024-token prompts, 8 sequential requests per share:")
        prefix([0, 256, 512, 768, 1008], 8)
    if "cost" in only:
        print("streaming cost (--time-scale 0):")
        cost(64, args.cost_seconds)
    if "timer" in only:
        print("the step loop's timer against asyncio.sleep, under uvloop:")
        timer(200)
    return 0


if __name__ == "__main__":
    sys.exit(main())
