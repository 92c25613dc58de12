"""Every check on hand-built scenario results: pass, fail, skipped, insufficient samples."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from harness.checks import Check
from harness.testing.checks import (
    counters,
    failed,
    hdr,
    hog_record,
    inconclusive_rss_result,
    passed,
    priority_result,
    result,
    row,
    run,
    skipped,
    soak_result,
    spike_result,
    steady_result,
)
from harness.testing.results import stage

# --- cold start ----------------------------------------------------------------------------


def test_time_to_ready() -> None:
    c = run("cold_start.time_to_ready_s", result(time_to_ready_s=2.5))
    passed(c)
    assert (c.value, c.threshold, c.op, c.unit) == (2.5, 30.0, "<=", "s")
    failed(run("cold_start.time_to_ready_s", result(time_to_ready_s=2.5), threshold=1))
    skipped(run("cold_start.time_to_ready_s", result()), "--sut-cmd")


def test_first_p99_ratio() -> None:
    rng = np.random.default_rng(0)
    steady = rng.lognormal(np.log(20), 0.3, 2000)
    warm = steady_result(steady, first_requests={"n": 100, "latency_hdr": hdr(steady[:100] * 1000)})
    c = run("cold_start.first_p99_ratio", warm, steady_stage="steady")
    passed(c)
    assert c.value < 2 and c.n == 100
    # no warmup: the first requests take 400 ms
    cold = steady_result(steady, first_requests={"n": 100, "latency_hdr": hdr([400_000] * 100)})
    c = run("cold_start.first_p99_ratio", cold)
    failed(c)
    assert c.value > 5 and "warm the model up" in c.detail
    skipped(run("cold_start.first_p99_ratio", steady_result(steady)), "first-request")
    few = steady_result(steady, first_requests={"n": 5, "latency_hdr": hdr([20_000] * 5)})
    skipped(run("cold_start.first_p99_ratio", few), "only 5")


def test_first_p99_ratio_ignores_tiny_absolute_excess() -> None:
    # steady p99 0.5 ms, first p99 4 ms: 8x, but 3.5 ms is connection setup, not a defect
    fast = steady_result([0.5] * 2000, first_requests={"n": 100, "latency_hdr": hdr([4000] * 100)})
    c = run("cold_start.first_p99_ratio", fast)
    passed(c)
    assert c.value == pytest.approx(8, rel=0.01) and "noise" in c.detail


# --- steady state ---------------------------------------------------------------------------


def test_steady_p99_pass_fail_insufficient() -> None:
    rng = np.random.default_rng(1)
    good = steady_result(rng.lognormal(np.log(20), 0.3, 2000))
    c = run("steady.p99_ms", good, stage="steady")
    passed(c)
    assert c.unit == "ms" and c.n == 2000 and 30 < c.value < 80
    c = run("steady.p99_ms", good, threshold=25)
    failed(c)
    assert "> 25 ms" in c.detail
    c = run("steady.p99_ms", steady_result(rng.lognormal(np.log(20), 0.3, 300)))
    skipped(c, "insufficient samples", "n >= 459")
    assert c.n == 300 and c.value is not None  # the estimate is still reported
    skipped(run("steady.p99_ms", result()), "no successful")


def test_steady_error_rate() -> None:
    c = run("steady.error_rate", steady_result([5.0] * 995, {"http_503": 5}))
    passed(c)
    assert c.value == pytest.approx(0.005) and c.n == 1000
    c = run("steady.error_rate", steady_result([5.0] * 950, {"http_500": 40, "timeout": 10}))
    failed(c)
    assert "http_500 40" in c.detail and c.value == pytest.approx(0.05)
    skipped(run("steady.error_rate", steady_result([5.0] * 20)), "insufficient")


def test_steady_error_rate_counts_drops_unless_told_not_to() -> None:
    sc = steady_result([5.0] * 900)
    sc["counters"] = counters(900, dropped=100)
    failed(run("steady.error_rate", sc))
    passed(run("steady.error_rate", sc, include_dropped=False))


def test_steady_throughput() -> None:
    # 3,960 offered (the Poisson draw of a nominal 4,000), every one answered
    c = run("steady.throughput", steady_result([5.0] * 3960), stage="steady")
    passed(c)
    assert c.threshold == pytest.approx(0.95 * 99.0) and c.value == pytest.approx(99.0)
    failed(run("steady.throughput", steady_result([5.0] * 3000, {"http_503": 1000})))  # 75 %
    # absolute floor
    failed(run("steady.throughput", steady_result([5.0] * 3960), threshold=120))
    closed = steady_result([5.0] * 100)
    closed["stages"] = [stage("steady", 0, 40, None, users=8)]
    skipped(run("steady.throughput", closed), "closed-loop")
    passed(run("steady.throughput", closed, threshold=1.0))


# --- priority -----------------------------------------------------------------------------


def test_priority_high_p99_and_reject_rate_pass_when_protected() -> None:
    sc = priority_result(high_ms=30, high_fail=0)
    c = run("priority.high_p99_ms", sc, stage="overload", class_name="high")
    passed(c)
    assert "'high'" in c.detail
    c = run("priority.high_reject_rate", sc, stage="overload")
    passed(c)
    assert c.value == 0.0 and "other classes 12.50%" in c.detail


def test_priority_fails_when_priorities_are_ignored() -> None:
    sc = priority_result(high_ms=300, high_fail=125)
    failed(run("priority.high_p99_ms", sc, stage="overload"))
    c = run("priority.high_reject_rate", sc, stage="overload")
    failed(c)
    assert c.value == pytest.approx(0.125)


def test_priority_passes_only_with_evidence_of_overload() -> None:
    # nobody was rejected and the low class was fast: the stage was below capacity
    sc = priority_result(high_ms=30, high_fail=0, low_fail=0)
    for cls in sc["by_class"]:
        sc["by_class"][cls]["latency_hdr"] = hdr([30_000] * sc["by_class"][cls]["counters"]["ok"])
    skipped(run("priority.high_p99_ms", sc, stage="overload"), "not exercised")
    skipped(run("priority.high_reject_rate", sc, stage="overload"), "not exercised")
    # the low class slowed past the SLO instead of being rejected: that is evidence too
    sc["by_class"]["low"]["latency_hdr"] = hdr([900_000] * 4000)
    c = run("priority.high_p99_ms", sc, stage="overload")
    passed(c)
    assert "other classes' p99" in c.detail


def test_priority_skips_without_a_high_class_or_samples() -> None:
    sc = steady_result([5.0] * 100, classes={"default": {"priority": 0, "share": 1.0}})
    skipped(run("priority.high_p99_ms", sc), "no high-priority class")
    skipped(run("priority.high_reject_rate", sc), "no high-priority class")
    small = priority_result(high_ms=30, high_fail=0)
    small["by_stage"]["overload"]["high"]["counters"] = counters(50)
    skipped(run("priority.high_reject_rate", small, stage="overload"), "insufficient")


def test_priority_picks_the_smallest_positive_priority_when_no_class_is_named_high() -> None:
    sc = priority_result(high_ms=30, high_fail=0)
    sc["classes"] = {"gold": sc["classes"]["high"], "low": sc["classes"]["low"]}
    sc["by_class"] = {"gold": sc["by_class"]["high"], "low": sc["by_class"]["low"]}
    c = run("priority.high_p99_ms", sc)
    assert "'gold'" in c.detail


# --- spike ------------------------------------------------------------------------------------


def test_spike_recovery() -> None:
    c = run("spike.recovery_s", spike_result(33), baseline_stage="baseline", event_stage="spike")
    passed(c)
    assert c.value == pytest.approx(3.0, abs=1.01) and c.unit == "s"
    c = run("spike.recovery_s", spike_result(50))  # stages found by default: first, highest rate
    failed(c)
    assert c.value == pytest.approx(20.0, abs=1.01)
    c = run("spike.recovery_s", spike_result(99))
    failed(c)
    assert c.value is None and "never" in c.detail
    skipped(run("spike.recovery_s", spike_result(33, end=30)), "no windows after")
    skipped(run("spike.recovery_s", result(stages=[stage("only", 0, 10)])), "baseline stage")


def test_spike_recovery_tolerates_one_noisy_window() -> None:
    sc = spike_result(33)
    sc["windows"]["rows"][36]["p99_ms"] = 500.0  # one GC pause after recovery
    c = run("spike.recovery_s", sc)
    passed(c)
    assert c.value <= 4
    # unsmoothed, the same blip resets the hold
    assert run("spike.recovery_s", sc, smooth_windows=1).value > 4


def test_spike_fail_fast() -> None:
    err = hdr([2000] * 500)
    c = run(
        "spike.fail_fast",
        result(counters=counters(5000, {"http_503": 480, "timeout": 20}), error_latency_hdr=err),
    )
    passed(c)
    assert c.value == pytest.approx(0.96)
    # an unbounded queue: timeouts and in-flight-cap drops instead of 503s
    c = run(
        "spike.fail_fast",
        result(counters=counters(5000, {"timeout": 300}, dropped=200), error_latency_hdr=err),
    )
    failed(c)
    assert c.value == 0.0
    # 503s, but only after 5 s: not fast
    slow_503 = hdr([5_000_000] * 500)
    c = run(
        "spike.fail_fast",
        result(counters=counters(5000, {"http_503": 500}), error_latency_hdr=slow_503),
    )
    failed(c)
    assert c.value == 1.0 and "> 1,000 ms" in c.detail
    skipped(run("spike.fail_fast", result(counters=counters(5000, {"timeout": 2}))), "only 2")


def test_spike_fail_fast_counts_requests_sent_during_the_spike() -> None:
    sc = spike_result(33)
    rows = sc["windows"]["rows"]
    for t in range(20, 30):
        rows[t]["errors"] = {"http_503": 30, "timeout": 1}
    rows[33]["errors"] = {"timeout": 2}  # the backlog just after the spike counts
    for t in range(45, 60):
        rows[t]["errors"] = {"timeout": 50}  # unrelated trouble late in the run does not
    sc["error_latency_hdr"] = hdr([2000] * 300)
    c = run("spike.fail_fast", sc)
    passed(c)
    assert c.n == 312 and "spike stage 'spike'" in c.detail
    assert c.value == pytest.approx(300 / 312, abs=1e-3)
    assert run("spike.fail_fast", sc, tail_s=30).passed is False


# --- contention -----------------------------------------------------------------------------


def contention_result(hog_rps: int, after_p99: float = 11.0, **kw: Any) -> dict[str, Any]:
    rows = []
    for t in range(60):
        if t < 20:
            rows.append(row(t, 10.0, ok=100))
        elif t < 40:
            rows.append(row(t, 40.0, ok=hog_rps, http_503=100 - hog_rps))
        else:
            rows.append(row(t, after_p99, ok=100))
    return result(
        contention={
            "blocks": [
                {"kind": "baseline", "stage": "baseline_1", "start_s": 0, "end_s": 20},
                {"kind": "hog", "stage": "hog_1", "start_s": 20, "end_s": 40},
                {"kind": "after", "stage": "after", "start_s": 40, "end_s": 60},
            ]
        },
        windows={"width_s": 1.0, "rows": rows},
        error_latency_hdr=hdr([1500] * 400),
        chaos=[hog_record(20.0, 40.0)],
        **kw,
    )


def test_contention_throughput_ratio() -> None:
    c = run("contention.throughput_ratio", contention_result(hog_rps=80))
    passed(c)
    assert c.value == pytest.approx(0.8) and c.unit == "x"
    c = run("contention.throughput_ratio", contention_result(hog_rps=20))
    failed(c)
    assert "collapses" in c.detail
    skipped(run("contention.throughput_ratio", result()), "no baseline")
    short = contention_result(hog_rps=80)
    short["contention"]["blocks"][1]["end_s"] = 24  # 4 s hog block, 3 s discarded
    skipped(run("contention.throughput_ratio", short), "insufficient")


def test_contention_blocks_from_chaos_events_when_no_blocks_recorded() -> None:
    sc = contention_result(hog_rps=80)
    sc["contention"] = None
    sc["chaos"] = [{"action": "cpu_hog", "start_s": 20.0, "end_s": 40.0, "ok": True}]
    c = run("contention.throughput_ratio", sc)
    passed(c)
    assert c.value == pytest.approx(0.8)


def test_contention_fail_fast_and_recovery() -> None:
    c = run("contention.fail_fast", contention_result(hog_rps=80))
    passed(c)
    assert "during the CPU hogs" in c.detail and c.n == 400
    sc = contention_result(hog_rps=80)
    for r in sc["windows"]["rows"]:
        if r["errors"]:
            r["errors"] = {"timeout": r["errors"]["http_503"]}
    failed(run("contention.fail_fast", sc))
    passed(run("contention.recovery_s", contention_result(hog_rps=80)))
    c = run("contention.recovery_s", contention_result(hog_rps=80, after_p99=200.0))
    failed(c)
    assert c.value is None


def test_contention_recovery_band_comes_from_before_the_first_hog() -> None:
    # A server that never recovers: slow from the first hog block on, through the second
    # baseline block. That block must not widen the band it is judged against.
    rows = [row(t, 10.0 if t < 15 else 300.0, ok=100) for t in range(75)]
    blocks = [
        ("baseline", 0, 15),
        ("hog", 15, 30),
        ("baseline", 30, 45),
        ("hog", 45, 60),
        ("after", 60, 75),
    ]
    sc = result(
        contention={
            "blocks": [
                {"kind": k, "stage": f"{k}_{i}", "start_s": a, "end_s": b}
                for i, (k, a, b) in enumerate(blocks)
            ]
        },
        windows={"width_s": 1.0, "rows": rows},
        chaos=[hog_record(15.0, 30.0), hog_record(45.0, 60.0)],
    )
    c = run("contention.recovery_s", sc)
    failed(c)
    assert c.value is None and "20 ms" in c.detail  # band = max(10 x 2, 10 + 10)


# --- soak ------------------------------------------------------------------------------------


def test_rss_trend_leak_fails_and_plateau_passes() -> None:
    c = run("soak.rss_trend", soak_result(rss_mib_per_min=4.0))
    failed(c)
    assert c.unit == "MiB/min" and c.value == pytest.approx(4.0, rel=0.25)
    assert "leak" in c.detail and "p=" in c.detail and "per request" in c.detail
    c = run("soak.rss_trend", soak_result(rss_mib_per_min=0.0))
    passed(c)
    assert abs(c.value) < 1.0


def test_rss_trend_skips_without_a_pid_or_enough_samples() -> None:
    skipped(run("soak.rss_trend", result()), "no pid")
    skipped(run("soak.rss_trend", soak_result(seconds=8)), "insufficient")
    # buckets chosen by the scenario: 60 s medians on a 2-minute soak are too few
    skipped(run("soak.rss_trend", soak_result(4.0), bucket_s=60), "insufficient")


def test_rss_trend_inconclusive_is_not_a_pass() -> None:
    sc = inconclusive_rss_result()
    c = run("soak.rss_trend", sc)
    skipped(c, "not conclusively", "--duration")
    assert c.value > c.threshold
    failed(run("soak.rss_trend", sc, inconclusive_fails=True))


def test_threads_and_fds_trends() -> None:
    c = run("soak.threads_trend", soak_result(threads_per_min=6.0))
    failed(c)
    assert c.unit == "threads/min"
    passed(run("soak.threads_trend", soak_result()))
    passed(run("soak.fds_trend", soak_result()))
    skipped(run("soak.fds_trend", soak_result(with_fds=False)), "'fds'")


def _fd_series(file_per_min: float, socket_per_min: float, seed: int = 1) -> dict[str, Any]:
    """10 minutes of fds: 40 files/pipes plus a socket count that wanders by ±15 (client
    connections coming and going), each with its own leak rate."""
    rng = np.random.default_rng(seed)
    sc = soak_result(seconds=600)
    t = np.asarray(sc["server"]["series"]["t"])
    sockets = np.floor(60 + socket_per_min * t / 60 + rng.integers(-15, 16, t.size))
    files = np.floor(40 + file_per_min * t / 60)
    sc["server"]["series"]["socket_fds"] = sockets.tolist()
    sc["server"]["series"]["fds"] = (sockets + files).tolist()
    return sc


def test_fds_trend_judges_sockets_and_other_fds_apart() -> None:
    # 2 leaked files/min under ±15 socket noise: plain in the non-socket series
    c = run("soak.fds_trend", _fd_series(file_per_min=2.0, socket_per_min=0.0))
    failed(c)
    assert c.value == pytest.approx(2.0, rel=0.2) and "non-socket fd leak" in c.detail
    assert "socket fds" in c.detail  # the other series is reported alongside
    # a socket leak is still caught, on its own series
    c = run("soak.fds_trend", _fd_series(file_per_min=0.0, socket_per_min=6.0))
    failed(c)
    assert c.value == pytest.approx(6.0, rel=0.3) and "socket fd leak" in c.detail
    # both grow: the quiet series' slope is reported, the other's alongside
    c = run("soak.fds_trend", _fd_series(file_per_min=2.0, socket_per_min=20.0))
    failed(c)
    assert c.value == pytest.approx(2.0, rel=0.2) and "socket fds +" in c.detail
    passed(run("soak.fds_trend", _fd_series(file_per_min=0.0, socket_per_min=0.0)))
    # samples from before socket_fds was recorded: the total, as before
    old = _fd_series(file_per_min=0.0, socket_per_min=0.0)
    old["server"]["series"]["socket_fds"] = [None] * 600
    c = run("soak.fds_trend", old)
    assert "socket" not in c.detail


def test_latency_drift() -> None:
    flat = result(windows={"width_s": 1.0, "rows": [row(t, 20.0 + t % 4) for t in range(120)]})
    c = run("soak.latency_drift", flat)
    passed(c)
    assert c.value == pytest.approx(1.0, abs=0.15)
    drift = result(windows={"width_s": 1.0, "rows": [row(t, 20.0 + 2 * t) for t in range(120)]})
    c = run("soak.latency_drift", drift)
    failed(c)
    assert c.value > 2
    # linear growth from uptime 0: the fitted end/start ratio over the judged span is
    # (120 / 30) = 4x; medians of the thirds would give only ~2.3x
    linear = result(windows={"width_s": 1.0, "rows": [row(t, 5.0 + 1.0 * t) for t in range(120)]})
    c = run("soak.latency_drift", linear)
    failed(c)
    assert c.value > 3 and "Mann–Kendall" in c.detail
    # a big but random excursion is not a trend
    rng = np.random.default_rng(3)
    noisy = [row(t, float(20 + 60 * rng.random())) for t in range(120)]
    c = run("soak.latency_drift", result(windows={"width_s": 1.0, "rows": noisy}))
    passed(c)
    skipped(run("soak.latency_drift", result()), "no windowed")
    short = result(windows={"width_s": 1.0, "rows": [row(t, 20.0) for t in range(6)]})
    skipped(run("soak.latency_drift", short), "insufficient")


# --- integrity, linearity, accounting ----------------------------------------------------------


def test_integrity_mismatches() -> None:
    clean = {"checked": 3000, "ok": 3000, "drift": 0, "cross_wired": 0, "id_mismatch": 0}
    c = run("integrity.mismatches", result(integrity=clean))
    passed(c)
    assert c.value == 0 and c.n == 3000 and "0.100%" in c.detail
    # cross-wired in a few % of batches: one is enough to fail
    bad = {
        **clean,
        "cross_wired": 2,
        "examples": [
            {"kind": "cross_wired", "sent_input": 3, "matched_input": 7, "request_id": "r9"}
        ],
    }
    c = run("integrity.mismatches", result(integrity=bad))
    failed(c)
    assert c.value == 2 and "sent input 3 got the output of 7" in c.detail
    # fails even with few checked responses
    failed(run("integrity.mismatches", result(integrity={**bad, "checked": 50})))
    skipped(run("integrity.mismatches", result(integrity={**clean, "checked": 50})), "insufficient")
    skipped(run("integrity.mismatches", result()), "no response integrity")
    # drift beyond tolerance is a wrong answer unless the model is declared nondeterministic
    drift = {**clean, "drift": 4}
    failed(run("integrity.mismatches", result(integrity=drift)))
    c = run("integrity.mismatches", result(integrity=drift), nondeterministic=True)
    passed(c)
    assert "4 drifted" in c.detail and "nondeterministic" in c.detail


def lin(points: dict[int, list[float]], cores: int | None = 2) -> dict[str, Any]:
    return result(
        linearity={
            "points": [{"n": n, "throughput_rps": xs} for n, xs in points.items()],
            "cores_available": cores,
        }
    )


def test_linearity_efficiency() -> None:
    good = lin({1: [50, 52, 51], 2: [98, 96, 99], 4: [120, 118, 121]})
    c = run("linearity.efficiency", good)
    passed(c)
    assert c.value == pytest.approx(98 / 102, abs=1e-3) and "USL" in c.detail
    # N = 4 is beyond the 2 cores: not judged, even though E(4) < 0.75
    assert "E(4)=0.59" in c.detail
    gil = lin({1: [50, 52, 51], 2: [55, 54, 56]})
    c = run("linearity.efficiency", gil)
    failed(c)
    assert c.value == pytest.approx(55 / 102, abs=1e-3) and "serialized" in c.detail
    skipped(run("linearity.efficiency", result()), "no concurrency sweep")
    skipped(run("linearity.efficiency", lin({1: [50.0], 2: [98.0]}, cores=1)), "max_n")
    passed(run("linearity.efficiency", lin({1: [50.0], 2: [98.0]}, cores=1), max_n=2))
    skipped(run("linearity.efficiency", lin({2: [98.0]})), "N = 1")
    skipped(
        run("linearity.efficiency", lin({1: [50.0], 2: [98.0]}), min_replicates=3), "insufficient"
    )


def test_accounting_balanced() -> None:
    sc = result(counters=counters(100, {"http_503": 3}, dropped=2, in_flight=1))
    c = run("accounting.balanced", sc)
    passed(c)
    assert (c.value, c.op, c.n) == (0, "==", 106)
    sc["counters"]["ok"] = 98
    c = run("accounting.balanced", sc)
    failed(c)
    assert c.value == 2 and "off by +2" in c.detail
    sc = result(counters=counters(10))
    sc["by_class"] = {"high": {"counters": {**counters(5), "scheduled": 6}}}
    failed(run("accounting.balanced", sc))
    skipped(run("accounting.balanced", result(counters=None)), "no request counters")


def test_non_finite_values_serialise_as_null() -> None:
    c = Check("x", False, math.inf, 1.0, "<=", "s", 1, "d")
    assert c.to_dict()["value"] is None


def test_spike_recovery_says_when_the_spike_did_nothing() -> None:
    # p99 never left the band and nothing failed: recovery was not exercised (not a pass)
    c = run("spike.recovery_s", spike_result(20))
    skipped(c, "not exercised", "disturbed neither")
