"""Network faults: the fault proxy process, the ``network`` action, the evidence rule
and the two network checks on measured records.

The proxy tests run the real proxy process against a real echo server on loopback and
compare round trips measured in the same test (ratios, not wall times).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest

from harness.analysis.chaos_evidence import chaos_not_applied
from harness.chaos.proxy import FaultProxy, NetworkFault, toxic_spec
from harness.chaos.timeline import Timeline
from harness.checks import judge_scenario
from harness.checks.network import latency_amplification, leaks
from harness.checks.registry import resolve_params
from harness.errors import ConfigError, HarnessError
from harness.load.scenario import load_scenario, parse_scenario


class _Echo(socketserver.BaseRequestHandler):
    resets = 0

    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionResetError:
            type(self).resets += 1


@pytest.fixture
def echo() -> Iterator[int]:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    _Echo.resets = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def proxy(echo: int) -> Iterator[FaultProxy]:
    p = FaultProxy("127.0.0.1", echo).start(register=False)
    try:
        yield p
    finally:
        p.stop()


def _round_trip(sock: socket.socket, size: int = 2000) -> float:
    msg = b"x" * size
    t0 = time.perf_counter()
    sock.sendall(msg)
    got = b""
    while len(got) < size:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    return time.perf_counter() - t0


def _least(xs: list[float]) -> float:
    """The quickest of a few round trips: a busy machine only ever adds to one (a process
    of the three taking its turn late), so the least is the one the toxic shaped alone."""
    return min(xs)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# -- the toxics, measured ----------------------------------------------------------------


def test_latency_toxic_adds_its_delay_once_per_round_trip(proxy: FaultProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        clean = _least([_round_trip(s) for _ in range(5)])
        proxy.command(
            "add", id="l", kind="latency", stream="downstream", toxicity=1.0, latency_ms=60
        )
        slow = _least([_round_trip(s) for _ in range(5)])
        counters = proxy.command("remove", id="l")["counters"]
        after = _least([_round_trip(s) for _ in range(5)])
    added = slow - clean
    # every answer late by one 60 ms delay (not one per chunk, not none), none once removed
    assert 0.8 * 0.060 <= added <= 1.6 * 0.060, (clean, slow)
    assert after < clean + 0.5 * 0.060
    assert counters["chunks_affected"] >= 5 and counters["connections_affected"] == 1
    assert 0.8 * 5 * 0.060 <= counters["delay_s"] <= 1.6 * 5 * 0.060


def test_slicer_cuts_the_request_and_counts_its_gaps(proxy: FaultProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        clean = _round_trip(s, 2048)
        proxy.command(
            "add", id="s", kind="slicer", stream="upstream", average_size=256, delay_us=10_000
        )
        sliced = _round_trip(s, 2048)
        counters = proxy.command("remove", id="s")["counters"]
    # 2048 bytes in 8 slices of 256: 7 gaps of 10 ms when they arrive in one read; each read
    # is sliced on its own, so a request split into k reads (a busy machine) has 8 - k to 7
    k = counters["chunks_affected"]
    assert 1 <= k <= 8, counters
    assert 0.01 * (8 - k) - 0.0005 <= counters["delay_s"] <= 0.07 + 0.0005, counters
    assert sliced - clean >= 0.8 * counters["delay_s"]


def test_reset_peer_resets_both_ends(proxy: FaultProxy) -> None:
    proxy.command("add", id="r", kind="reset_peer", stream="downstream")
    with (
        socket.create_connection(("127.0.0.1", proxy.port)) as s,
        pytest.raises(ConnectionError),
    ):
        _round_trip(s)
    deadline = time.monotonic() + 5
    while _Echo.resets < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    counters = proxy.command("remove", id="r")["counters"]
    assert counters["resets"] == 1
    assert _Echo.resets == 1  # the server's recv saw ECONNRESET: a TCP RST, not a FIN


def test_timeout_toxic_holds_data_until_removed(proxy: FaultProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        _round_trip(s)
        proxy.command("add", id="t", kind="timeout", stream="upstream")
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            _round_trip(s)
        counters = proxy.command("remove", id="t")["counters"]
        s.settimeout(2.0)
        assert s.recv(10) == b""  # the held connection is closed when the toxic ends
    assert counters["held_chunks"] == 1 and counters["connections_held"] == 1
    with socket.create_connection(("127.0.0.1", proxy.port)) as s2:
        _round_trip(s2)  # new connections pass again


def test_toxicity_draws_once_per_connection(proxy: FaultProxy) -> None:
    proxy.command("add", id="h", kind="latency", stream="downstream", toxicity=0.5, latency_ms=1)
    for _ in range(40):
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:
            _round_trip(s, 10)
            _round_trip(s, 10)
    c = proxy.command("remove", id="h")["counters"]
    assert c["connections_seen"] == 40
    assert 8 <= c["connections_affected"] <= 32  # Binomial(40, 0.5): outside is p < 0.001
    assert c["chunks_affected"] == 2 * c["connections_affected"]  # both or neither


def test_toxicity_per_chunk_draws_every_request(proxy: FaultProxy) -> None:
    proxy.command(
        "add", id="q", kind="latency", stream="downstream", toxicity=0.5, per="chunk", latency_ms=1
    )
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        for _ in range(80):
            _round_trip(s, 10)
    c = proxy.command("remove", id="q")["counters"]
    assert c["connections_seen"] == 1 and c["chunks_seen"] == 80
    assert 20 <= c["chunks_affected"] <= 60  # Binomial(80, 0.5) on one connection


def test_proxy_exits_when_its_control_pipe_closes(echo: int) -> None:
    """The parent's death closes the pipe: EOF alone ends the proxy and frees its port."""
    p = FaultProxy("127.0.0.1", echo).start(register=False)
    assert p.proc is not None and p.proc.stdin is not None
    pid, port = p.pid, p.port
    assert pid is not None and port is not None
    p.proc.stdin.close()
    p.proc.wait(5)
    assert not _alive(pid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free again


def test_proxy_dies_with_a_sigkilled_parent(echo: int) -> None:
    code = (
        "import sys, time\n"
        "from harness.chaos.proxy import FaultProxy\n"
        f"p = FaultProxy('127.0.0.1', {echo}).start()\n"
        "print(p.pid, p.port, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid, port = (int(x) for x in parent.stdout.readline().split())
        assert _alive(pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- the action, the scenario and the evidence ------------------------------------------


def test_network_action_records_what_the_proxy_did(proxy: FaultProxy) -> None:
    events = [(0.0, "network", {"toxic": "reset_peer", "duration_s": 0.3})]
    actions = {"network": lambda t, p: NetworkFault(p, p["duration_s"], proxy=proxy)}
    tl = Timeline(events, None, handle_signals=False, actions=actions)  # type: ignore[arg-type]
    tl.start()
    time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", proxy.port)) as s, contextlib.suppress(OSError):
        _round_trip(s)
    assert tl.join(5)
    rec = tl.records[0]
    assert rec["ok"] and rec["detail"]["counters"]["resets"] == 1
    assert rec["detail"]["proxy_pid"] == proxy.pid
    assert chaos_not_applied({"chaos": tl.records, "duration_s": 10}) == []
    # the same toxic with no traffic through it is no evidence
    rec2 = {**rec, "detail": {**rec["detail"], "counters": {"resets": 0, "chunks_affected": 0}}}
    (why,) = chaos_not_applied({"chaos": [rec2], "duration_s": 10})
    assert "touched no traffic" in why


def test_network_without_a_proxy_fails_at_apply() -> None:
    action = NetworkFault({"toxic": "latency"}, 1.0)
    with pytest.raises(HarnessError, match="no fault proxy"):
        action.apply()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"toxic": "lag"}, "network.toxic has value 'lag'"),
        ({"toxic": "latency", "stream": "sideways"}, "network.stream"),
        ({"toxic": "latency", "toxicity": 0}, "network.toxicity has value 0"),
        ({"toxic": "latency", "latency_ms": -1}, "network.latency_ms has value -1"),
        ({"toxic": "latency", "rate_kbps": 5}, "rate_kbps is not a parameter of the latency"),
        ({"toxic": "latency", "per": "packet"}, "network.per has value 'packet'"),
    ],
)
def test_bad_toxic_is_a_config_error(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        toxic_spec(params)


def test_scenario_names_the_bad_chaos_event() -> None:
    src = """
[[stages]]
rate = 10
duration_s = 10
[[chaos]]
action = "network"
at_s = 1
duration_s = 2
toxic = "bandwidth"
latency_ms = 5
"""
    with pytest.raises(ConfigError, match=r"x\.toml: chaos\[0\]: network: latency_ms"):
        parse_scenario(tomllib.loads(src), "x.toml")


def test_packaged_network_scenario() -> None:
    for mode, length in (("quick", 52.0), ("full", 170.0)):
        s = load_scenario("network", mode)
        assert s.duration_s == length
        toxics = [e.params["toxic"] for e in s.chaos]
        assert toxics == ["latency", "slicer", "reset_peer", "timeout"]
        # every fault lasts its stage, with a clean stage before and after
        for e in s.chaos:
            stage = s.stage_at(e.at_s)
            assert stage is not None and stage.start_s == e.at_s and stage.end_s == e.end_s
        assert set(s.checks) >= {"network.latency_amplification", "network.leaks"}


# -- the checks on records ---------------------------------------------------------------


def _event(toxic: str, start: float, end: float, **counters: float) -> dict[str, Any]:
    return {
        "action": "network",
        "params": {"toxic": toxic, "stream": "downstream", "duration_s": end - start},
        "at_s": start,
        "start_s": start,
        "end_s": end,
        "ok": True,
        "error": None,
        "detail": {"counters": {"chunks_affected": 100, **counters}},
    }


def _windows(p50: dict[tuple[int, int], float], end: int, n: int = 80) -> dict[str, Any]:
    rows = []
    for t in range(end):
        v = next((x for (lo, hi), x in p50.items() if lo <= t < hi), 30.0)
        rows.append({"t": float(t), "class": "default", "n": n, "ok": n, "errors": {},
                     "p50_ms": v, "p99_ms": 2 * v})  # fmt: skip
    return {"width_s": 1.0, "rows": rows}


def _judge(fn: Any, cid: str, result: dict[str, Any]) -> Any:
    return fn(result, resolve_params(cid))


def test_amplification_passes_the_injected_delay_and_fails_a_stall() -> None:
    # 10 s of 40 ms latency at 80 req/s: 800 requests, 32 s injected = 40 ms each
    ev = _event("latency", 10, 20, delay_s=32.0)
    healthy = {"chaos": [ev], "windows": _windows({(10, 20): 72.0}, 30)}
    c = _judge(latency_amplification, "network.latency_amplification", healthy)
    assert c.passed is True and c.value == pytest.approx(42 / 40, rel=0.01)
    stalled = {"chaos": [ev], "windows": _windows({(10, 20): 300.0}, 30)}
    c = _judge(latency_amplification, "network.latency_amplification", stalled)
    assert c.passed is False and c.value == pytest.approx(270 / 40, rel=0.01)
    assert "lock" in c.detail
    # every request of the fault timed out: no answer is slower than any answer
    dead = _windows({}, 30)
    for row in dead["rows"][10:20]:
        row.update(ok=0, p50_ms=None, p99_ms=None, errors={"timeout": 80})
    c = _judge(latency_amplification, "network.latency_amplification",
               {"chaos": [ev], "windows": dead})  # fmt: skip
    assert c.passed is False and c.value == float("inf")
    # no delaying toxic: nothing was measured, not a pass
    only_resets = {"chaos": [_event("reset_peer", 10, 20, resets=5)], "windows": healthy["windows"]}
    c = _judge(latency_amplification, "network.latency_amplification", only_resets)
    assert c.passed is None and c.skipped


def test_amplification_interpolates_the_servers_drift_across_the_fault() -> None:
    # The server's own latency rises through the run whatever the network does: 30 ms
    # before the toxic, 50 ms after it, so ~40 ms while it was on. With 40 ms injected a
    # request took 80 ms: 1x, though 80 - 30 ms before would read 1.25x.
    ev = _event("latency", 10, 20, delay_s=32.0)
    drift = {"chaos": [ev], "windows": _windows({(0, 10): 30.0, (10, 20): 80.0, (20, 40): 50.0}, 40),
             "duration_s": 40.0}  # fmt: skip
    c = _judge(latency_amplification, "network.latency_amplification", drift)
    assert c.passed is True and c.value == pytest.approx(40 / 40, rel=0.01)
    assert "30 ms (1–10 s) and 50 ms (23–40 s)" in c.detail
    # the clean stretch after is cut at the next network event's start
    reset = _event("reset_peer", 26, 30, resets=5)
    c = _judge(latency_amplification, "network.latency_amplification",
               {**drift, "chaos": [ev, reset]})  # fmt: skip
    assert "50 ms (23–26 s)" in c.detail and c.value == pytest.approx(1.0, rel=0.01)
    # a server that amplifies still fails, whatever it does after: 300 ms during
    stalled = {**drift, "windows": _windows({(0, 10): 30.0, (10, 20): 300.0, (20, 40): 50.0}, 40)}
    c = _judge(latency_amplification, "network.latency_amplification", stalled)
    assert c.passed is False and c.value == pytest.approx((300 - 40) / 40, rel=0.01)
    # no clean window after (the run ended with the toxic): the stretch before alone
    cut = {**drift, "windows": _windows({(0, 10): 30.0, (10, 20): 80.0}, 20), "duration_s": 20.0}
    c = _judge(latency_amplification, "network.latency_amplification", cut)
    assert c.value == pytest.approx(50 / 40, rel=0.01) and " and " not in c.detail.split("[")[1]


def _server(socks: list[int], conns: list[int], threads: list[int]) -> dict[str, Any]:
    return {"started_unix": 100.0, "series": {"t": [float(i) for i in range(len(socks))],
            "socket_fds": socks, "client_conns": conns, "threads": threads}}  # fmt: skip


def test_leaks_nets_out_the_harness_connections() -> None:
    ev = _event("reset_peer", 20, 25, resets=300)
    n = 40
    # the harness's pool grows after the faults (more client sockets), the server's own
    # sockets do not: a pass
    grow = {"chaos": [ev], "started_unix": 100.0, "duration_s": n,
            "server": _server([5] * 20 + [20] * 20, [2] * 20 + [17] * 20, [6] * n)}  # fmt: skip
    c = _judge(leaks, "network.leaks", grow)
    assert c.passed is True and c.value == 0 and c.n == 300
    # one socket per reset stays open: a fail naming it
    leak = {**grow, "server": _server([5] * 20 + [305] * 20, [2] * n, [6] * n)}
    c = _judge(leaks, "network.leaks", leak)
    assert c.passed is False and c.value == 300 and "1 per reset" in c.detail
    # a leaked thread per reset is caught the same way
    threads = {**grow, "server": _server([5] * n, [2] * n, [6] * 20 + [306] * 20)}
    assert _judge(leaks, "network.leaks", threads).passed is False
    # a count read late (None) leaves its tick out — never pairs another tick's sockets
    # with it, and the other ticks still judge the pool as the harness's
    late = [2] * 20 + [17] * 20
    late[30] = None
    c = _judge(
        leaks, "network.leaks", {**grow, "server": _server([5] * 20 + [20] * 20, late, [6] * n)}
    )
    assert c.passed is True and c.value == 0
    # no server samples: skipped, never passed
    c = _judge(leaks, "network.leaks", {**grow, "server": None})
    assert c.passed is None and "no server-side samples" in c.skipped


def test_checks_judge_through_the_engine() -> None:
    ev = _event("latency", 10, 20, delay_s=32.0)
    result = {
        "name": "network",
        "chaos": [ev],
        "windows": _windows({(10, 20): 72.0}, 30),
        "check_config": {"network.latency_amplification": {}},
        "duration_s": 30,
        "counters": {"scheduled": 1, "ok": 1, "dropped": 0, "in_flight": 0, "failed": {}},
    }
    judged = judge_scenario(result)
    by_id = {c["id"]: c for c in judged["checks"]}
    assert by_id["network.latency_amplification"]["passed"] is True
