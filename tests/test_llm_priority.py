"""Priority classes over token streams: each request of a scenario draws its class by
share (seeded per load process), carries the class's ``priority`` in its body and is
recorded under its class per stage (``tokens.by_stage_class``, merged exactly across
workers); ``llm.priority_ttft_p99`` judges the high class's TTFT p99 only when another
class absorbed the overload, and fails it whatever the others got."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from harness import protocols
from harness.checks import REGISTRY, resolve_params
from harness.load import stream_exchange
from harness.load.options import scenario_for
from harness.load.recording import Recording
from harness.load.scenario import resolve_scenario
from harness.load.stream_recording import StreamStats, by_stage_class, stage_class_key
from harness.load.users import Engine, Plan
from harness.protocols.openai_wire import ID_FIELD
from harness.testing.llm_streams import synthetic_record, whole_stream_record
from harness.testing.results import scenario
from tests.test_load_users import FakeTime, _options

PROTO = protocols.get("openai")
META = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}


def _stream(ttft: float, n: int = 4, gap: float = 0.02, status: int = 200) -> Any:
    if status != 200:
        return synthetic_record([], status=status, usage_requested=True, count_tokens=None)
    return whole_stream_record([ttft + i * gap for i in range(n)])


def _engine(slot: int, slots: int, sent: list[tuple[str, dict[str, Any]]]) -> Engine:
    sc = scenario_for(_options(str(resolve_scenario("llm_mixed_priority")), verify=False))
    template = PROTO.resolve_inputs(META, "m", (), None, workload=sc.llm)
    plan = Plan(
        origin_unix=5000.0,
        slot=slot,
        slots=slots,
        base_url="http://127.0.0.1:9",
        model="m",
        capacity_rps=38.0,  # the probe's ~38 streams/s on the reference server
        inputs=PROTO.generate_inputs(template, 8, 1),
        golden=None,
        protocol="openai",
    )
    fake = FakeTime()
    eng = Engine(
        sc,
        plan,
        Recording(sc.load.window_s, sc.load.first_requests),
        clock=fake.clock,
        wall=lambda: 5000.0,
        sleep=fake.sleep,
    )

    def exchange(self: Any, conn: Any, raw: bytes, index: int, cls: str, *rest: Any) -> Any:
        sent.append((cls, json.loads(raw[raw.index(b"\r\n\r\n") + 4 :])))
        return real(self, conn, raw, index, cls, *rest)

    real = stream_exchange.StreamExchange.exchange_pool
    eng.streams.exchange_pool = exchange.__get__(eng.streams)  # type: ignore[union-attr,method-assign]
    return eng


def _run(eng: Engine) -> Engine:
    """The whole schedule, and every send it spawned."""
    eng.run_open()
    eng.pool.join()
    return eng


@pytest.fixture
def fake_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stream answered at once: TTFT 0.1 s for "high", 3 s for "low"."""

    def exchange_stream(conn: Any, raw: bytes, limits: Any, **kw: Any) -> Any:
        return _stream(0.1 if b'"priority":1' in raw else 3.0)

    monkeypatch.setattr(stream_exchange, "exchange_stream", exchange_stream)


def test_each_request_draws_its_class_by_share_and_carries_its_priority(fake_streams) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    _run(_engine(0, 1, sent))
    counts = Counter(cls for cls, _ in sent)
    n = sum(counts.values())
    assert n > 300 and set(counts) == {"high", "low"}
    assert counts["high"] / n == pytest.approx(0.2, abs=0.05)  # ~4 sigma at n ≈ 400 (here ~1,250)
    for cls, body in sent:
        assert body["priority"] == {"high": 1, "low": 2}[cls]
        assert body["stream"] is True and len(body[ID_FIELD]) == 16
    # seeded per load process: the same draws again, another process draws its own
    again: list[tuple[str, dict[str, Any]]] = []
    _run(_engine(0, 1, again))
    assert [c for c, _ in again] == [c for c, _ in sent]
    other: list[tuple[str, dict[str, Any]]] = []
    _run(_engine(1, 2, other))
    assert [c for c, _ in other][:40] != [c for c, _ in sent][:40]


def test_streams_are_recorded_per_stage_and_class_and_merged_exactly(fake_streams) -> None:
    master = Recording()
    whole = StreamStats()
    for slot in (0, 1):
        sent: list[tuple[str, dict[str, Any]]] = []
        eng = _run(_engine(slot, 2, sent))
        worker = eng.recording
        for key, cell in worker.tokens["stage_class"].cells.items():
            whole.cell(key).add_cell(cell)
        master.merge(worker.drain(60.0, final=True), source=f"w{slot}")
    merged = by_stage_class(master.tokens["stage_class"])
    assert set(merged) == {"warmup", "overload"}
    assert merged == by_stage_class(whole)  # histograms added, not percentiles averaged
    high, low = merged["overload"]["high"], merged["overload"]["low"]
    assert high["ttft_ms"]["p99_ms"] == pytest.approx(100, rel=0.01)
    assert low["ttft_ms"]["p99_ms"] == pytest.approx(3000, rel=0.01)
    by_class = master.tokens["class"].summary()["classes"]
    for cls in ("high", "low"):
        total = sum(merged[s][cls]["requests"] for s in merged if cls in merged[s])
        assert total == by_class[cls]["requests"]


def _tokens(high: list[Any], low: list[Any], dropped_low: int = 0) -> dict[str, Any]:
    stats = StreamStats()
    for cls, recs in (("high", high), ("low", low)):
        for rec in recs:
            stats.record(stage_class_key("overload", cls), rec)
    for _ in range(dropped_low):
        stats.dropped(stage_class_key("overload", "low"))
    return {"by_class": {}, "by_stage": {}, "by_stage_class": by_stage_class(stats)}


def _judge(tokens: dict[str, Any] | None, **params: Any) -> Any:
    fields = {} if tokens is None else {"tokens": tokens}
    sc = scenario("llm_mixed_priority", 45.0, **fields)
    spec = resolve_params("llm.priority_ttft_p99", {"stage": "overload", **params})
    return REGISTRY["llm.priority_ttft_p99"].fn(sc, spec)


def test_the_check_passes_a_protected_high_class_while_the_low_one_waits() -> None:
    c = _judge(_tokens([_stream(0.12)] * 60, [_stream(6.0)] * 240))
    assert c.passed is True and c.value == pytest.approx(120, rel=0.01)
    assert "absorbed by class 'low': TTFT p99" in c.detail


def test_the_low_class_may_absorb_the_overload_by_being_shed() -> None:
    low = [_stream(0.5)] * 230 + [_stream(0, status=429)] * 10  # 4 % refused
    c = _judge(_tokens([_stream(0.12)] * 60, low))
    assert c.passed is True and "10 of 240 failed or dropped" in c.detail


def test_the_check_fails_a_high_class_that_waits_behind_the_low_one() -> None:
    c = _judge(_tokens([_stream(0.12)] * 55 + [_stream(8.0)] * 5, [_stream(0.2)] * 240))
    assert c.passed is False and c.value == pytest.approx(8000, rel=0.01)
    assert "waited longer than class 'low' p99 200 ms" in c.detail
    assert "does not order its queue by priority" in c.detail
    # refused or timed-out high requests are over the SLO, whatever the successes' p99
    refused = _tokens([_stream(0.12)] * 57 + [_stream(0, status=429)] * 3, [_stream(6.0)] * 240)
    c = _judge(refused)
    assert c.passed is False and c.value == float("inf") and "3 of 60" in c.detail
    assert "fewer than class 'low' (0.0%)" not in c.detail
    assert "at least as often as class 'low' (0.0%)" in c.detail


def test_the_failure_says_where_the_high_class_waited() -> None:
    """The low class's TTFT beside the high one's tells an order that was not applied
    where the wait was from an order that was, but not enough."""
    # vLLM at 1.5x its capacity in short streams: both classes waited in its API front
    # end, before the engine's queue its priority orders (docs/servers.md)
    alike = _judge(_tokens([_stream(2.5)] * 60, [_stream(2.75)] * 240))
    assert alike.passed is False
    assert "both classes waited alike (class 'low' p99 2,750 ms)" in alike.detail
    assert "in front of the queue it orders" in alike.detail
    ordered = _judge(_tokens([_stream(2.5)] * 60, [_stream(14.0)] * 240))
    assert ordered.passed is False
    assert "waited less than class 'low' p99 14,000 ms, but past its SLO" in ordered.detail
    # the high class refused less than the low one, still over the 1 % a p99 leaves
    shed = _tokens(
        [_stream(0.12)] * 57 + [_stream(0, status=429)] * 3,
        [_stream(0.3)] * 120 + [_stream(0, status=429)] * 120,
    )
    c = _judge(shed)
    assert c.passed is False and "fewer than class 'low' (50.0%)" in c.detail


def test_the_check_is_not_judged_when_nothing_was_overloaded_or_measured() -> None:
    idle = _judge(_tokens([_stream(0.12)] * 60, [_stream(0.15)] * 240))
    assert idle.passed is None and "did not overload the server" in idle.skipped
    few = _judge(_tokens([_stream(0.12)] * 20, [_stream(6.0)] * 240))
    assert few.passed is None and "too few for a p99" in few.skipped
    none = _judge(None)
    assert none.passed is None and "--protocol openai" in none.skipped
    other_stage = _judge(_tokens([_stream(0.12)] * 60, [_stream(6.0)] * 240), stage="spike")
    assert other_stage.passed is None and "stage 'spike'" in other_stage.skipped
