"""Percentiles from HDR histograms, quantile confidence intervals, MLPerf early stopping."""

from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from scipy.stats import binom

from harness.analysis.hdr import decode, merge
from harness.analysis.percentiles import (
    count_above_ms,
    early_stopping_min_n,
    nearest_rank,
    percentile_ci,
    percentile_ms,
    quantile_rank_ci,
    slo_assessment,
)


def hist(values_us) -> HdrHistogram:
    h = HdrHistogram(1, 60_000_000, 3)
    for v in values_us:
        h.record_value(int(v))
    return h


def test_percentile_is_nearest_rank_on_exact_values() -> None:
    h = hist(range(1000, 101_000, 1000))  # 1 ms … 100 ms, 100 values
    assert percentile_ms(h, 50) == pytest.approx(50.0, rel=1e-3)
    assert percentile_ms(h, 99) == pytest.approx(99.0, rel=1e-3)
    assert percentile_ms(h, 100) == pytest.approx(100.0, rel=1e-3)
    assert percentile_ms(hist([]), 99) is None


def test_nearest_rank_has_no_float_off_by_one() -> None:
    assert nearest_rank(1000, 0.99) == 990
    assert nearest_rank(100, 0.99) == 99
    assert nearest_rank(1, 0.99) == 1


def test_decode_accepts_json_strings_and_merge_is_exact() -> None:
    rng = np.random.default_rng(7)
    a = rng.lognormal(np.log(5000), 0.5, 3000).astype(int) + 1
    b = rng.lognormal(np.log(20000), 0.5, 1000).astype(int) + 1
    ha, hb = hist(a), hist(b)
    as_json = ha.encode().decode("ascii")
    assert decode(as_json).get_total_count() == 3000
    merged = merge([as_json, hb.encode(), None])
    true_p99 = np.percentile(np.concatenate([a, b]), 99, method="inverted_cdf") / 1000
    assert merged.get_total_count() == 4000
    # HDR keeps 3 significant digits: within 0.1 % of the exact sample percentile
    assert percentile_ms(merged, 99) == pytest.approx(true_p99, rel=2e-3)
    # averaging the two p99s would be far off — the reason we merge
    avg = (percentile_ms(ha, 99) + percentile_ms(hb, 99)) / 2
    assert abs(avg - true_p99) / true_p99 > 0.1


def test_count_above() -> None:
    h = hist([1000] * 90 + [50_000] * 10)
    assert count_above_ms(h, 10.0) == 10
    assert count_above_ms(h, 60.0) == 0
    assert count_above_ms(h, 0.5) == 100


def test_quantile_ci_ranks_match_reference_at_n_1000() -> None:
    # order statistics: a 95 % CI for p99 spans about p98.3–p99.7 at n = 1,000
    lo, hi = quantile_rank_ci(1000, 0.99, 0.95)
    assert lo is not None and hi is not None
    assert 982 <= lo <= 985 and 996 <= hi <= 998
    # the ranks really give the promised coverage: P(lo <= B < hi) >= 95 %
    coverage = binom.cdf(hi - 1, 1000, 0.99) - binom.cdf(lo - 1, 1000, 0.99)
    assert coverage >= 0.95


def test_quantile_ci_has_no_upper_bound_with_too_few_samples() -> None:
    lo, hi = quantile_rank_ci(100, 0.99, 0.95)
    assert hi is None  # p99 from 100 samples has no upper confidence bound
    assert lo is not None and lo < 99


def test_percentile_ci_covers_the_true_p99_of_a_known_distribution() -> None:
    # exponential with mean 10 ms: true p99 = 10 ms * ln(100) = 46.05 ms
    true_p99 = 10.0 * np.log(100)
    covered = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        est = percentile_ci(hist(rng.exponential(10_000, 2000) + 1), 99, 0.95)
        assert est.n == 2000 and est.ci_low_ms <= est.value_ms <= est.ci_high_ms
        covered += est.ci_low_ms <= true_p99 <= est.ci_high_ms
    assert covered >= 34  # ≥ 85 % of 40 runs (nominal 95 %)


@pytest.mark.parametrize(("overs", "expected"), [(0, 459), (1, 662), (5, 1307)])
def test_early_stopping_matches_mlperf(overs: int, expected: int) -> None:
    assert early_stopping_min_n(overs, 0.99, 0.99) == expected


def test_early_stopping_general_rule_is_monotone() -> None:
    ns = [early_stopping_min_n(k) for k in range(0, 20)]
    assert ns == sorted(ns) and len(set(ns)) == 20
    # a laxer confidence needs fewer samples
    assert early_stopping_min_n(0, 0.99, 0.95) == 299


def test_slo_assessment_pass_fail_insufficient() -> None:
    fast = hist([2000] * 1000)
    a = slo_assessment(fast, 10.0)
    assert (a.verdict, a.n, a.overs, a.min_n) == ("pass", 1000, 0, 459)

    few = hist([2000] * 300)
    assert slo_assessment(few, 10.0).verdict == "insufficient"

    # 1 % over the SLO in 1000: the point estimate passes but not with 99 % confidence
    borderline = hist([2000] * 990 + [50_000] * 10)
    b = slo_assessment(borderline, 10.0)
    assert b.verdict == "insufficient" and b.overs == 10 and b.min_n > 1000

    slow = hist([2000] * 900 + [50_000] * 100)
    assert slo_assessment(slow, 10.0).verdict == "fail"
    # a few slow requests among too few samples do not fail, they are inconclusive
    assert slo_assessment(hist([2000] * 50 + [50_000] * 5), 10.0).verdict == "insufficient"


def test_binomial_functions_equal_scipy_stats_binom():
    """binom_cdf / binom_ppf (scipy.special, cheap to import) give scipy.stats.binom's
    answers over the grid the checks use: n from 1 to 10^6, q at every tail they ask."""
    from scipy.stats import binom

    from harness.analysis.percentiles import binom_cdf, binom_ppf

    for n in (1, 2, 7, 50, 99, 100, 101, 1000, 4321, 100_000, 1_000_000):
        for p in (0.001, 0.01, 0.05, 0.5, 0.9, 0.95, 0.99, 0.999):
            for q in (0.0, 1e-6, 0.005, 0.01, 0.025, 0.05, 0.5, 0.95, 0.975, 0.995, 1.0):
                assert binom_ppf(q, n, p) == int(binom.ppf(q, n, p)), (q, n, p)
            for k in (-1, 0, 1, n // 100, n // 2, n - 1, n, n + 1):
                assert binom_cdf(k, n, p) == pytest.approx(float(binom.cdf(k, n, p)), abs=1e-12)
