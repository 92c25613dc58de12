"""Benchmark of the streaming LLM user's client side: CPU per token against a bare line
reader over the same server, and whether one generator core reaches 5,000 tokens/s.

    flock /tmp/harness-cpu.lock python bench/stream_reader.py [--seconds 8] [--streams 16]
        [--max-tokens 256] [--time-scale 0]

Starts the reference LLM server (``--api openai``, ``--time-scale 0`` by default: no
modelled time, the server streams as fast as its CPU lets it), then, in this one gevent
process, runs ``--streams`` closed-loop streams for ``--seconds`` in each mode:

  * ``bare``: the same request bytes on the same kind of keep-alive socket
    (``http.Connection.ready_socket``), each ``recv`` split into lines and the
    ``data:`` lines counted — no framing decoded, no JSON, no clock, no statistics: the
    floor any reader pays;
  * ``user``: what the streaming user does per stream (``StreamEngine.send``):
    ``exchange_stream`` (framing, a clock reading per read, SSE parsing, chunk JSON, the
    reference tokenizer) and ``StreamStats.record`` (five HDR histograms), stream
    verification off;
  * ``user+verify``: the same, each stream checked against the reference server's
    oracle (the default against the reference server).

Prints per mode: tokens received, tokens/s achieved, this process's CPU seconds (and the
server's), CPU µs per token, and tokens per generator CPU second (what one core could
read if the server were not the limit); then each mode's CPU per token over the bare
reader's, and whether one core reaches 5,000 tokens/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gevent
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.load import http
from harness.load.stream_user import StreamEngine, StreamSettings
from harness.testing.server import http_status, start_server, wait_until

GOAL_TOKENS_PER_CORE_S = 5000.0


def bare_stream(conn: http.Connection, raw: bytes) -> int:
    """One stream read as lines; the data lines carrying tokens (not [DONE]) counted."""
    sock = conn.ready_socket()
    sock.sendall(raw)
    tokens = 0
    pending = b""
    while True:
        data = sock.recv(65536)
        if not data:
            conn.close()
            return tokens
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if (
                line.startswith(b"data: {")
                and b'"content":"' in line
                and b'"content":""' not in line
            ):
                tokens += 1
            elif line.startswith(b"0\r") or line == b"0\r":  # the terminating chunk
                return tokens


def run_mode(mode: str, engine: StreamEngine, seconds: float, streams: int) -> dict:
    tokens = 0
    stop_at = time.perf_counter() + seconds

    def loop() -> None:
        nonlocal tokens
        conn = http.Connection(engine.host, engine.port, client=engine.client)
        i = 0
        while time.perf_counter() < stop_at:
            # read the count first: ``tokens += f()`` would load ``tokens`` before the
            # stream (other greenlets add meanwhile) and lose their tokens
            if mode == "bare":
                pool = engine.requests[engine.default_class]
                got = bare_stream(conn, pool[i % len(pool)].raw)
                i += 1
            else:
                got = engine.send(time.perf_counter(), conn).output_tokens
            tokens += got
        conn.close()

    cpu0, wall0 = time.process_time(), time.perf_counter()
    gevent.joinall([gevent.spawn(loop) for _ in range(streams)])
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"tokens": tokens, "wall_s": wall, "cpu_s": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--time-scale", default="0")
    args = ap.parse_args()
    server_args = ("--api", "openai", "--time-scale", args.time_scale, "--max-num-seqs", "256")
    with start_server(*server_args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        server = psutil.Process(srv.proc.pid)
        print(
            f"reference server --time-scale {args.time_scale}; {args.streams} closed-loop "
            f"streams x {args.seconds:g} s per mode; {args.max_tokens} tokens per stream, one per event"
        )
        results = {}
        for mode in ("bare", "user", "user+verify"):
            settings = StreamSettings(
                srv.url,
                rate_per_user=0,
                max_tokens=args.max_tokens,
                verify=mode == "user+verify",
            )
            engine = StreamEngine(settings)
            scpu0 = sum(server.cpu_times()[:2])
            got = run_mode(mode, engine, args.seconds, args.streams)
            got["server_cpu_s"] = sum(server.cpu_times()[:2]) - scpu0
            if mode != "bare":
                summary = engine.stats.summary()["total"]
                got["failed"], got["verified"] = summary["failed"], summary["verified"]
            results[mode] = got
            per_token_us = got["cpu_s"] / max(1, got["tokens"]) * 1e6
            print(
                f"{mode:12s} tokens {got['tokens']:7d}  {got['tokens'] / got['wall_s']:8.0f} tok/s  "
                f"client CPU {got['cpu_s']:5.2f} s  server CPU {got['server_cpu_s']:5.2f} s  "
                f"{per_token_us:6.2f} us/token  "
                f"{got['tokens'] / max(got['cpu_s'], 1e-9):8.0f} tok per client CPU s"
                + (f"  failed {got['failed']} verified {got['verified']}" if mode != "bare" else "")
            )
        bare = results["bare"]["cpu_s"] / max(1, results["bare"]["tokens"])
        for mode in ("user", "user+verify"):
            r = results[mode]
            cost = r["cpu_s"] / max(1, r["tokens"])
            capacity = 1.0 / cost if cost else float("inf")
            print(
                f"{mode}: {cost / bare:.2f}x the bare reader's CPU per token; one core reads "
                f"{capacity:,.0f} tokens/s -> the 5,000 tokens/s goal is "
                f"{'met' if capacity >= GOAL_TOKENS_PER_CORE_S else 'NOT met'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
