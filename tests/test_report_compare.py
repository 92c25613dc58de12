"""harness compare: regression verdicts with noise margins; machine metadata guard."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from harness.errors import ConfigError, ResultFormatError
from harness.report.compare import (
    IMPROVED,
    INSUFFICIENT,
    MISSING,
    NOT_JUDGED,
    REGRESSED,
    UNCHANGED,
    Margin,
    Margins,
    compare,
    compare_dirs,
    judge,
    parse_margin,
)
from harness.results import write_document
from harness.testing.reference_document import build_document
from harness.testing.results import hdr, scaled_hdr

VALID = ["steady_state", "contention", "linearity", "soak"]


@pytest.fixture(scope="module")
def runs():
    """Two runs of the same release (different noise) of the valid scenarios."""
    return build_document(0, VALID), build_document(1, VALID)


def _row(cmp, scenario, metric):
    (row,) = [d for d in cmp.deltas if d.scenario == scenario and d.metric == metric]
    return row


def test_noise_between_two_runs_of_one_release_is_ignored(runs):
    base, new = runs
    cmp = compare(base, new)
    assert not cmp.regressed and cmp.verdict == "ok"
    others = [(d.metric, d.status, d.note) for d in cmp.deltas if d.status != UNCHANGED]
    assert others == [("check soak.fds_trend", NOT_JUDGED, "skipped in both runs")]
    assert len(cmp.deltas) >= 30
    assert cmp.headline().startswith("NO REGRESSION: 0 regressed, 0 improved")


def test_slower_tail_is_a_regression_and_faster_is_an_improvement(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    sc = new["scenarios"][0]
    sc["by_class"]["default"]["latency_hdr"] = scaled_hdr(
        sc["by_class"]["default"]["latency_hdr"], 1.5
    )
    sc["by_class"]["high"]["latency_hdr"] = scaled_hdr(sc["by_class"]["high"]["latency_hdr"], 0.5)
    cmp = compare(base, new)
    assert cmp.regressed and cmp.verdict == "regressed"
    assert _row(cmp, "steady_state", "p99_ms[default]").status == REGRESSED
    assert _row(cmp, "steady_state", "p50_ms[default]").status == REGRESSED
    assert _row(cmp, "steady_state", "p99_ms[high]").status == IMPROVED
    assert 40 < _row(cmp, "steady_state", "p99_ms[default]").change_pct < 60
    # Other scenarios are untouched.
    assert not [
        d for d in cmp.deltas if d.scenario != "steady_state" and d.status in (REGRESSED, IMPROVED)
    ]


def test_throughput_error_rate_and_check_flip(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    sc = new["scenarios"][0]
    sc["counters"]["ok"] = int(sc["counters"]["ok"] * 0.8)
    sc["counters"]["failed"]["http_503"] = 200
    chk = next(c for c in sc["checks"] if c["id"] == "steady.throughput")
    chk.update(passed=False, value=chk["value"] * 0.8)
    cmp = compare(base, new)
    assert _row(cmp, "steady_state", "throughput_rps").status == REGRESSED
    assert _row(cmp, "steady_state", "error_rate").status == REGRESSED
    flip = _row(cmp, "steady_state", "check steady.throughput")
    assert (flip.status, flip.note) == (REGRESSED, "verdict pass → fail")
    text = cmp.to_text()
    assert text.startswith("REGRESSED: 3 regressed")
    assert re.search(
        r"steady_state throughput_rps: [\d.]+ req/s → [\d.]+ req/s \(-[12]\d\.\d%\)", text
    )


def test_check_value_moving_within_its_margin_is_noise_but_beyond_is_not(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    eff = next(c for c in new["scenarios"][2]["checks"] if c["id"] == "linearity.efficiency")
    eff["value"] = 0.90  # 0.93 → 0.90: -3 %, inside ±10 %
    assert _row(compare(base, new), "linearity", "check linearity.efficiency").status == UNCHANGED
    eff["value"] = 0.78  # still passes its threshold, but -16 %
    assert _row(compare(base, new), "linearity", "check linearity.efficiency").status == REGRESSED


def test_a_new_leak_is_a_regression(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    series = new["scenarios"][0]["server"]["series"]
    series["rss_bytes"] = [
        int(v + t * 3 / 60 * 2**20) for t, v in zip(series["t"], series["rss_bytes"], strict=True)
    ]
    row = _row(compare(base, new), "steady_state", "rss_slope")
    assert row.status == REGRESSED
    assert 2.0 < row.new < 4.0


def test_low_sample_p99_is_not_judged_either_way(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    rng = np.random.default_rng(3)
    base["scenarios"][0]["by_class"]["high"]["latency_hdr"] = hdr(rng.normal(3000, 300, 500))
    new["scenarios"][0]["by_class"]["high"]["latency_hdr"] = hdr(rng.normal(9000, 300, 500))
    cmp = compare(base, new)
    row = _row(cmp, "steady_state", "p99_ms[high]")
    assert (row.status, row.note) == (INSUFFICIENT, "n = 500 < 1,000")
    assert _row(cmp, "steady_state", "p50_ms[high]").status == REGRESSED  # 500 is enough for p50


@pytest.mark.parametrize("field", ["cpu_count", "affinity", "python", "host"])
def test_different_machines_are_refused_unless_forced(runs, field):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    new["machine"][field] = "other"
    with pytest.raises(
        ResultFormatError, match=rf"machine\.{field} is .* in base but 'other' in new.*--force"
    ):
        compare(base, new)
    forced = compare(base, new, force=True)
    assert any(f"machine.{field}" in w and "--force" in w for w in forced.warnings)
    assert not forced.regressed


def test_another_patch_release_of_the_same_python_is_compared_with_a_warning(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    base["machine"]["python"], new["machine"]["python"] = "3.11.7", "3.11.9"
    cmp = compare(base, new)
    assert any("machine.python" in w and "same minor version" in w for w in cmp.warnings)
    new["machine"]["python"] = "3.12.1"
    with pytest.raises(ResultFormatError, match=r"machine\.python is '3\.11\.7'"):
        compare(base, new)


def test_a_margin_given_on_the_command_line_decides_what_regressed(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    rng = np.random.default_rng(5)
    base["scenarios"][0]["by_class"]["high"]["latency_hdr"] = hdr(rng.normal(3000, 100, 2000))
    new["scenarios"][0]["by_class"]["high"]["latency_hdr"] = hdr(rng.normal(3750, 100, 2000))
    assert _row(compare(base, new), "steady_state", "p50_ms[high]").status == REGRESSED
    wide = parse_margin("p50_ms=0.5")  # 50 %: a 25 % move is noise
    assert wide.p50_ms.abs_floor == Margins().p50_ms.abs_floor  # floor kept when omitted
    assert (
        _row(compare(base, new, margins=wide), "steady_state", "p50_ms[high]").status != REGRESSED
    )
    assert parse_margin("p99_ms=0.3:2").p99_ms == Margin(0.3, 2.0)
    for bad in ("p98_ms=0.1", "p99_ms", "p99_ms=-1", "p99_ms=x:1"):
        with pytest.raises(ConfigError, match="METRIC=REL"):
            parse_margin(bad)
    from harness.cli import main

    assert main(["compare", "base", "new", "--margin", "p98_ms=0.1"]) == 2  # before any read


def test_platform_or_version_differences_only_warn(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    new["machine"]["platform"] = "Linux-6.9"
    new["sut"]["cmd"] = "tritonserver"
    cmp = compare(base, new)
    assert any("machine.platform differs" in w for w in cmp.warnings)
    assert any("sut.cmd differs" in w for w in cmp.warnings)


def test_missing_scenarios_and_checks_are_reported_not_regressed(runs):
    base, new = copy.deepcopy(runs[0]), copy.deepcopy(runs[1])
    del new["scenarios"][3]  # soak did not run
    new["scenarios"][0]["checks"].pop()  # accounting.balanced missing
    cmp = compare(base, new)
    assert any("scenario soak is only in base" in w for w in cmp.warnings)
    assert _row(cmp, "steady_state", "check accounting.balanced").status == MISSING
    assert not cmp.regressed


def test_an_invalid_run_judges_nothing():
    base, new = (
        build_document(0, ["steady_state", "spike"]),
        build_document(1, ["steady_state", "spike"]),
    )
    new["scenarios"][1]["by_class"]["default"]["latency_hdr"] = scaled_hdr(
        new["scenarios"][1]["by_class"]["default"]["latency_hdr"], 3
    )
    cmp = compare(base, new)
    assert cmp.invalid_scenarios == ("spike",)
    assert {d.status for d in cmp.deltas if d.scenario == "spike"} == {NOT_JUDGED}
    assert cmp.verdict == "invalid" and not cmp.regressed


def test_markdown_table_has_one_row_per_metric(runs):
    cmp = compare(*runs)
    md = cmp.to_markdown()
    rows = [
        line
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("| scenario")
    ]
    assert len(rows) == len(cmp.deltas)
    assert "| steady_state | `p99_ms[default]` |" in md


@pytest.mark.parametrize(
    ("base", "new", "better", "status"),
    [
        (10.0, 11.9, "lower", UNCHANGED),  # +19 % inside ±20 %
        (10.0, 12.1, "lower", REGRESSED),
        (10.0, 7.9, "lower", IMPROVED),
        (0.2, 1.1, "lower", UNCHANGED),  # the absolute floor (1.0) protects small bases
        (0.2, 1.3, "lower", REGRESSED),
        (100.0, 79.0, "higher", REGRESSED),
        (100.0, 119.0, "higher", UNCHANGED),
        (None, 1.0, "lower", "new"),
        (1.0, None, "lower", MISSING),
    ],
)
def test_judge_margin_is_relative_with_an_absolute_floor(base, new, better, status):
    assert judge(base, new, better, Margin(0.20, 1.0))[0] == status


def test_judge_closer_to_target():
    m = Margin(0.10, 0.5)
    assert judge(0, 3, "closer", m, target=0)[0] == REGRESSED
    assert judge(3, 0, "closer", m, target=0)[0] == IMPROVED
    assert judge(0, 0.4, "closer", m, target=0)[0] == UNCHANGED


def test_compare_dirs_loads_both_documents(tmp_path, runs):
    write_document(tmp_path / "a" / "results.json", runs[0])
    write_document(tmp_path / "b" / "results.json", runs[1])
    cmp = compare_dirs(tmp_path / "a", tmp_path / "b")
    assert cmp.base_label.endswith("a") and cmp.new_label.endswith("b")
    with pytest.raises(ResultFormatError, match="does not exist"):
        compare_dirs(tmp_path / "a", tmp_path / "c")
