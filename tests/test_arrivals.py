"""Arrival schedules: exact counts and spacing for constant arrivals; Poisson statistics
within bounds for a seeded RNG; splitting across workers keeps the total rate.

The Poisson bounds are 5 standard errors wide: a seeded stream is deterministic, but the
bounds are what a correct generator meets for (practically) any seed, so changing the
seed or the RNG must not turn these tests red by luck.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from harness.load.arrivals import (
    Segment,
    class_picker,
    constant_offsets,
    expected_count,
    poisson_offsets,
    schedule,
    worker_rng,
)
from harness.load.scenario import load_scenario

PIECEWISE = (
    Segment(0.0, 10.0, 100.0),
    Segment(10.0, 5.0, 400.0),
    Segment(15.0, 10.0, 0.0),  # an idle gap
    Segment(25.0, 10.0, 50.0),
)


def within_sigmas(observed: float, expected: float, sd: float, k: float = 5.0) -> bool:
    return abs(observed - expected) <= k * sd


def count_in(offsets: Sequence[float], seg: Segment) -> int:
    return sum(seg.start_s <= t < seg.end_s for t in offsets)


# --------------------------------------------------------------------------- constant


def test_constant_count_is_rate_times_duration_and_spacing_exact() -> None:
    offs = list(constant_offsets([Segment(2.0, 10.0, 100.0)]))
    assert len(offs) == 1000
    assert offs[0] == 2.0 and offs[-1] < 12.0
    assert np.allclose(np.diff(offs), 0.01, rtol=0, atol=1e-12)


def test_constant_fractional_rate_rounds_up_within_the_stage() -> None:
    # 3 req/s for 1.5 s: t = 0, 1/3, 2/3, 1, 4/3 — five arrivals, all before the end
    offs = list(constant_offsets([Segment(0.0, 1.5, 3.0)]))
    assert offs == pytest.approx([0, 1 / 3, 2 / 3, 1, 4 / 3])


def test_constant_piecewise_counts_per_stage() -> None:
    offs = list(constant_offsets(PIECEWISE))
    assert len(offs) == expected_count(PIECEWISE) == 3500
    assert [count_in(offs, s) for s in PIECEWISE] == [1000, 2000, 0, 500]
    assert all(b > a for a, b in zip(offs, offs[1:], strict=False))


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_constant_split_across_workers_is_the_single_schedule_interleaved(workers: int) -> None:
    single = list(constant_offsets(PIECEWISE))
    parts = [
        list(constant_offsets(PIECEWISE, worker_index=w, worker_count=workers))
        for w in range(workers)
    ]
    assert sorted(t for p in parts for t in p) == single
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= len([s for s in PIECEWISE if s.rate_rps > 0])
    # each worker sends at rate/W: its own gaps inside a stage are W/R
    first = [t for t in parts[0] if t < 10.0]
    assert np.allclose(np.diff(first), workers / 100.0, atol=1e-12)


# --------------------------------------------------------------------------- poisson


def test_poisson_count_mean_gap_and_cv() -> None:
    rate, dur = 200.0, 50.0
    offs = np.array(list(poisson_offsets([Segment(0.0, dur, rate)], random.Random(11))))
    n_expected = rate * dur
    assert within_sigmas(len(offs), n_expected, math.sqrt(n_expected))
    gaps = np.diff(offs)
    # exponential gaps: mean 1/R, sd 1/R, so CV = 1; SE of the mean is (1/R)/√n
    assert within_sigmas(gaps.mean(), 1 / rate, (1 / rate) / math.sqrt(len(gaps)))
    cv = gaps.std(ddof=1) / gaps.mean()
    assert abs(cv - 1.0) < 0.05
    # and the whole distribution is exponential, not just its first two moments
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-4
    assert offs.min() >= 0 and offs.max() < dur


def test_poisson_piecewise_counts_follow_each_stage_rate() -> None:
    offs = list(schedule(PIECEWISE, "poisson", seed=5))
    for seg in PIECEWISE:
        n = count_in(offs, seg)
        lam = seg.rate_rps * seg.duration_s
        assert within_sigmas(n, lam, math.sqrt(lam)), (seg, n)
    assert count_in(offs, PIECEWISE[2]) == 0
    assert all(b > a for a, b in zip(offs, offs[1:], strict=False))


@pytest.mark.parametrize("workers", [2, 4])
def test_poisson_split_across_workers_sums_to_the_total_rate(workers: int) -> None:
    seg = [Segment(0.0, 40.0, 300.0)]
    parts = [
        list(schedule(seg, "poisson", seed=9, worker_index=w, worker_count=workers))
        for w in range(workers)
    ]
    total = 300.0 * 40.0
    for p in parts:
        assert within_sigmas(len(p), total / workers, math.sqrt(total / workers))
    merged = np.sort(np.concatenate(parts))
    assert within_sigmas(len(merged), total, math.sqrt(total))
    gaps = np.diff(merged)
    assert abs(gaps.std(ddof=1) / gaps.mean() - 1.0) < 0.05  # superposition is Poisson
    assert parts[0][:10] != parts[1][:10], "workers must not share a random stream"


def test_poisson_is_reproducible_for_a_seed() -> None:
    a = list(schedule(PIECEWISE, "poisson", seed=3))
    b = list(schedule(PIECEWISE, "poisson", seed=3))
    c = list(schedule(PIECEWISE, "poisson", seed=4))
    assert a == b and a != c
    assert worker_rng(3, 0).random() == worker_rng(3, 0).random() != worker_rng(3, 1).random()


def test_schedule_is_lazy_for_long_soaks() -> None:
    it = schedule([Segment(0.0, 10 * 3600.0, 5000.0)], "poisson", seed=1)
    first = [next(it) for _ in range(3)]
    assert first == sorted(first) and first[0] > 0


# --------------------------------------------------------------------------- classes, errors


def test_class_picker_follows_shares() -> None:
    pick = class_picker([0.2, 0.8], random.Random(1))
    draws = np.array([pick() for _ in range(20_000)])
    assert set(np.unique(draws)) == {0, 1}
    p_high = float(np.mean(draws == 0))
    assert within_sigmas(p_high, 0.2, math.sqrt(0.2 * 0.8 / len(draws)))
    only = class_picker([1.0], random.Random(1))
    assert {only() for _ in range(100)} == {0}


def test_class_picker_never_picks_a_zero_share() -> None:
    pick = class_picker([0.5, 0.0, 0.5], random.Random(2))
    assert 1 not in {pick() for _ in range(5000)}


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: schedule([], "uniform"), "arrival = 'uniform' is not valid"),
        (lambda: list(constant_offsets([], worker_index=2, worker_count=2)), "worker_index = 2"),
        (lambda: list(constant_offsets([Segment(0, 1, -1)])), "must be finite and ≥ 0"),
        (lambda: class_picker([], random.Random(0)), "shares = \\[\\]"),
    ],
)
def test_bad_arguments_are_value_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


def test_scenario_segments_feed_the_schedule() -> None:
    s = load_scenario("spike", "quick")
    segs = s.segments(capacity_rps=100.0)
    offs = list(schedule(segs, s.load.arrival, seed=s.load.seed))
    lam = expected_count(segs)
    assert lam == pytest.approx(50 * 10 + 200 * 7.5 + 50 * 17.5)
    assert within_sigmas(len(offs), lam, math.sqrt(lam))
