"""Recovery, contention, linearity/USL and run-validity analysis on known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from harness.analysis.contention import Block, degradation_ratio, fail_fast
from harness.analysis.linearity import efficiency, fit_usl, usl
from harness.analysis.recovery import band_ms, baseline_p99_ms, recovery_time
from harness.analysis.validity import (
    accounting_imbalance,
    accounting_unbalanced,
    dispatch_lag_excessive,
    loadgen_saturated,
    longest_run_above,
    sampler_gaps,
)

# --- recovery ------------------------------------------------------------------------


def spike_series(recover_at: float, seed: int = 0) -> tuple[list[float], list[float | None]]:
    """Baseline 10 ms p99, a spike 20–30 s at 300 ms, elevated until ``recover_at``."""
    rng = np.random.default_rng(seed)
    t = [float(i) for i in range(60)]
    p99: list[float | None] = []
    for x in t:
        if x < 20:
            p99.append(10 + rng.normal(0, 1))
        elif x < recover_at:
            p99.append(300.0 * math.exp(-(x - 20) / 30) + 40)
        else:
            p99.append(10 + rng.normal(0, 1))
    return t, p99


def test_recovery_time_of_a_synthetic_spike() -> None:
    t, p99 = spike_series(recover_at=37)
    base = baseline_p99_ms(t, p99, 0, 20)
    assert base == pytest.approx(10, abs=1)
    r = recovery_time(t, p99, 30.0, base, factor=2.0, hold_s=5.0)
    assert r.recovery_s == pytest.approx(7.0)
    assert r.band_ms == pytest.approx(2 * base) and r.worst_after_ms > 100


def test_recovery_is_zero_when_already_in_band_and_none_when_never() -> None:
    t, p99 = spike_series(recover_at=30)
    assert recovery_time(t, p99, 30.0, 10.0, factor=2.0).recovery_s == 0.0
    t, p99 = spike_series(recover_at=99)
    r = recovery_time(t, p99, 30.0, 10.0, factor=2.0)
    assert r.recovery_s is None and r.windows_after == 30


def test_recovery_needs_a_full_hold_and_treats_gaps_as_out_of_band() -> None:
    t = [float(i) for i in range(10)]
    p99: list[float | None] = [100, 100, 5, 5, 5, 100, 5, 5, 5, 5]
    assert recovery_time(t, p99, 0.0, 5.0, factor=2.0, hold_s=4).recovery_s == 6.0
    # an empty window (nothing completed) breaks the streak
    p99b: list[float | None] = [5, 5, None, 5, 5, 5, 5, 5, 5, 5]
    assert recovery_time(t, p99b, 0.0, 5.0, factor=2.0, hold_s=4).recovery_s == 3.0
    # a missing row breaks it too
    t2 = [0.0, 1.0, 3.0, 4.0, 5.0, 6.0]
    assert recovery_time(t2, [5] * 6, 0.0, 5.0, hold_s=3).recovery_s == 3.0
    # the data ends before the hold is complete: not recovered
    assert recovery_time(t[:3], [5, 5, 5], 0.0, 5.0, hold_s=5).recovery_s is None


def test_band_margin_protects_tiny_baselines() -> None:
    assert band_ms(0.8, 2.0, margin_ms=10) == pytest.approx(10.8)
    assert band_ms(50, 2.0, margin_ms=10) == 100


# --- contention ----------------------------------------------------------------------


def test_degradation_ratio_discards_block_starts() -> None:
    t = np.arange(0, 60, 1.0)
    # baseline 100 req/s; hog block 20–40 s drops to 60 after a 3 s transient at 10
    x = np.where((t >= 20) & (t < 40), np.where(t < 23, 10.0, 60.0), 100.0)
    base = [Block("baseline", 0, 20)]
    hog = [Block("hog", 20, 40)]
    d = degradation_ratio(t, x, base, hog, discard_s=3.0, width_s=1.0)
    assert d.ratio == pytest.approx(0.6) and d.n_test == 17 and d.n_baseline == 17
    # without discarding, the 3 transient windows are counted in
    d0 = degradation_ratio(t, x, base, hog, discard_s=0.0, width_s=1.0)
    assert d0.n_test == 20
    assert degradation_ratio(t, x, [], hog).ratio is None


def test_fail_fast_classifies_quick_and_slow_failures() -> None:
    ff = fail_fast({"http_503": 90, "http_429": 5, "timeout": 3, "connection": 2, "http_500": 7})
    assert (ff.quick, ff.slow, ff.other) == (95, 5, 7)
    assert ff.quick_share == pytest.approx(0.95)
    # drops at the client's in-flight cap count as slow: the server let requests pile up
    ff2 = fail_fast({"timeout": 10}, dropped=90)
    assert ff2.quick_share == 0.0 and ff2.slow == 100
    assert fail_fast({"timeout": 10}, dropped=90, count_dropped_as_slow=False).slow == 10
    assert fail_fast({}).quick_share is None


# --- linearity -----------------------------------------------------------------------


def test_efficiency_uses_measured_x1_and_medians() -> None:
    pts = {1: [100, 98, 102], 2: [190, 180, 200], 4: [300, 310, 290]}
    e = efficiency(pts)
    assert e[1] == 1.0 and e[2] == pytest.approx(0.95) and e[4] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="N = 1"):
        efficiency({2: [100]})


def test_usl_fit_recovers_a_known_curve() -> None:
    lam, sigma, kappa = 50.0, 0.05, 0.02
    rng = np.random.default_rng(5)
    ns = [1, 2, 4, 8, 16, 32]
    pts = {n: list(usl(n, lam, sigma, kappa) * (1 + rng.normal(0, 0.01, 3))) for n in ns}
    pts[1] = [lam] * 3  # X(1) is measured
    fit = fit_usl(pts)
    assert fit is not None
    assert fit.sigma == pytest.approx(sigma, abs=0.01)
    assert fit.kappa == pytest.approx(kappa, abs=0.003)
    assert fit.n_peak == pytest.approx(math.sqrt((1 - sigma) / kappa), rel=0.1)  # ≈ 6.9
    assert fit.lam == lam


def test_usl_fit_with_one_level_fits_sigma_only() -> None:
    fit = fit_usl({1: [100.0], 2: [160.0]})
    assert fit is not None and fit.kappa == 0.0 and math.isinf(fit.n_peak)
    assert fit.sigma == pytest.approx(0.25, abs=1e-3)  # 200 / (1 + σ) = 160
    assert fit_usl({1: [100.0]}) is None
    assert fit_usl({2: [100.0]}) is None


# --- validity ------------------------------------------------------------------------


def test_loadgen_saturation_must_be_sustained() -> None:
    t = [float(i) for i in range(30)]
    blip = [50.0] * 30
    blip[10] = 99.0
    assert loadgen_saturated(t, blip) is None
    hot = [50.0] * 10 + [95.0] * 8 + [50.0] * 12
    msg = loadgen_saturated(t, hot)
    assert msg is not None and "8 s" in msg and "95 %" in msg
    assert longest_run_above(t, hot, 90) == (8.0, 8)
    assert loadgen_saturated(t, [None] * 30) is None


def lag_hist(values_us) -> HdrHistogram:
    h = HdrHistogram(1, 60_000_000, 3)
    for v in values_us:
        h.record_value(int(v))
    return h


def test_dispatch_lag_relative_to_the_slo() -> None:
    ok = lag_hist([500] * 1000)  # 0.5 ms
    assert dispatch_lag_excessive(ok, slo_ms=100) is None
    late = lag_hist([500] * 900 + [30_000] * 100)  # p99 30 ms
    msg = dispatch_lag_excessive(late, slo_ms=100)
    assert msg is not None and "30.0 ms > 10.0 ms" in msg
    assert dispatch_lag_excessive(late, slo_ms=1000) is None
    assert dispatch_lag_excessive(None, slo_ms=100) is None


def test_sampler_gaps() -> None:
    t = [float(i) for i in range(60)]
    assert sampler_gaps(t, interval_s=1.0, ticks=60, missed_ticks=0) is None
    assert "missed 10 of 70" in sampler_gaps(t, interval_s=1.0, ticks=60, missed_ticks=10)
    holed = t[:20] + [x + 10 for x in t[20:]]
    assert "11.0 s gap" in (sampler_gaps(holed, interval_s=1.0) or "")


def test_accounting_balance() -> None:
    c = {
        "scheduled": 100,
        "ok": 90,
        "dropped": 2,
        "in_flight": 1,
        "failed": {"http_503": 5, "timeout": 2},
        "failed_total": 7,  # the load side's convenience total is not a failure kind
    }
    assert accounting_imbalance(c) == 0 and accounting_unbalanced(c) is None
    c["ok"] = 88
    assert accounting_imbalance(c) == 2
    assert "off by +2" in accounting_unbalanced(c)


def test_quick_rejection_bounds_are_not_fooled_by_timeouts_in_the_same_histogram() -> None:
    from harness.analysis.contention import quick_rejection_bounds_ms

    # 200 quick 503s (3 ms) and 450 timeouts (5 s) share one failure histogram: the
    # median 503 is at least the 100th fastest failure and at most the 101st slowest
    mixed = lag_hist([3000] * 200 + [5_000_000] * 450)
    b = quick_rejection_bounds_ms(mixed, n_quick=200)
    assert b.low_ms == pytest.approx(3.0, rel=1e-3)
    assert b.high_ms == pytest.approx(5000, rel=1e-3)  # 450 failures could be the 503s
    assert b.at_most(1000) is None  # cannot tell: not a pass
    # 503s that waited 4 s in a queue first: more than half of them were slow
    slow = lag_hist([4_000_000] * 200 + [5_000_000] * 450)
    assert quick_rejection_bounds_ms(slow, n_quick=200).at_most(1000) is False
    # few other failures: the 503s' median is pinned down
    quick = lag_hist([3000] * 200 + [5_000_000] * 50)
    b = quick_rejection_bounds_ms(quick, n_quick=200)
    assert b.high_ms == pytest.approx(3.0, rel=1e-3) and b.at_most(1000) is True
    assert quick_rejection_bounds_ms(mixed, n_quick=0) is None
    assert quick_rejection_bounds_ms(None, n_quick=5) is None
    assert quick_rejection_bounds_ms(lag_hist([3000] * 5), n_quick=6) is None  # cannot hold them
