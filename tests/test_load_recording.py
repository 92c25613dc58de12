"""Recording: HDR merge is exact, counters and windows survive the worker → master trip."""

from __future__ import annotations

import random

import pytest

from harness.analysis.hdr import decode, new_histogram, summary_ms
from harness.load.recording import Recording, counters_view


def _latencies(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    # a long-tailed mix: most fast, some slow, a few very slow
    return [int(rng.lognormvariate(7, 1.2)) + 1 for _ in range(n)]


def test_merged_worker_histograms_equal_one_histogram() -> None:
    a, b = _latencies(1, 20_000), _latencies(2, 5_000)
    single = new_histogram()
    for v in a + b:
        single.record_value(v)
    master = Recording()
    for source, values in (("w0", a), ("w1", b)):
        rec = Recording()
        for i, v in enumerate(values):
            rec.scheduled("default", "s1", i / 1000)
            rec.sent("default", "s1", i / 1000, 10.0)
            rec.done("default", "s1", i / 1000, "ok", v)
        master.merge(rec.drain(now_t=1e9, final=True), source=source)
    master.finish()
    merged = master.classes["default"].hdr
    assert merged.get_total_count() == len(a) + len(b)
    for q in (50, 90, 99, 99.9, 100):
        assert merged.get_value_at_percentile(q) == single.get_value_at_percentile(q)
    # averaging the two workers' p99s is not the merged p99 (the reason we merge)
    ha, hb = new_histogram(), new_histogram()
    for v in a:
        ha.record_value(v)
    for v in b:
        hb.record_value(v)
    averaged = (ha.get_value_at_percentile(99) + hb.get_value_at_percentile(99)) / 2
    assert averaged != merged.get_value_at_percentile(99)


def _merged(encoded: bool) -> Recording:
    """Three drains of the same recording, one still in flight at the second, merged;
    every fifth request a stream (its token figures per window and per class/stage)."""
    from tests.test_token_metrics import stream

    rec, master = Recording(window_s=0.5, first_n=5), Recording(window_s=0.5)
    lat = _latencies(3, 600)
    for i, v in enumerate(lat):
        t = i / 200
        cls, stage = "high" if i % 3 else "low", "s1" if t < 1.5 else "s2"
        rec.scheduled(cls, stage, t)
        rec.sent(cls, stage, t, 100.0 + i)
        if i != 250:  # one request still out at the second drain holds its window back
            outcome = "http_503" if i % 50 == 7 else "ok"
            if i % 5 == 0:
                first = v / 1e7
                s = stream([(first, " ba"), (first + 0.001 * (i % 7), " be")], usage=2)
                rec.stream_ended(cls, t, s)
                for key, name in (("class", cls), ("stage", stage), ("stage_class", cls + stage)):
                    rec.tokens[key].record(name, s)
            rec.done(cls, stage, t, outcome, v)
        if i in (200, 400):
            master.merge(rec.drain(now_t=t, encoded=encoded))
    rec.done("high", "s2", 250 / 200, "ok", 999)
    master.merge(rec.drain(now_t=9.0, final=True, encoded=encoded))
    master.finish()
    return master


def test_this_processs_own_drain_merges_exactly_as_a_workers_encoded_one() -> None:
    """The local runner hands its merge the cells and histograms themselves (no codec on
    the event loop that sends): the merged recording is the same as over the wire."""
    wire, own = _merged(encoded=True), _merged(encoded=False)
    assert own.rows == wire.rows and len(own.rows) == 12
    assert own.by_class() == wire.by_class() and own.by_stage() == wire.by_stage()
    assert own.first_requests() == wire.first_requests()
    assert own.by_source == wire.by_source == {"local": 600}
    assert all("tokens_out_per_s" in r for r in own.rows)
    for key in ("class", "stage", "stage_class"):
        assert own.tokens[key].summary() == wire.tokens[key].summary()
        assert own.tokens[key].summary()["total"]["requests"] == 119  # i = 250 never ended
    for a, b in ((own.dispatch_lag, wire.dispatch_lag), (own.error_latency, wire.error_latency)):
        assert a.get_total_count() == b.get_total_count() > 0
        assert a.get_value_at_percentile(99) == b.get_value_at_percentile(99)


def test_counters_balance_and_failed_breakdown() -> None:
    rec = Recording()
    outcomes = ["ok"] * 7 + ["http_503", "timeout", "cross_wired"]
    for i, o in enumerate(outcomes):
        rec.scheduled("high", "s", 0.1 * i)
        rec.sent("high", "s", 0.1 * i, 5.0)
        rec.done("high", "s", 0.1 * i, o, 1000 + i)
    rec.scheduled("high", "s", 1.5)
    rec.dropped("high", "s", 1.5)
    rec.scheduled("high", "s", 1.6)
    rec.sent("high", "s", 1.6, 5.0)  # still in flight at the end
    master = Recording()
    master.merge(rec.drain(now_t=2.0, final=True))
    master.finish()
    c = counters_view(master.classes["high"].counts, master.in_flight_final)
    assert c["scheduled"] == 12
    assert c["ok"] == 7 and c["dropped"] == 1 and c["in_flight"] == 1
    assert c["failed"]["http_503"] == 1 and c["failed"]["timeout"] == 1
    assert c["failed"]["cross_wired"] == 1 and c["failed_total"] == 3
    assert c["scheduled"] == c["ok"] + c["failed_total"] + c["dropped"] + c["in_flight"]
    # per class and per stage too: the request still out belongs to class high, stage s
    assert master.by_class()["high"]["counters"]["in_flight"] == 1
    assert master.by_stage()["s"]["high"]["counters"]["in_flight"] == 1
    # only ok latencies in the latency histogram; the rest in error_latency
    assert master.classes["high"].hdr.get_total_count() == 7
    assert master.error_latency.get_total_count() == 3


def test_windows_ship_once_complete_and_summarise() -> None:
    rec = Recording(window_s=1.0)
    master = Recording(window_s=1.0)
    master.expect(["w0"])
    # window 0: 100 ok at 1 ms; window 1: 100 ok at 10 ms plus one request still out
    for i in range(100):
        for w, lat in ((0, 1000), (1, 10_000)):
            t = w + i / 100
            rec.scheduled("c", "s", t)
            rec.sent("c", "s", t, 0)
            rec.done("c", "s", t, "ok", lat)
    rec.scheduled("c", "s", 1.995)
    rec.sent("c", "s", 1.995, 0)
    master.merge(rec.drain(now_t=5.0), source="w0")
    # window 0 complete, window 1 still has a request in flight → not yet summarised
    assert [r["t"] for r in master.rows] == [0.0]
    row = master.rows[0]
    assert row["n"] == 100 and row["ok"] == 100 and row["errors"] == {}
    assert abs(row["p99_ms"] - 1.0) < 0.01
    rec.done("c", "s", 1.995, "http_503", 20_000)
    master.merge(rec.drain(now_t=5.0, final=True), source="w0")
    master.finish()
    rows = {r["t"]: r for r in master.rows}
    assert rows[1.0]["n"] == 101 and rows[1.0]["errors"] == {"http_503": 1}
    assert abs(rows[1.0]["p50_ms"] - 10.0) < 0.02
    assert rows[1.0]["scheduled"] == 101


def test_window_waits_for_every_worker() -> None:
    master = Recording(window_s=1.0)
    master.expect(["a", "b"])
    a = Recording()
    a.scheduled("c", "s", 0.5)
    a.sent("c", "s", 0.5, 0)
    a.done("c", "s", 0.5, "ok", 100)
    master.merge(a.drain(now_t=3.0), source="a")
    assert master.rows == []  # b has not shipped window 0 yet
    b = Recording()
    b.scheduled("c", "s", 0.7)
    b.sent("c", "s", 0.7, 0)
    b.done("c", "s", 0.7, "ok", 300)
    master.merge(b.drain(now_t=3.0), source="b")
    assert len(master.rows) == 1 and master.rows[0]["n"] == 2


def test_first_requests_capped_across_drains() -> None:
    rec = Recording(first_n=10)
    master = Recording()
    for batch in range(3):
        for i in range(6):
            t = batch + i / 10
            rec.scheduled("c", "s", t)
            rec.sent("c", "s", t, 0)
            rec.done("c", "s", t, "ok", 1000 * (batch + 1))
        master.merge(rec.drain(now_t=batch + 1.0))
    assert master.first.get_total_count() == 10
    assert master.first.get_max_value() < 2100  # only the earliest answers


def test_percentiles_of_empty_and_decode_roundtrip() -> None:
    assert summary_ms(new_histogram())["p99_ms"] is None
    h = new_histogram()
    for v in range(1, 1001):
        h.record_value(v)
    again = decode(h.encode())
    assert again.get_value_at_percentile(99) == h.get_value_at_percentile(99)
    assert decode(None).get_total_count() == 0


def test_a_windows_token_figures_merge_exactly_across_workers() -> None:
    """Two workers stream in the same window: its row's output tokens per second is their
    sum over the width, and its TTFT / TPOT percentiles are those of all streams together
    (a failed stream's tokens count, its times do not)."""
    from tests.test_token_metrics import stream

    master = Recording(window_s=2.0)
    master.expect(["a", "b"])
    workers = {"a": Recording(window_s=2.0), "b": Recording(window_s=2.0)}
    ttfts = {"a": [0.010, 0.020, 0.030], "b": [0.040, 0.200]}
    for name, rec in workers.items():
        for i, first in enumerate(ttfts[name]):
            t = 0.1 * i
            # 3 tokens: TPOT = (last - first) / 2 = 5 ms each
            s = stream([(first, " ba"), (first + 0.005, " be"), (first + 0.010, " bi")], usage=3)
            rec.scheduled("c", "s", t)
            rec.sent("c", "s", t, 0)
            rec.stream_ended("c", t, s)
            rec.done("c", "s", t, "ok", (first + 0.011) * 1e6)
    bad = stream([(0.05, " ba"), (0.06, " be")], error=True)  # 2 tokens, then an error
    rec = workers["b"]
    rec.scheduled("c", "s", 0.5)
    rec.sent("c", "s", 0.5, 0)
    rec.stream_ended("c", 0.5, bad)
    rec.done("c", "s", 0.5, "error_in_stream", 61_000)
    for name, rec in workers.items():
        master.merge(rec.drain(now_t=9.0, final=True), source=name)
    master.finish()
    (row,) = master.rows
    assert row["tokens_out_per_s"] == (5 * 3 + 2) / 2.0
    assert row["ttft_p50_ms"] == pytest.approx(30.0, abs=0.05)  # 3rd of 5 ok streams
    assert row["ttft_p99_ms"] == pytest.approx(200.0, abs=0.2)
    assert row["tpot_p99_ms"] == pytest.approx(5.0, abs=0.01)


def test_a_window_without_streams_has_no_token_columns() -> None:
    rec = Recording(window_s=1.0)
    rec.scheduled("c", "s", 0.2)
    rec.sent("c", "s", 0.2, 0)
    rec.done("c", "s", 0.2, "ok", 1000)
    master = Recording(window_s=1.0)
    master.merge(rec.drain(now_t=5.0, final=True), source="w")
    master.finish()
    assert not any(k.startswith(("tokens", "ttft", "tpot")) for k in master.rows[0])
