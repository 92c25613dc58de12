"""The leak detector on synthetic series with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from harness.analysis.trend import TrendParams, bucket_medians, leak_test, mann_kendall

QUICK = TrendParams(slope_threshold=1.0)  # MiB/min, auto buckets: the quick-soak default
HOURLY = TrendParams(slope_threshold=10 / 60, warmup_min_s=600, bucket_s=60)  # 10 MiB/h


def ar1(rng: np.random.Generator, n: int, sd: float, phi: float = 0.7) -> np.ndarray:
    """Autocorrelated noise, as RSS really wobbles."""
    e = np.zeros(n)
    for i in range(1, n):
        e[i] = phi * e[i - 1] + rng.normal(0, sd)
    return e


def test_mann_kendall_known_values() -> None:
    s, p = mann_kendall([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert s == 45 and p < 1e-4
    s, p = mann_kendall(list(range(10, 0, -1)))
    assert s == -45 and p > 0.999
    # all tied: no variance, no trend
    assert mann_kendall([3, 3, 3, 3, 3]) == (0.0, 1.0)


def test_mann_kendall_tie_correction_matches_hand_computation() -> None:
    y = [1, 1, 2, 2, 3, 3]
    s, p = mann_kendall(y)
    # S = 12 concordant pairs; var = (6*5*17 - 3*(2*1*9)) / 18 = 25.333
    assert s == 12
    z = (12 - 1) / np.sqrt((6 * 5 * 17 - 3 * 18) / 18)
    from scipy.stats import norm

    assert p == pytest.approx(norm.sf(z))


def test_bucket_medians_reduce_spikes() -> None:
    t = np.arange(0, 10, 1.0)
    y = np.array([1, 1, 100, 1, 1, 2, 2, 2, 200, 2], dtype=float)
    tb, yb = bucket_medians(t, y, 5.0, 0.0)
    assert list(yb) == [1.0, 2.0] and list(tb) == [2.0, 7.0]


def test_seeded_ramp_plus_noise_is_a_leak() -> None:
    rng = np.random.default_rng(11)
    t = np.arange(0, 120, 1.0)  # a 2-minute quick soak sampled every second
    y = 100 + 3.0 * t / 60 + ar1(rng, len(t), 0.3)  # 3 MiB/min
    r = leak_test(t, y, QUICK)
    assert r.verdict == "LEAK", r.reasons
    assert r.slope_per_min == pytest.approx(3.0, rel=0.2)
    assert r.ci_low > 1.0 and r.p_value < 0.01 and r.n >= 8
    assert r.warmup_s == pytest.approx(0.25 * 119)


def test_leaks_are_caught_across_seeds() -> None:
    caught = 0
    for seed in range(50):
        rng = np.random.default_rng(seed)
        t = np.arange(0, 120, 1.0)
        caught += leak_test(t, 100 + 3.0 * t / 60 + ar1(rng, 120, 0.3), QUICK).verdict == "LEAK"
    assert caught >= 48


def test_noisy_plateau_is_not_a_leak_across_seeds() -> None:
    false = 0
    for seed in range(100):
        rng = np.random.default_rng(1000 + seed)
        t = np.arange(0, 120, 1.0)
        y = 100 + ar1(rng, 120, 0.3) + rng.choice([0, 0, 0, 0, 5], 120)  # with GC-like spikes
        false += leak_test(t, y, QUICK).verdict == "LEAK"
    assert false <= 2  # expected: ~0.3 % false LEAK on flat series (docs/checks.md)


def test_plateau_with_one_step_up_passes_on_a_real_soak() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(0, 3600, 1.0)  # 1 h, 1 s samples
    y = 200 + 2.0 * (t > 1800) + ar1(rng, len(t), 0.3)  # an arena step-up at 30 min
    r = leak_test(t, y, HOURLY)
    assert r.verdict == "PASS", r.reasons
    assert r.warmup_s == pytest.approx(900, abs=1) and r.bucket_s == 60 and r.n >= 40


def test_step_up_inside_the_quick_warmup_passes() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(0, 120, 1.0)
    y = 100 + 6.0 * (t > 15) + ar1(rng, len(t), 0.3)
    assert leak_test(t, y, QUICK).verdict == "PASS"


def test_short_weak_ramp_is_inconclusive() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(0, 120, 1.0)
    y = 100 + 1.2 * t / 60 + rng.normal(0, 1.0, len(t))  # barely above S = 1 MiB/min
    r = leak_test(t, y, QUICK)
    assert r.verdict == "INCONCLUSIVE", r
    assert r.p_value < 0.01 and r.slope_per_min > 1.0
    assert any("CI lower bound" in x or "second-half" in x for x in r.reasons)


def test_slowing_growth_is_inconclusive_not_leak() -> None:
    # fast early growth that levels off: significant and steep overall, but the second
    # half's slope is not >= 0.5 x the first's — extend the soak rather than cry leak
    t = np.arange(0, 120, 1.0)
    y = 100 + 6.0 * (1 - np.exp(-(t - 30).clip(0) / 20))
    r = leak_test(t, y, QUICK)
    assert r.verdict in ("INCONCLUSIVE", "PASS") and r.verdict != "LEAK"
    assert r.second_half_slope < 0.5 * r.first_half_slope


def test_too_few_buckets_is_insufficient_not_pass() -> None:
    t = np.arange(0, 20, 1.0)
    r = leak_test(t, 100 + t, TrendParams(slope_threshold=1.0, bucket_s=5))
    assert r.verdict == "INSUFFICIENT" and r.slope_per_min is None
    assert "need >= 8" in r.reasons[0]
    assert leak_test([], [], QUICK).verdict == "INSUFFICIENT"


def test_thread_variant_needs_the_last_third_above_the_middle() -> None:
    t = np.arange(0, 120, 1.0)
    leaking = np.floor(10 + t / 5)  # one thread every 5 s, still growing
    assert leak_test(t, leaking, QUICK, variant="count").verdict == "LEAK"
    # grew through the middle then stopped: the trend is there, the growth is not
    stopped = np.floor(10 + np.minimum(t, 80) / 5)
    r_cnt = leak_test(t, stopped, QUICK, variant="count")
    assert r_cnt.verdict == "INCONCLUSIVE"
    assert any("last third" in x for x in r_cnt.reasons)


def test_flat_thread_count_passes_with_zero_slope() -> None:
    t = np.arange(0, 120, 1.0)
    y = np.full(len(t), 12.0)
    y[60] = 13  # one short-lived helper thread
    r = leak_test(t, y, TrendParams(slope_threshold=0.5), variant="count")
    assert r.verdict == "PASS" and r.slope_per_min == 0.0


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="warmup_frac"):
        TrendParams(slope_threshold=1.0, warmup_frac=1.5)
    with pytest.raises(ValueError, match="bucket_s"):
        TrendParams(slope_threshold=1.0, bucket_s=0)


def test_fd_leak_survives_a_burst_of_short_lived_connections() -> None:
    rng = np.random.default_rng(8)
    t = np.arange(0, 120, 1.0)
    fds = 30 + np.floor(20 * t / 60) + rng.integers(0, 6, len(t))  # 20 fds/min + churn
    fds[70:72] += 150  # a 2 s burst of keep-alive connections in the middle third
    r = leak_test(t, fds, TrendParams(slope_threshold=0.5), variant="count")
    assert r.verdict == "LEAK", r.reasons


def _staircase(t: np.ndarray, gap_s: float, phase_s: float) -> np.ndarray:
    """One unit every ``gap_s`` seconds from ``phase_s``: a thread or fd left behind every
    N requests at a steady rate."""
    return 40 + np.floor((t - phase_s) / gap_s).clip(-1) + 1


@pytest.mark.parametrize("per_min", [16, 20])
def test_the_quick_rows_count_leaks_are_leaks_wherever_their_steps_fall(per_min: int) -> None:
    # the detection matrix's 30 s soak rows (16 threads/min, 20 fds/min) leave ~20 s of
    # 1 s samples after the warm-up: a staircase of 5-7 steps, confirmed at every phase
    params = TrendParams(slope_threshold=0.5)
    gap = 60.0 / per_min
    for n in (23, 27, 30):
        t = np.arange(0, n, 1.0)
        for phase in np.arange(0.0, gap, 0.25):
            r = leak_test(t, _staircase(t, gap, phase), params, variant="count")
            assert r.verdict == "LEAK", (n, phase, r.reasons)


def test_a_few_units_of_leak_say_rerun_longer_never_pass() -> None:
    # 10 fds/min over 27 s is ~3 steps: where they fall decides whether the halves show
    # sustained growth; short of that the verdict is INCONCLUSIVE (a quick run's skip)
    params = TrendParams(slope_threshold=0.5)
    t = np.arange(0, 27, 1.0)
    verdicts = {
        leak_test(t, _staircase(t, gap, phase), params, variant="count").verdict
        for gap in (5.7, 6.0, 6.5)
        for phase in np.arange(0.0, gap, 0.25)
    }
    assert verdicts == {"LEAK", "INCONCLUSIVE"}
