"""Client aborts against the reference LLM server as a real process: the load's hang-up
(``exchange_stream(..., abort_after=N)``) is a close the server sees — it counts each one
as an aborted request and frees its KV blocks; with ``kv-leak-on-abort`` it counts them
and keeps the blocks, which is what ``llm.abort_recovery`` judges."""

from __future__ import annotations

import pytest

from harness.load import http
from harness.load.stream_http import StreamLimits, exchange_stream, stream_client
from harness.protocols import openai
from harness.testing.server import http_status, scrape, start_server, wait_until

pytestmark = pytest.mark.slow

KV = 'vllm:kv_cache_usage_perc{model_name="reference-llm"}'
ABORTS = 'vllm:request_success_total{finished_reason="abort",model_name="reference-llm"}'
STREAMS = 6


def _aborted_streams(url: str, port: int) -> None:
    client = stream_client(http.Client())
    gen = openai.Generation(max_tokens=200, ignore_eos=True)
    for i in range(STREAMS):
        body = openai.chat_body("reference-llm", [{"role": "user", "content": f"w{i} x y"}], gen)
        data = openai.encode_body(body)
        raw = http.build_head("POST", openai.CHAT_PATH, "127.0.0.1", port, len(data), client)
        conn = http.Connection("127.0.0.1", port, client=client)
        try:
            rec = exchange_stream(conn, raw + data, StreamLimits(30.0, 10.0), abort_after=3)
        finally:
            conn.close()
        assert rec.aborted and not rec.failed and len(rec.token_times_s) == 3


@pytest.mark.parametrize("leak", [False, True], ids=["healthy", "kv-leak-on-abort"])
def test_the_server_sees_each_hang_up_and_frees_its_blocks_unless_it_leaks(leak: bool) -> None:
    args = ("--time-scale", "0.5", *(("--fault", "kv-leak-on-abort") if leak else ()))
    with start_server("--api", "openai", *args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        _aborted_streams(srv.url, srv.port)
        wait_until(lambda: scrape(srv.url).get(ABORTS, 0) == STREAMS, timeout=10)
        usage = scrape(srv.url)[KV]
    if leak:
        assert usage > 0  # each aborted sequence's blocks stay allocated
    else:
        assert usage == 0  # nothing runs: every block was freed at the hang-up
