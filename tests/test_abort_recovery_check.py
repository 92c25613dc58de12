"""llm.abort_recovery: the KV-cache gauge (else the server's RSS) at the end of the recovery
against its baseline, on the scenario's time base; skipped without a gauge, RSS or aborts."""

from __future__ import annotations

from typing import Any

import pytest

from harness.checks import REGISTRY, Check, resolve_params

STAGES = [
    {"name": "baseline", "start_s": 0.0, "end_s": 10.0, "kind": "open"},
    {"name": "storm", "start_s": 10.0, "end_s": 22.0, "kind": "open"},
    {"name": "recovery", "start_s": 22.0, "end_s": 38.0, "kind": "open"},
]
GAUGE = 'vllm:kv_cache_usage_perc{model_name="m"}'


def _result(
    kv: list[float] | None,
    rss: list[float] | None = None,
    aborted: int = 90,
    sampler_offset_s: float = 0.0,
) -> dict[str, Any]:
    """One sample a second from the sampler's t = 0, which is ``sampler_offset_s`` into
    the scenario (the baseline's samples are the first ten values)."""
    n = len(kv if kv is not None else rss or [])
    t = [float(i) for i in range(n)]
    sc: dict[str, Any] = {
        "started_unix": 1000.0,
        "stages": STAGES,
        "server": {"started_unix": 1000.0 + sampler_offset_s, "series": {"t": t}},
        "tokens": {
            "by_stage": {
                "classes": {
                    "storm": {"aborted": aborted, "requests": 9, "conforming": 9},
                    "recovery": {"requests": 120, "conforming": 120, "dropped": 0},
                }
            }
        },
    }
    if kv is not None:
        sc["metrics"] = {"series": {GAUGE: {"t": t, "v": kv}}}
    if rss is not None:
        sc["server"]["series"]["rss_bytes"] = rss
    return sc


def _judge(sc: dict[str, Any], **params: Any) -> Check:
    check_id = "llm.abort_recovery"
    return REGISTRY[check_id].fn(sc, resolve_params(check_id, params))


def _kv(baseline: float, storm: float, recovery_end: float) -> list[float]:
    """38 one-second samples: baseline, storm, and a recovery ending at ``recovery_end``."""
    return [baseline] * 10 + [storm] * 12 + [baseline] * 11 + [recovery_end] * 5


def test_usage_back_to_its_baseline_passes_and_a_ratchet_fails() -> None:
    ok = _judge(_result(_kv(0.04, 0.01, 0.035)))
    assert ok.passed is True and ok.value == pytest.approx(-0.005)
    assert "vllm:kv_cache_usage_perc" in ok.detail and "90 aborted" in ok.detail
    assert "120 of 120 streams sent in the recovery" in ok.detail
    leak = _judge(_result(_kv(0.04, 0.15, 0.21)))
    assert leak.passed is False and leak.value == pytest.approx(0.17)
    assert "not freed" in leak.detail
    # the threshold is the tolerance in fraction points of the cache
    assert _judge(_result(_kv(0.04, 0.15, 0.21)), threshold=0.2).passed is True


def test_only_the_baseline_after_its_discard_and_the_recoverys_tail_are_compared() -> None:
    kv = _kv(0.04, 0.5, 0.04)
    kv[0:2] = [0.3, 0.3]  # the warm-up, discarded
    kv[22:30] = [0.4] * 8  # the recovery's start, still draining: not its tail
    assert _judge(_result(kv)).passed is True
    assert _judge(_result(kv), discard_s=0.0, tail_s=16.0).value > 0.05


def test_the_metrics_are_placed_on_the_scenarios_time_base() -> None:
    # the sampler started 3 s into the scenario: its t = 7 is the scenario's 10 s
    kv = [0.04] * 7 + [0.5] * 28
    sc = _result(kv, sampler_offset_s=3.0)
    c = _judge(sc)
    assert c.passed is False and "baseline 2-10 s" in c.detail
    assert c.value == pytest.approx(0.46)


def test_without_a_kv_gauge_the_servers_rss_is_judged_relative_to_its_baseline() -> None:
    mib = 1024.0 * 1024.0
    flat = _judge(_result(None, rss=[200 * mib] * 38))
    assert flat.passed is True and "RSS" in flat.detail and flat.threshold == 0.10
    grown = _judge(_result(None, rss=[200 * mib] * 22 + [260 * mib] * 16))
    assert grown.passed is False and grown.value == pytest.approx(0.30)


def test_skipped_without_aborts_a_gauge_and_rss_or_a_stage() -> None:
    none = _judge(_result(_kv(0.04, 0.04, 0.04), aborted=0))
    assert none.passed is None and "no stream was aborted in stage 'storm'" in none.detail
    blind = _result(None)
    blind["server"] = {"started_unix": 1000.0, "series": {"t": []}}
    c = _judge(blind)
    assert c.passed is None and "vllm:kv_cache_usage_perc" in c.detail and "RSS" in c.detail
    assert "/metrics was not scraped (--metrics-url URL" in c.detail  # nothing was asked
    other = _result(None)
    other["server"] = blind["server"]
    other["metrics"] = {"series": {"process_resident_memory_bytes": {"t": [1.0], "v": [1.0]}}}
    c = _judge(other)  # scraped, but no gauge of the KV cache among what it exports
    assert c.passed is None and "exported no KV-cache gauge in /metrics" in c.detail
    c = _judge(_result(_kv(0.04, 0.04, 0.04)), recovery_stage="after")
    assert c.passed is None and "no stage 'after'" in c.detail
    few = _judge(_result(_kv(0.04, 0.04, 0.04)[:24]))  # the recovery's tail never scraped
    assert few.passed is None and "samples" in few.detail
