"""The fault proxy process: a loopback TCP proxy with Toxiproxy's toxics (``python -m``).

Run by ``harness.chaos.proxy.FaultProxy`` as its own process, so its asyncio loop never
shares the Locust process's gevent loop, and so it dies with the harness: it reads its
commands from stdin (a pipe from the harness) and exits on EOF, which the kernel delivers
when the harness exits by any means, SIGKILL included (no atexit, no signal handler).

Usage: ``python -m harness.chaos.netproxy UPSTREAM_HOST UPSTREAM_PORT [LISTEN_PORT]``.
It binds 127.0.0.1 (port 0: any free port) and prints one JSON line
``{"ready": true, "port": P, "pid": PID}``; then one JSON reply line per command line:

* ``{"op": "add", "id": ID, "kind": K, "stream": "upstream"|"downstream",
  "toxicity": P, ...params}`` — the toxic applies from now on to existing and new
  connections, each connection drawn once (probability ``toxicity``) on its first data;
* ``{"op": "remove", "id": ID}`` — stop it; the reply holds its counters (what it did);
* ``{"op": "stats"}`` — connections accepted / open, bytes per stream.

The toxics follow Toxiproxy (github.com/Shopify/toxiproxy, toxics/*.go): ``upstream`` is
client → server, ``downstream`` server → client; a toxic acts on each chunk read from one
side before it is written to the other.

| kind | params | effect on an affected connection |
|---|---|---|
| latency | latency_ms, jitter_ms | each chunk waits latency ± jitter (uniform) |
| bandwidth | rate_kbps | chunks go out in 100 ms slices of rate × 0.1 s bytes |
| slicer | average_size, size_variation, delay_us | chunks cut in slices of average ± variation bytes, delay_us between them |
| reset_peer | timeout_ms | on data, timeout_ms later both legs are reset (TCP RST, SO_LINGER 0) |
| timeout | timeout_ms | data is dropped (a blackhole); timeout_ms > 0 closes the connection that long after its first held chunk, 0 holds it until the toxic is removed |

Counters per toxic (the evidence that it applied): ``chunks_seen`` (chunks on its stream
while it was on, every connection), ``chunks_affected``, ``bytes_affected``,
``connections_affected``, ``delay_s`` (total time added), ``resets``, ``held_chunks``,
``held_bytes``, ``connections_held``, ``timeout_closes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import sys
from typing import Any

STREAMS = ("upstream", "downstream")
KINDS = ("latency", "bandwidth", "slicer", "reset_peer", "timeout")
CHUNK = 65536
BANDWIDTH_SLICE_S = 0.1  # Toxiproxy's bandwidth toxic writes 100 ms worth at a time

COUNTERS = (
    "chunks_seen",
    "chunks_affected",
    "bytes_affected",
    "connections_affected",
    "delay_s",
    "resets",
    "held_chunks",
    "held_bytes",
    "connections_held",
    "timeout_closes",
)


class Toxic:
    def __init__(self, spec: dict[str, Any], rng: random.Random) -> None:
        self.id = str(spec["id"])
        self.kind = str(spec["kind"])
        self.stream = str(spec.get("stream", "downstream"))
        if self.kind not in KINDS or self.stream not in STREAMS:
            raise ValueError(f"toxic {self.kind!r} on stream {self.stream!r}")
        self.toxicity = float(spec.get("toxicity", 1.0))
        # "connection" (Toxiproxy's): one draw per connection; "chunk": one per chunk read
        # (a request or an answer), for a share of requests whatever the client's pooling
        self.per = str(spec.get("per", "connection"))
        self.p = {k: float(v) for k, v in spec.items() if isinstance(v, int | float)}
        self.rng = rng
        self.drawn: dict[int, bool] = {}  # connection id → affected
        self.c: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.held: set[int] = set()

    def affects(self, conn_id: int) -> bool:
        if self.per == "chunk":
            hit = self.rng.random() < self.toxicity
            if hit and not self.drawn.get(conn_id):
                self.c["connections_affected"] += 1
            self.drawn[conn_id] = bool(self.drawn.get(conn_id)) or hit
            return hit
        hit = self.drawn.get(conn_id)
        if hit is None:
            hit = self.drawn[conn_id] = self.rng.random() < self.toxicity
            if hit:
                self.c["connections_affected"] += 1
        return hit

    def counters(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: int(v) for k, v in self.c.items() if k != "delay_s"}
        out["delay_s"] = round(self.c["delay_s"], 4)
        out["connections_seen"] = len(self.drawn)
        return out


class Link:
    """One client connection and its connection to the server."""

    def __init__(self, conn_id: int, client: asyncio.StreamWriter) -> None:
        self.id = conn_id
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.closed = False
        self.timers: list[asyncio.TimerHandle] = []
        # toxic id → when the last piece it let through is due (a stream keeps its order)
        self.last_due: dict[str, float] = {}

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for t in self.timers:
            t.cancel()
        for w in (self.client, self.server):
            if w is None:
                continue
            if reset:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                w.transport.abort()  # SO_LINGER 0 then close: the peer gets a TCP RST
            else:
                w.close()


class Proxy:
    def __init__(self, upstream: tuple[str, int], seed: int | None = None) -> None:
        self.upstream = upstream
        self.toxics: dict[str, Toxic] = {}
        self.links: dict[int, Link] = {}
        self.next_id = 0
        self.rng = random.Random(seed)
        self.stats: dict[str, int] = {
            "accepted": 0,
            "upstream_failed": 0,
            "bytes_upstream": 0,
            "bytes_downstream": 0,
        }

    # -- connections ------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.next_id += 1
        link = Link(self.next_id, writer)
        self.stats["accepted"] += 1
        _nodelay(writer)
        try:
            s_reader, s_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats["upstream_failed"] += 1
            link.close(reset=True)
            return
        _nodelay(s_writer)
        link.server = s_writer
        self.links[link.id] = link
        try:
            await asyncio.gather(
                self.pump(link, "upstream", reader, s_writer),
                self.pump(link, "downstream", s_reader, writer),
            )
        finally:
            self.links.pop(link.id, None)
            link.close()
            for tx in self.toxics.values():
                tx.held.discard(link.id)

    async def pump(
        self,
        link: Link,
        stream: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        # Chunks are stamped when they arrive and written when due, so a delay shifts each
        # chunk from its own arrival (as Toxiproxy's latency toxic does), not from the end
        # of the previous chunk's wait: a response in two chunks is late once, not twice.
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[bytes, float] | None] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            try:
                while not link.closed:
                    data = await reader.read(CHUNK)
                    if not data:
                        break
                    self.stats[f"bytes_{stream}"] += len(data)
                    await queue.put((data, loop.time()))
            except (ConnectionError, OSError):
                pass
            finally:
                await queue.put(None)

        reading = asyncio.ensure_future(read())
        try:
            while not link.closed:
                item = await queue.get()
                if item is None:
                    break
                pieces = await self.through_toxics(link, stream, *item)
                for piece, due in pieces:
                    wait_s = due - loop.time()
                    if wait_s > 0:
                        await asyncio.sleep(wait_s)
                    if link.closed:
                        return
                    writer.write(piece)
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.close()
            reading.cancel()

    async def through_toxics(
        self, link: Link, stream: str, data: bytes, arrival: float
    ) -> list[tuple[bytes, float]]:
        """The chunk as it should go out: (piece, when due on the loop's clock) pairs;
        [] = dropped."""
        pieces: list[tuple[bytes, float]] = [(data, arrival)]
        for tx in [t for t in self.toxics.values() if t.stream == stream]:
            tx.c["chunks_seen"] += 1
            if not tx.affects(link.id):
                continue
            tx.c["chunks_affected"] += 1
            tx.c["bytes_affected"] += len(data)
            if tx.kind == "timeout":
                tx.c["held_chunks"] += 1
                tx.c["held_bytes"] += len(data)
                if link.id not in tx.held:
                    tx.held.add(link.id)
                    tx.c["connections_held"] += 1
                    ms = tx.p.get("timeout_ms", 0.0)
                    if ms > 0:
                        loop = asyncio.get_running_loop()
                        link.timers.append(loop.call_later(ms / 1000.0, self._timeout, tx, link))
                return []
            if tx.kind == "reset_peer":
                ms = tx.p.get("timeout_ms", 0.0)
                if ms > 0:
                    await asyncio.sleep(ms / 1000.0)
                tx.c["resets"] += 1
                link.close(reset=True)
                return []
            pieces = self._shape(tx, link, pieces)
        return pieces

    def _timeout(self, tx: Toxic, link: Link) -> None:
        if not link.closed:
            tx.c["timeout_closes"] += 1
            link.close()

    def _shape(
        self, tx: Toxic, link: Link, pieces: list[tuple[bytes, float]]
    ) -> list[tuple[bytes, float]]:
        """Give each piece its new due time. ``delay_s`` counts only the time a piece
        is later than it would have been (than its own due time and the previous piece's),
        so it is the delay the stream's reader sees, not a sum of overlapping waits."""
        out: list[tuple[bytes, float]] = []
        p = tx.p
        last = link.last_due.get(tx.id, 0.0)
        for data, due in pieces:
            start = max(due, last)
            if tx.kind == "latency":
                jitter = p.get("jitter_ms", 0.0)
                ms = max(0.0, p.get("latency_ms", 0.0) + self.rng.uniform(-jitter, jitter))
                new = max(due + ms / 1000.0, last)
                out.append((data, new))
            elif tx.kind == "bandwidth":
                rate = p.get("rate_kbps", 1.0) * 1024
                step = max(1, int(rate * BANDWIDTH_SLICE_S))
                new = start
                for i in range(0, len(data), step):
                    piece = data[i : i + step]
                    new += len(piece) / rate
                    out.append((piece, new))
            else:  # slicer
                avg = max(1, int(p.get("average_size", 64)))
                var = int(p.get("size_variation", 0))
                gap = p.get("delay_us", 0.0) / 1e6
                i, new = 0, start
                while i < len(data):
                    n = max(1, avg + (self.rng.randint(-var, var) if var else 0))
                    if i:
                        new += gap
                    out.append((data[i : i + n], new))
                    i += n
            tx.c["delay_s"] += max(0.0, new - start)
            last = new
        link.last_due[tx.id] = last
        return out

    # -- control ----------------------------------------------------------------------

    def command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd.get("op")
        if op == "add":
            tx = Toxic(cmd, random.Random(self.rng.random()))
            if tx.id in self.toxics:
                raise ValueError(f"toxic {tx.id!r} exists")
            self.toxics[tx.id] = tx
            return {"ok": True, "id": tx.id, "open": len(self.links)}
        if op == "remove":
            tx = self.toxics.pop(str(cmd.get("id")), None)
            if tx is None:
                raise ValueError(f"no toxic {cmd.get('id')!r}")
            if tx.kind == "timeout" and tx.p.get("timeout_ms", 0.0) <= 0:
                # held forever until now: those connections lost their data, close them
                for cid in list(tx.held):
                    link = self.links.get(cid)
                    if link is not None:
                        link.close()
            return {"ok": True, "id": tx.id, "counters": tx.counters(), "open": len(self.links)}
        if op == "stats":
            return {"ok": True, **self.stats, "open": len(self.links), "toxics": list(self.toxics)}
        raise ValueError(f"unknown op {op!r}")


def _nodelay(w: asyncio.StreamWriter) -> None:
    sock = w.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main(upstream_host: str, upstream_port: int, listen_port: int = 0) -> None:
    proxy = Proxy((upstream_host, upstream_port))
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", listen_port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    control = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(control), sys.stdin)
    out = sys.stdout
    out.write(json.dumps({"ready": True, "port": port, "pid": os.getpid()}) + "\n")
    out.flush()
    try:
        while True:
            line = await control.readline()
            if not line:  # EOF: the harness is gone (exited, crashed or SIGKILLed)
                break
            try:
                reply = proxy.command(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        server.close()
        for link in list(proxy.links.values()):
            link.close()


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print(
            "usage: python -m harness.chaos.netproxy UPSTREAM_HOST UPSTREAM_PORT [LISTEN_PORT]",
            file=sys.stderr,
        )
        sys.exit(2)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
        )
