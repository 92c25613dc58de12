"""One owner of the results document.

One histogram codec with one None rule, one percentile rule shared by the window rows,
the checks and the report, one USL fit stored in the document and plotted from there,
and a published JSON Schema derived from the typed records that every written document
meets.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from hdrh.histogram import HdrHistogram

from harness.analysis import hdr
from harness.analysis.linearity import fit_usl
from harness.analysis.percentiles import percentile_ms
from harness.checks import _data as d
from harness.load.recording import Recording, merged
from harness.load.result import linearity_view, scenario_result
from harness.load.scenario import load_scenario
from harness.report import plots
from harness.report.common import decode_hdr, fmt_num, hdr_summary
from harness.report.html import render_html
from harness.results import SCHEMA, load_document, new_document, readers, records, write_document
from harness.results.schema import SCHEMA_FILE, json_schema, render
from harness.testing.checks import run, steady_result
from harness.testing.reference_document import build_document
from harness.testing.results import MACHINE, scenario
from tests.conftest import schema_errors

GOLDEN = SCHEMA_FILE.parent.parent / "tests" / "data" / "results_v1.json"


def _edge_latencies_ms() -> list[int]:
    """560 distinct latencies 1…560 ms: p99 is rank ⌈0.99·560⌉ = 555 by nearest rank,
    but hdrh's get_value_at_percentile rounds 554.4 to rank 554 — the old rules differ."""
    return list(range(1, 561))


# --- one percentile rule -------------------------------------------------------------------


def test_the_edge_case_really_separates_the_two_old_rules() -> None:
    h = hdr.decode(hdr.encode(_hist(_edge_latencies_ms())))
    assert hdr.nearest_rank(560, 0.99) == 555
    assert percentile_ms(h, 99) != h.get_value_at_percentile(99) / 1000.0  # hdrh's rounding
    assert percentile_ms(h, 99) == pytest.approx(555.0, rel=1e-3)


def test_the_report_p99_is_the_check_p99_on_the_same_histogram() -> None:
    sc = steady_result(_edge_latencies_ms())
    check = run("steady.p99_ms", sc, threshold=1000.0)
    assert check.passed is True
    table = hdr_summary(sc["by_class"]["default"]["latency_hdr"])
    assert table is not None and table["n"] == 560
    assert table["p99_ms"] == check.value
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append({**sc, "checks": [check.to_dict()], "verdict": "pass"})
    html = render_html(doc)
    # the latency table of report.html prints the same number the check judged
    assert f'<td class="num">{fmt_num(round(check.value, 3))}</td>' in html


def test_window_rows_use_the_same_rule() -> None:
    rec = Recording(window_s=10.0)
    for i, ms in enumerate(_edge_latencies_ms()):
        t = 0.001 * i
        rec.scheduled("default", "steady", t)
        rec.sent("default", "steady", t, 0)
        rec.done("default", "steady", t, "ok", ms * 1000)
    master = merged([rec.drain(now_t=20.0, final=True)], window_s=10.0)
    (row,) = master.rows
    h = hdr.decode(master.by_class()["default"]["latency_hdr"])
    assert row["p99_ms"] == percentile_ms(h, 99)
    assert row["p50_ms"] == percentile_ms(h, 50) and row["p90_ms"] == percentile_ms(h, 90)
    assert row["max_ms"] == percentile_ms(h, 100)
    # the checks' window view reads exactly those rows
    windows = d.windows({"windows": {"width_s": 10.0, "rows": master.rows}})
    assert windows is not None and windows.p99_ms == [row["p99_ms"]]


def _hist(values_ms: list[int]) -> HdrHistogram:
    h = hdr.new_histogram()
    for v in values_ms:
        h.record_value(v * 1000)
    return h


# --- one codec, one None rule --------------------------------------------------------------


def test_one_codec_reads_none_as_empty_and_refuses_damage() -> None:
    assert hdr.encode(None) is None and hdr.encode(hdr.new_histogram()) is None
    assert hdr.decode(None).get_total_count() == 0 and hdr.decode("").get_total_count() == 0
    text = hdr.encode(_hist([1, 2, 3]))
    assert isinstance(text, str) and hdr.decode(text).get_total_count() == 3
    assert hdr.decode(text.encode("ascii")).get_total_count() == 3
    assert hdr.merge([text, None, _hist([4])]).get_total_count() == 4
    with pytest.raises(hdr.HdrFormatError, match="not an HDR histogram"):
        hdr.decode("bm90IGFuIEhEUg==")
    # every reader applies that rule: nothing recorded is None to the checks and the report
    for absent in (None, "", hdr.encode(hdr.new_histogram())):
        assert d.optional_hist(absent) is None and decode_hdr(absent) is None
    assert decode_hdr("bm90IGFuIEhEUg==") is None  # a damaged field omits a table, no crash
    assert d.optional_hist(text).get_total_count() == 3  # type: ignore[union-attr]


# --- one USL fit ---------------------------------------------------------------------------


def _linearity_doc() -> dict:
    doc = build_document(scenarios=["linearity"])
    return json.loads(json.dumps(doc))


def test_the_usl_fit_is_stored_and_upgrades_fill_it_for_older_documents(tmp_path) -> None:
    doc = _linearity_doc()
    assert "usl" not in doc["scenarios"][0]["linearity"]  # written before the field existed
    write_document(tmp_path / "results.json", doc)
    lin = load_document(tmp_path / "results.json")["scenarios"][0]["linearity"]
    fit = fit_usl(readers.linearity_replicates(lin["points"]))
    assert fit is not None
    assert lin["usl"] == {
        "lam": fit.lam,
        "sigma": fit.sigma,
        "kappa": fit.kappa,
        "n_peak": fit.n_peak if math.isfinite(fit.n_peak) else None,
        "x_peak": fit.x_peak if math.isfinite(fit.x_peak) else None,
        "rmse": fit.rmse,
    }
    assert doc["scenarios"][0]["linearity"].get("usl") is None  # the input was not modified


def test_the_builder_stores_the_fit_of_the_points_it_measured() -> None:
    sc_def = load_scenario("linearity", "quick").with_cores(2)
    rows = []
    for stage in sc_def.stages:
        n = stage.threads if sc_def.linearity.vary == "threads" else stage.users
        for t in range(int(stage.start_s + stage.warmup_s), int(stage.end_s)):
            rows.append({"t": float(t), "ok": int(100 * (n or 1) * (0.9 ** ((n or 1) - 1)))})
    view = linearity_view(sc_def, rows, cores=2)
    assert view is not None and view["usl"] == readers.usl_params(view["points"])
    assert view["usl"] is not None and view["usl"]["kappa"] >= 0


def test_the_plot_draws_the_stored_fit_and_never_refits() -> None:
    sc = _linearity_doc()["scenarios"][0]
    sc["linearity"]["usl"] = {
        "lam": 55.0,
        "sigma": 0.123,
        "kappa": 0.0456,
        "n_peak": 4.6,
        "x_peak": 120.0,
        "rmse": 1.0,
    }
    fig = plots.linearity(sc)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "USL fit σ=0.123 κ=0.0456" in labels
    sc["linearity"]["usl"] = None  # stored as "could not be fitted": no line, a note
    fig = plots.linearity(sc)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any(lbl.startswith("USL fit") for lbl in labels)
    assert "no USL fit" in fig.axes[0].get_title()


# --- the published schema ------------------------------------------------------------------


def test_the_published_schema_is_generated_from_the_records() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render(), (
        "schemas/results.v1.json is stale: run `python -m harness.results.schema`"
    )
    jsonschema.Draft202012Validator.check_schema(json_schema())
    scenario_props = json_schema()["$defs"]["ScenarioResult"]["properties"]
    assert set(scenario_props) == set(records.ScenarioResult.__annotations__)


def test_the_golden_file_and_the_factory_meet_the_schema() -> None:
    raw = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert raw["schema"] == SCHEMA
    assert schema_errors(raw) == []
    assert schema_errors(json.loads(json.dumps(load_document(GOLDEN)))) == []  # with usl filled
    assert schema_errors(json.loads(json.dumps(build_document(seed=3)))) == []


def test_a_document_built_by_the_load_side_meets_the_schema() -> None:
    sc_def = load_scenario("steady_state", "quick")
    rec = Recording(window_s=1.0)
    for i in range(50):
        t = i * 0.05
        rec.scheduled("default", sc_def.stages[0].name, t)
        rec.sent("default", sc_def.stages[0].name, t, 120)
        outcome = "ok" if i % 10 else "http_503"
        rec.done("default", sc_def.stages[0].name, t, outcome, 2000 + i)
    master = merged([rec.drain(now_t=10.0, final=True)], window_s=1.0)
    sc = scenario_result(
        scenario=sc_def,
        file="scenarios/steady_state.toml",
        recording=master,
        started_unix=1.0,
        duration_s=2.5,
        partial=False,
        capacity_rps=100.0,
        calibration=None,
        time_to_ready_s=None,
        golden_summary={"tolerance": 1e-5, "pool": 8, "distinct": 8},
        chaos=[],
        samples=None,
        sut_cores=None,
        error=None,
        sut_exit=None,
        workers=1,
    )
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append(sc)
    assert schema_errors(json.loads(json.dumps(doc))) == []


def test_the_schema_rejects_a_misshapen_document() -> None:
    doc = json.loads(json.dumps(build_document(scenarios=["steady_state"])))
    doc["scenarios"][0]["counters"]["ok"] = "11890"
    del doc["scenarios"][0]["by_class"]
    doc["scenarios"][0]["windows"]["rows"][0]["p99_ms"] = "slow"
    errors = "\n".join(schema_errors(doc))
    assert "scenarios/0/counters/ok" in errors and "'by_class' is a required property" in errors
    assert "scenarios/0/windows: " in errors  # rows[0].p99_ms: neither Windows nor null


def test_every_document_written_during_a_test_is_validated(tmp_path) -> None:
    """The conftest hook is live: writing a misshapen v1 document fails the test."""
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append({**scenario("s", 1.0), "counters": {"ok": "many"}})
    with pytest.raises(AssertionError, match="breaks schemas/results.v1.json"):
        write_document(tmp_path / "bad" / "results.json", doc)
    assert not (tmp_path / "bad" / "results.json").exists()


def test_the_linearity_check_names_the_stored_fit() -> None:
    sc = _linearity_doc()["scenarios"][0]
    computed = readers.usl_params(sc["linearity"]["points"])
    assert computed is not None
    # without a stored fit (a hand-built result) the check computes the same one
    plain = run("linearity.efficiency", sc, max_n=2)
    assert f"USL σ={computed['sigma']:.3f} κ={computed['kappa']:.4f}" in plain.detail
    sc["linearity"]["usl"] = {**computed, "sigma": 0.321, "kappa": 0.0123, "n_peak": None}
    stored = run("linearity.efficiency", sc, max_n=2)
    assert "USL σ=0.321 κ=0.0123, none in range (κ=0)" in stored.detail
    assert (stored.passed, stored.value) == (plain.passed, plain.value)  # the verdict is E(N)


def test_the_rank_rule_matches_a_sorted_list_and_is_cheap_enough_for_the_master() -> None:
    """values_at_ranks_us against the brute-force definition (the sorted values, to HDR
    precision) on fresh and decoded histograms; and the ratio to hdrh's own one-pass
    percentile query: the master summarises every window with it while the load runs, so
    it must not cost more than hdrh's (the recorded-value iterator it replaced cost ~20x)."""
    import random
    import time

    from harness.analysis import hdr

    rng = random.Random(1)
    for trial in range(60):
        h, values = hdr.new_histogram(), []
        for _ in range(rng.randint(1, 2000)):
            v = hdr.clamp_us(rng.lognormvariate(rng.uniform(5, 14), rng.uniform(0.1, 2)))
            h.record_value(v)
            values.append(v)
        if trial % 2:
            h = hdr.decode(hdr.encode(h))
        n = len(values)
        ranks = [1, hdr.nearest_rank(n, 0.5), hdr.nearest_rank(n, 0.99), n]
        ordered = sorted(values)
        want = [h.get_highest_equivalent_value(ordered[r - 1]) for r in ranks]
        assert hdr.values_at_ranks_us(h, ranks) == want
    h = hdr.new_histogram()
    for _ in range(500):
        h.record_value(hdr.clamp_us(rng.lognormvariate(11, 0.5)))
    t0 = time.perf_counter()
    for _ in range(20):
        hdr.summary_ms(h)
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        h.get_percentile_to_value_dict([50.0, 90.0, 99.0])
    theirs = time.perf_counter() - t0
    assert ours < theirs, f"summary_ms {ours / 20 * 1e3:.2f} ms vs hdrh {theirs / 20 * 1e3:.2f} ms"
