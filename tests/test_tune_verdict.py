"""`harness tune`'s verdict: its exit code is the fastest configuration's quick-checklist
verdict, a configuration whose search the server did not stop is "not measured" (never
ranked on a peak, never recommended), and a fastest configuration whose checklist fails
is not recommended.

Synthetic searches (``Tuner``'s measurement replaced) and synthetic checklist runs
(``run_checklist`` replaced; its results documents from harness/testing/reference_document.py): no
server, no load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import ExitCode
from harness.peak import tune
from harness.peak.config import PeakConfig
from harness.peak.outcomes import INVALID_TRIES, Point
from harness.peak.tune import (
    MEASURED,
    NOT_MEASURED,
    Space,
    TuneConfig,
    Tuner,
    config_result,
    key,
)
from harness.report.tune import _tune_rows, tune_markdown, tune_sentence

TEMPLATE = "srv --port {port} --b {b}"
SPACE = Space.parse(["b=1,2,3"], TEMPLATE)
# each configuration's edge; far enough apart that no separation is contested (no head to
# head rounds): 4 > 2 by 2x, 2 > 1 by 2x
EDGES = {"b=1": 100.0, "b=2": 200.0, "b=3": 400.0}


def _complete(edge: float) -> list[Point]:
    """A search that ended at its edge (tolerance 0.1, one repeat): met at it, missed 5 %
    above."""
    return [Point(edge, "met", p99_ms=50.0), Point(edge * 1.05, "missed", p99_ms=150.0)]


def _tc(max_points: int = 30) -> TuneConfig:
    return TuneConfig(
        template=TEMPLATE,
        space=SPACE,
        default=SPACE.parse_config("b=1", "--default"),
        peak=PeakConfig(slo_p99_ms=100.0, tolerance=0.1, repeats=1, max_points=max_points),
        mode="brute",
    )


def _searches(special: dict[str, tuple[list[Point], str]] | None = None):
    """``Tuner._measure``: each configuration's complete search, or ``special``'s."""

    def measure(self, cfg, pc, points, on_point):
        k = key(cfg)
        pts, why = (special or {}).get(k) or (_complete(EDGES[k]), "edge found")
        for p in pts:
            on_point(p)
        return list(pts), why

    return measure


def _checklist(results: dict[str, tuple[int, list[str]]], ran: list[str]):
    """``run_checklist``: `harness acceptance --quick` on a configuration — its exit code
    and the checks that failed, written as that run's results.json (the factory's soak
    scenario: ``soak.rss_trend`` failed there for a leaking server, passed otherwise)."""
    from harness.results import write_document
    from harness.testing.reference_document import build_document

    def run(argv: list[str], out_dir: Path) -> dict:
        cmd = argv[argv.index("--sut-cmd") + 1]
        protocol = argv[argv.index("--protocol") + 1] if "--protocol" in argv else None
        k = next(k for k in EDGES if cmd.endswith(f"--b {k[2:]}"))
        ran.append(k if protocol is None else f"{k} --protocol {protocol}")
        code, failing = results[k]
        doc = build_document(scenarios=["soak"])
        for c in doc["scenarios"][0]["checks"]:
            if c["passed"] is not None:
                c["passed"] = c["id"] not in failing if failing else True
        doc["scenarios"][0]["verdict"] = "fail" if failing else "pass"
        out_dir.mkdir(parents=True, exist_ok=True)
        write_document(out_dir / "results.json", doc)
        word = {0: "PASS", 1: "FAIL", 3: "INVALID", 4: "NOT JUDGED"}.get(code, "")
        return tune.checklist_result(code, f"{word} — across 1 scenario\n{out_dir}\n", "", out_dir)

    return run


def _run(tmp_path, monkeypatch, checklist: dict | None, special=None, max_points: int = 30):
    ran: list[str] = []
    monkeypatch.setattr(Tuner, "_measure", _searches(special))
    monkeypatch.setattr(Tuner, "_measure_at", lambda *a: pytest.fail("no head to head here"))
    if checklist is not None:
        monkeypatch.setattr(tune.verdict, "run_checklist", _checklist(checklist, ran))
    doc, code = tune.run_tune(
        _tc(max_points), tmp_path, checklist=checklist is not None, show=lambda t: None
    )
    from tests.conftest import assert_valid_results

    assert_valid_results(doc, "a tune document")  # doc["tune"]: the schema's TuneSection
    return doc["tune"], code, ran


@pytest.mark.parametrize(
    ("checklist_exit", "tune_exit", "said"),
    [
        (0, ExitCode.PASS, "Its quick checklist passed"),
        (1, ExitCode.FAIL, "failed its quick checklist"),
        (3, ExitCode.INVALID, "Its quick checklist was INVALID: the recommendation is unconfirmed"),
        (4, ExitCode.NOT_JUDGED, "Its quick checklist was NOT JUDGED"),
        (2, ExitCode.NOT_JUDGED, "Its quick checklist was NOT JUDGED"),  # it could not run
    ],
)
def test_the_tunes_exit_code_is_its_fastest_configurations_checklist_verdict(
    tmp_path, monkeypatch, checklist_exit, tune_exit, said
) -> None:
    """Before, the tune exited 0 whatever the checklist said: the exit code never read it."""
    failing = ["soak.rss_trend"] if checklist_exit == 1 else []
    results = {k: (0, []) for k in EDGES} | {"b=3": (checklist_exit, failing)}
    summary, code, ran = _run(tmp_path, monkeypatch, results)
    assert ran == ["b=3"]  # the fastest, only
    assert code == tune_exit
    assert summary["verdict"] == {0: "pass", 1: "fail", 3: "invalid"}.get(
        checklist_exit, "not_judged"
    )
    assert said in tune_sentence(summary)
    md = (tmp_path / "summary.md").read_text()
    assert said in md and "## Quick checklist on the fastest configuration" in md
    written = json.loads((tmp_path / "results.json").read_text())["tune"]
    assert written["checklist"]["exit_code"] == checklist_exit
    assert written["verdict"] == summary["verdict"]


def test_a_tune_whose_fastest_configuration_leaks_recommends_nothing(tmp_path, monkeypatch):
    """The detection case: the fastest configuration (b=3, twice the next one's peak)
    leaks — its quick checklist's soak fails ``soak.rss_trend`` — and the tune recommended
    it with exit 0. Now it is named as the fastest, NOT recommended, the failed check named,
    and the tune exits 1 without checking the next one (a configuration whose checklist
    fails is a finding about the server, not a reason to swap in the runner-up silently).
    Its healthy twin, the same tune whose fastest configuration passes, recommends it and
    exits 0."""
    leak = {k: (0, []) for k in EDGES} | {"b=3": (1, ["soak.rss_trend"])}
    summary, code, ran = _run(tmp_path / "leak", monkeypatch, leak)
    assert code == ExitCode.FAIL and ran == ["b=3"]
    assert summary["fastest"] == "b=3" and summary["recommended"] is None
    assert summary["recommended_cmd"] is None
    assert summary["checklist"]["failed_checks"] == ["soak.rss_trend"]
    text = tune_sentence(summary)
    assert text.startswith("FAILED: b=3, the fastest configuration measured (peak 400.0 req/s")
    assert "failed its quick checklist (soak.rss_trend): not recommended" in text, text
    assert "the next one, b=2 (peak 200.0 req/s), was not checked" in text
    md = (tmp_path / "leak" / "summary.md").read_text()
    assert "Recommended:" not in md and "```" not in md  # no command to deploy
    row = next(r for r in _tune_rows(summary) if r[1] == "b=3")
    assert "NOT recommended: its quick checklist failed" in row[-1]
    healthy = {k: (0, []) for k in EDGES}
    summary, code, ran = _run(tmp_path / "healthy", monkeypatch, healthy)
    assert code == ExitCode.PASS and summary["recommended"] == "b=3" and ran == ["b=3"]
    assert tune_sentence(summary).startswith("Recommended: b=3")


def test_without_the_checklist_the_tune_says_it_was_not_run(tmp_path, monkeypatch) -> None:
    """``--no-checklist`` is the user's choice: the measurement alone decides (exit 0 here)
    and the sentence says the recommendation was not checked."""
    summary, code, _ = _run(tmp_path, monkeypatch, None)
    assert code == ExitCode.PASS and summary["recommended"] == "b=3"
    assert "quick checklist was not run (--no-checklist)" in tune_sentence(summary)


def _budget(edge: float, n: int) -> list[Point]:
    """A search that met at every rate it reached before its ``n``-point budget ran out."""
    return [Point(edge * 1.5**i, "met", p99_ms=50.0) for i in range(n)]


def test_a_search_stopped_by_the_budget_the_generator_or_the_ceiling_is_not_measured() -> None:
    """What stopped the search decides whether its peak is one: `harness peak` calls a
    search stopped by the load generator, its point budget or its ceiling no answer (exit
    3); the tune counted it as a peak. Measured: the search ended at the edge, or no rate
    met the SLO; failed: the server died or did not start."""
    cfg = SPACE.parse_config("b=1", "--default")

    def result(points, why="", max_points=4):
        return config_result(cfg, points, why, "srv", None, 1, 0.1, max_points)

    budget = result(_budget(100.0, 4))
    assert budget["status"] == NOT_MEASURED and budget["peak_rps"] is None
    assert budget["held_rps"] == 337.5  # what it showed, kept — not ranked on
    assert (
        budget["status_reason"] == "its 4-point budget was spent before the server's edge was found"
    )
    generator = result(
        [
            Point(100.0, "met"),
            *[Point(150.0, "invalid", reasons=("dispatch lag",))] * INVALID_TRIES,
        ],
        "150.0 req/s was invalid 3 times",
        max_points=30,
    )
    assert generator["status"] == NOT_MEASURED and generator["peak_rps"] is None
    assert generator["status_reason"].startswith(
        "the load generator, not the server, was the limit"
    )
    ceiling = result([Point(700_000.0, "met")], "met up to the 1e+06 req/s ceiling", 30)
    assert ceiling["status"] == NOT_MEASURED and "ceiling" in ceiling["status_reason"]
    found = result(_complete(200.0), "edge found", 30)
    assert found["status"] == MEASURED and found["peak_rps"] == 200.0
    none_met = result([Point(100.0, "missed"), Point(50.0, "missed")], "missed down", 30)
    assert none_met["status"] == MEASURED and none_met["peak_rps"] == 0.0
    # an edge settled by the budget's last point is an answer, not a budget stop
    last = [Point(100.0, "met"), Point(150.0, "met"), Point(225.0, "missed"), Point(210.0, "met")]
    assert result(last, "edge found", 4)["status"] == MEASURED
    assert result(last, "edge found", 4)["peak_rps"] == 210.0
    did_not_start = result([], "the server did not start: exit 2 (bad flag)", 30)
    assert did_not_start["status"] == "failed"


def test_a_budget_stopped_fastest_configuration_is_never_recommended(tmp_path, monkeypatch):
    """b=3 met at 400, 600, 900, 1350 req/s and spent its 4-point budget without a miss.
    Before, its 1350 was ranked first and recommended (exit 0). Now it is not measured: the
    best measured one, b=2, is recommended only as the best of the rest — b=3 was not
    measured worse than it — and the tune exits 3 saying so. The control: a not-measured
    configuration that its points show below the recommendation (it missed in every
    outcome from a rate the recommendation held 10 % above) leaves the answer whole."""
    special = {"b=3": (_budget(400.0, 4), "point budget of 4 spent")}
    results = {k: (0, []) for k in EDGES}
    summary, code, ran = _run(tmp_path / "open", monkeypatch, results, special, max_points=4)
    assert summary["recommended"] == "b=2" and ran == ["b=2"]
    assert code == ExitCode.INVALID and summary["left_open"] == ["b=3"]
    ranked = summary["ranked"]
    assert [r["key"] for r in ranked] == ["b=2", "b=1", "b=3"]
    assert ranked[-1]["rank"] is None and ranked[-1]["peak_rps"] is None
    text = tune_sentence(summary)
    assert "NOT a full answer: b=3 could not be measured and was not measured worse" in text
    assert "Not measured, never ranked: b=3 (its 4-point budget was spent" in text
    row = next(r for r in _tune_rows(summary) if r[1] == "b=3")
    assert row[0] == "–" and row[2] == "not measured"
    assert "not measured: its 4-point budget" in row[-1] and "met up to 1350.0" in row[-1]
    # the control: b=1 ran out of budget bisecting [125, 150], having missed from 150 up
    below = [
        Point(100.0, "met"),
        Point(200.0, "missed"),
        Point(150.0, "missed"),
        Point(125.0, "met"),
    ]
    special = {"b=1": (below, "point budget of 4 spent")}
    summary, code, _ = _run(tmp_path / "closed", monkeypatch, results, special, max_points=4)
    b1 = next(r for r in summary["ranked"] if r["key"] == "b=1")
    assert b1["status"] == NOT_MEASURED  # its edge is somewhere in [125, 150]
    assert summary["recommended"] == "b=3" and code == ExitCode.PASS
    assert summary["left_open"] == []


def test_no_configuration_measured_is_invalid_in_one_sentence(tmp_path, monkeypatch) -> None:
    """Every configuration's search stopped by the load generator (every point invalid):
    nothing to rank or recommend, exit 3 with one sentence naming each and why."""
    invalid = [Point(100.0, "invalid", reasons=("dispatch lag",))] * INVALID_TRIES
    why = "100.0 req/s was invalid 3 times (the load generator, not the server, was the limit)"
    special = {k: (invalid, why) for k in EDGES}
    summary, code, ran = _run(tmp_path, monkeypatch, {k: (0, []) for k in EDGES}, special)
    assert code == ExitCode.INVALID and ran == [] and summary["recommended"] is None
    text = tune_sentence(summary)
    assert text.startswith("INVALID: no configuration was measured, nothing to recommend")
    assert "\n" not in text and all(k in text for k in EDGES)
    assert "the load generator, not the server, was the limit" in text
    assert text in tune_markdown({"tune": summary})


def test_a_budget_stopped_configuration_goes_on_when_the_tune_resumes_with_more_points(
    tmp_path, monkeypatch
) -> None:
    """The remedy the report points to: the same tune with a larger ``--max-points`` goes
    on from the points a budget-stopped configuration has, and only from those; the
    configurations that were measured are read back, not searched again."""
    special = {"b=3": (_budget(400.0, 4), "point budget of 4 spent")}
    results = {k: (0, []) for k in EDGES}
    summary, code, _ = _run(tmp_path, monkeypatch, results, special, max_points=4)
    assert code == ExitCode.INVALID and summary["left_open"] == ["b=3"]
    searched: list[tuple[str, int]] = []

    def measure(self, cfg, pc, points, on_point):
        searched.append((key(cfg), len(points)))
        more = [Point(2025.0, "missed"), Point(1687.5, "met"), Point(1856.25, "missed")]
        for p in more:
            on_point(p)
        return [*points, *more], "edge found"

    monkeypatch.setattr(Tuner, "_measure", measure)
    doc, code = tune.run_tune(_tc(8), tmp_path, checklist=True, show=lambda t: None)
    assert searched == [("b=3", 4)]  # from its 4 points; b=1 and b=2 read back
    b3 = next(r for r in doc["tune"]["ranked"] if r["key"] == "b=3")
    assert b3["status"] == MEASURED and b3["peak_rps"] == 1687.5 and b3["n_points"] == 7
    assert code == ExitCode.PASS and doc["tune"]["recommended"] == "b=3"


def test_a_tune_in_tokens_is_judged_and_reported_in_tokens_and_checklisted_in_them(
    tmp_path, monkeypatch
) -> None:
    """``harness tune --protocol openai``: the SLO is the TTFT and TPOT bounds (the objective
    says so, the section keeps both), each configuration's TTFT and TPOT p99 at its peak are
    in its row, and the winner's quick checklist is the one in tokens."""
    from harness.peak.tune import verdict

    def tokens(edge: float) -> list[Point]:
        return [
            Point(edge, "met", p50_ms=80.0, p99_ms=120.0, tpot_p99_ms=48.0),
            Point(edge * 1.05, "missed", p99_ms=float("inf"), tpot_p99_ms=51.0),
        ]

    ran: list[str] = []
    monkeypatch.setattr(
        Tuner, "_measure", _searches({k: (tokens(e), "edge found") for k, e in EDGES.items()})
    )
    monkeypatch.setattr(tune.verdict, "run_checklist", _checklist({"b=3": (0, [])}, ran))
    tc = TuneConfig(
        template=TEMPLATE,
        space=SPACE,
        default=SPACE.parse_config("b=1", "--default"),
        peak=PeakConfig(slo_p99_ms=2000.0, slo_tpot_ms=100.0, tolerance=0.1, repeats=1),
        mode="brute",
        protocol="openai",
    )
    doc, code = tune.run_tune(tc, tmp_path, checklist=True, show=lambda t: None)
    from tests.conftest import assert_valid_results

    assert_valid_results(doc, "a tune document in tokens")
    t = doc["tune"]
    assert code == ExitCode.PASS and ran == ["b=3 --protocol openai"]
    assert "TTFT p99 <= 2000 ms and TPOT p99 <= 100 ms" in t["objective"]
    assert "whole answers >= 99.0% of the streams" in t["objective"]
    assert (t["slo_p99_ms"], t["slo_tpot_ms"]) == (2000.0, 100.0)
    best = t["ranked"][0]
    assert (best["p99_at_peak_ms"], best["tpot_p99_at_peak_ms"]) == (120.0, 48.0)
    md = tune_markdown(doc)
    assert "| TTFT p50 / p99 at peak (ms) | TPOT p99 at peak (ms) |" in md
    assert "80.0 / 120.0 | 48.0 |" in md
    assert "every point's streams judged by the harness (TTFT and TPOT p99" in md
    assert "requests judged by the harness" not in md  # the V2 early-stopping sample size

    # the command the checklist runs: the tune's protocol and model
    argv = verdict.checklist_argv("srv --b 3", tmp_path, None, "openai", "tiny")
    assert argv[-4:] == ["--protocol", "openai", "--model", "tiny"]
    assert "--protocol" not in verdict.checklist_argv("srv --b 3", tmp_path, None)
