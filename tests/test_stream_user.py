"""The streaming Locust user (harness/load/stream_user.py, stream_recording.py,
stream_plugin.py, locustfiles/llm.py): statistics merged exactly across processes, one
Locust event per stream, dropped sends counted, and — slow — a real headless Locust run
against the reference LLM server whose histograms count every request made, every
stream verified, and whose TTFT and inter-token times agree with the server's own
timestamps (``--record-timings``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gevent
import pytest
from gevent.server import StreamServer

from harness.load import http
from harness.load.stream_http import StreamLimits, exchange_stream, stream_client
from harness.load.stream_recording import StreamStats
from harness.load.stream_user import (
    StreamClass,
    StreamEngine,
    StreamSettings,
    parse_classes,
    prepare,
)
from harness.protocols.openai import CHAT_PATH, Generation, chat_body, encode_body
from harness.results import hdr
from harness.testing.llm_streams import DONE_EVENT, chunk_event, synthetic_record
from harness.testing.raw_http import requests_on

REPO = Path(__file__).resolve().parent.parent


def record(ttft: float, gaps: list[float], *, failed: bool = False):
    """A synthetic stream: a token event at ``ttft``, then one after each gap; with its
    finish, usage and [DONE] unless ``failed`` (then it ends without a finish reason)."""
    at = [ttft]
    for g in gaps:
        at.append(at[-1] + g)
    events = [(t, chunk_event(f" t{i}")) for i, t in enumerate(at)]
    if not failed:
        tail = chunk_event(finish_reason="length") + chunk_event(usage=(4, len(at))) + DONE_EVENT
        events.append((at[-1], tail))
    return synthetic_record(events, end_at=at[-1] + 0.001, count_tokens=None)


def test_stats_merged_from_workers_equal_the_stats_of_all_streams_in_one() -> None:
    streams = [record(0.01 * (i + 1), [0.002 + 0.0001 * (i % 7)] * (3 + i % 5)) for i in range(40)]
    streams.append(record(0.5, [0.1], failed=True))
    whole = StreamStats()
    parts = [StreamStats(), StreamStats(), StreamStats()]
    for i, rec in enumerate(streams):
        whole.record("a" if i % 2 else "b", rec, verified=True)
        parts[i % 3].record("a" if i % 2 else "b", rec, verified=True)
    master = StreamStats()
    for part in parts:
        master.merge(json.loads(json.dumps(part.drain())))  # through the wire's JSON
    assert master.summary() == whole.summary()
    total = master.summary()["total"]
    assert total["requests"] == 41 and total["failed"] == 1 and total["ok"] == 40
    assert total["ttft_ms"]["count"] == 40 and total["e2e_failed_ms"]["count"] == 1
    assert total["itl_ms"]["count"] == sum(len(r.token_times_s) - 1 for r in streams[:40])
    assert total["goodput"]["by_problem"].get("no_finish_reason") == 1
    # the merged p99 is the nearest-rank p99 of all the TTFTs, to HDR precision
    ttfts = sorted(r.ttft_s * 1000 for r in streams[:40])
    want = ttfts[hdr.nearest_rank(40, 0.99) - 1]
    assert total["ttft_ms"]["p99_ms"] == pytest.approx(want, rel=1e-3)


TOKENS = [" ab", " cd", " ef"]


def _stream_body(cut: bool) -> bytes:
    events = [chunk_event(role="assistant", content="")] + [chunk_event(t) for t in TOKENS]
    if not cut:
        events += [chunk_event(finish_reason="length"), chunk_event(usage=(4, 3)), DONE_EVENT]
    return b"".join(events)


@pytest.fixture
def fake_llm() -> Iterator[tuple[str, list[bool]]]:
    """A server with /v1/models and a chat stream; each POST pops whether to cut it."""
    cuts: list[bool] = []

    def handle(sock, _addr) -> None:
        for head, _body in requests_on(sock):
            if head.startswith(b"GET"):
                body = b'{"data":[{"id":"m","owned_by":"someone"}]}'
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                continue
            cut = cuts.pop(0) if cuts else False
            body = _stream_body(cut)
            if cut:
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9999\r\n\r\n" + body)
                sock.close()
                return
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", cuts
    finally:
        server.stop(timeout=1)


def test_one_locust_event_per_stream_with_tokens_and_the_failing_problem(fake_llm) -> None:
    url, cuts = fake_llm
    fired: list[dict] = []
    engine = StreamEngine(
        StreamSettings(url, rate_per_user=0), fire_request=lambda **kw: fired.append(kw)
    )
    assert engine.model == "m" and not engine.reference and not engine.verify
    cuts.extend([False, True, False])
    records = [engine.send(time.perf_counter()) for _ in range(3)]
    assert len(fired) == 3
    assert [e["name"] for e in fired] == ["chat [default]"] * 3
    assert [e["response_length"] for e in fired] == [3, 3, 3]  # usage, else one per event
    assert fired[0]["exception"] is None and fired[2]["exception"] is None
    assert "truncated" in str(fired[1]["exception"])
    assert fired[1]["response_time"] == pytest.approx(records[1].end_s * 1000)
    summary = StreamStats()
    summary.merge(engine.finish())
    total = summary.summary()["total"]
    assert (total["requests"], total["ok"], total["failed"], total["verified"]) == (3, 2, 1, 0)
    assert total["goodput"]["by_problem"]["transport_error"] == 1


def test_a_send_that_finds_the_pool_full_is_dropped_and_reported(fake_llm) -> None:
    url, _ = fake_llm
    fired: list[dict] = []
    settings = StreamSettings(url, max_in_flight=1)
    engine = StreamEngine(settings, fire_request=lambda **kw: fired.append(kw))
    now = time.perf_counter()
    engine.spawn(now)
    engine.spawn(now)  # the one slot is taken: dropped, never sent
    total = StreamStats()
    total.merge(engine.finish())
    got = total.summary()["total"]
    assert (got["requests"], got["dropped"]) == (1, 1)
    assert sum(1 for e in fired if "dropped" in str(e["exception"])) == 1


def test_prepared_requests_ask_for_a_stream_with_usage_and_predict_the_reference_answer() -> None:
    settings = StreamSettings("http://127.0.0.1:9", max_tokens=8, prompt_tokens=5, prompts=2)
    client = stream_client(http.Client())
    reqs = prepare(settings, "reference-llm", True, client)
    head, _, body = reqs[0].raw.partition(b"\r\n\r\n")
    doc = json.loads(body)
    assert doc["stream"] is True and doc["stream_options"] == {"include_usage": True}
    assert doc["max_tokens"] == 8 and len(doc["messages"][0]["content"].split()) == 5
    assert b"Accept: text/event-stream" in head and b"Accept-Encoding: identity" in head
    assert reqs[0].expected is not None and reqs[0].expected.completion_tokens == 8
    assert reqs[0].expected.text != reqs[1].expected.text  # one seed per prompt


def test_traffic_classes_are_parsed_or_refused_naming_the_fix() -> None:
    assert parse_classes("high:0.2:1, low:0.8:2") == (
        StreamClass("high", 0.2, 1),
        StreamClass("low", 0.8, 2),
    )
    assert parse_classes("only:1") == (StreamClass("only", 1.0, None),)
    for bad, says in (
        ("high:0.2:1,low:0.7:2", "sum to 0.9"),
        ("high", "NAME:SHARE[:PRIORITY]"),
        ("high:x", "NAME:SHARE[:PRIORITY]"),
        ("a:0.5,a:0.5", "twice"),
        ("a:1.5,b:-0.5", "share 1.5"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_classes(bad)


def test_each_request_draws_its_class_and_is_sent_and_recorded_under_it(fake_llm) -> None:
    url, _ = fake_llm
    fired: list[dict] = []
    classes = parse_classes("high:0.2:1,low:0.8:2")
    engine = StreamEngine(
        StreamSettings(url, rate_per_user=0, classes=classes),
        fire_request=lambda **kw: fired.append(kw),
    )
    for cls, priority in (("high", 1), ("low", 2)):
        body = json.loads(engine.requests[cls][0].raw.partition(b"\r\n\r\n")[2])
        assert body["priority"] == priority and body["stream"] is True
    assert "priority" not in json.loads(
        prepare(StreamSettings(url), "m", False, stream_client(http.Client()))[0].raw.partition(
            b"\r\n\r\n"
        )[2]
    )
    pick = engine.class_picker(0, 0)
    drawn = [pick() for _ in range(2000)]
    assert drawn.count("high") / len(drawn) == pytest.approx(0.2, abs=0.03)
    again = engine.class_picker(0, 0)
    assert [again() for _ in range(2000)] == drawn  # seeded per (worker, user)
    other = engine.class_picker(1, 0)
    assert [other() for _ in range(2000)] != drawn
    for cls in drawn[:10]:
        engine.send(time.perf_counter(), cls=cls)
    assert [e["name"] for e in fired] == [f"chat [{c}]" for c in drawn[:10]]
    merged = StreamStats()
    merged.merge(engine.finish())
    by_class = merged.summary()["classes"]
    assert {c: by_class[c]["requests"] for c in by_class} == {
        c: drawn[:10].count(c) for c in set(drawn[:10])
    }


# -- against the reference server (slow) ---------------------------------------------------


@pytest.fixture(scope="module")
def reference_llm():
    from harness.testing.server import http_status, start_server, wait_until

    args = ("--api", "openai", "--time-scale", "0.2", "--record-timings")
    with start_server(*args, wait_for_ready=False) as srv:
        wait_until(lambda: http_status(srv.url, "/health", timeout=1.0) == 200, timeout=30)
        yield srv


@pytest.mark.slow
def test_a_headless_locust_run_counts_and_verifies_every_stream(reference_llm, tmp_path) -> None:
    summary = tmp_path / "summary.json"
    stats = tmp_path / "stats"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "llm.py"),
        "--host", reference_llm.url, "--headless", "-u", "4", "-r", "4", "-t", "4s",
        "--processes", "2", "--llm-rate", "2", "--llm-max-tokens", "32",
        "--llm-summary", str(summary), "--csv", str(stats),
        "--llm-classes", "high:0.25:1,low:0.75:2",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(summary.read_text())
    total = doc["total"]
    rows = (tmp_path / "stats_stats.csv").read_text().splitlines()
    locust_requests = sum(int(r.split(",")[2]) for r in rows if r.startswith("POST,chat ["))
    assert doc["missing_workers"] == []
    assert total["requests"] == locust_requests > 0
    # every stream counted under its class, in Locust's stats and in the merged summary
    for cls in ("high", "low"):
        row = next(r for r in rows if r.startswith(f"POST,chat [{cls}]"))
        assert int(row.split(",")[2]) == doc["classes"][cls]["requests"] > 0
    assert total["e2e_ms"]["count"] == total["ttft_ms"]["count"] == total["requests"]
    assert total["tpot_ms"]["count"] == total["max_gap_ms"]["count"] == total["requests"]
    assert total["itl_ms"]["count"] == total["requests"] * 31
    assert total["verified"] == total["requests"] and total["wrong"] == 0
    assert total["failed"] == total["cancelled"] == total["dropped"] == 0
    assert total["tokens_out"] == 32 * total["requests"]
    assert total["goodput"]["by_problem"] == {}


@pytest.mark.slow
def test_ttft_and_inter_token_times_agree_with_the_servers_timestamps(reference_llm) -> None:
    """The client's read times against the server's write times (one clock, the host's
    CLOCK_MONOTONIC: perf_counter here). Each token's delivery delay (read − write) is
    what TTFT and every gap carry beyond the server's own; their spread is the client's
    timing error."""
    base = reference_llm.url
    http.request(base + "/debug/timings?clear=1")
    host, port, _ = http.split_url(base)
    client = stream_client(http.Client())
    conn = http.Connection(host, port, client=client)
    records = []
    for i in range(20):
        body = chat_body("reference-llm", [{"role": "user", "content": f"agree {i}"}],
                         Generation(max_tokens=32, ignore_eos=True))  # fmt: skip
        data = encode_body(body)
        raw = http.build_head("POST", CHAT_PATH, host, port, len(data), client) + data
        records.append(exchange_stream(conn, raw, StreamLimits(10.0, 5.0), clock=time.monotonic))
        gevent.sleep(0.01)
    conn.close()
    status, answer = http.request(base + "/debug/timings")
    server = [t for t in json.loads(answer) if t["stream"]]
    assert status == 200 and len(server) == len(records) == 20
    delays, gap_errors = [], []
    for rec, srv in zip(records, server, strict=True):
        assert not rec.problems
        writes = [w / 1e9 for w, _ in srv["events"]]
        reads = [rec.intended_at + t for t in rec.token_times_s]
        assert len(writes) == len(reads) == 32
        delays += [r - w for r, w in zip(reads, writes, strict=True)]
        gap_errors += [
            (r2 - r1) - (w2 - w1)
            for r1, r2, w1, w2 in zip(reads, reads[1:], writes, writes[1:], strict=False)
        ]
    # the server reads its clock after its write returned: a read may come before it
    delays = sorted(abs(d) for d in delays)
    gap_errors = sorted(abs(e) for e in gap_errors)
    p99 = hdr.nearest_rank(len(delays), 0.99) - 1
    assert delays[p99] < 0.001
    assert gap_errors[hdr.nearest_rank(len(gap_errors), 0.99) - 1] < 0.001
