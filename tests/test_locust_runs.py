"""Real Locust runs of locustfiles/inference.py against the reference server on loopback."""

from __future__ import annotations

import pytest

from harness.errors import ExitCode
from harness.testing.locust_runs import SCENARIOS, balanced, hist, run_locust, scenario_result
from harness.testing.server import start_server

# These load-mechanics scenarios list no check of their own (only the harness's
# bookkeeping, accounting.balanced): they judge nothing about the server, which is exit 4,
# never a pass (docs/checks.md, "Verdict").
NOT_JUDGED = ExitCode.NOT_JUDGED

pytestmark = pytest.mark.slow

# a cheap model: a few ms per batch, so the box's two shared cores are not the bottleneck
SIM = ("--model", "sim", "--sim-base-ms", "2", "--sim-item-ms", "0.1")


def test_headless_run_writes_balanced_results(tmp_path) -> None:
    with start_server(*SIM) as srv:
        run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "short_constant.toml"),
            "--sut-pid",
            str(srv.pid),
            "--out",
            str(tmp_path),
        )
    assert run.returncode == NOT_JUDGED, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    c = sc["counters"]
    # constant arrivals: exactly rate × duration per stage (60 × 3 + 120 × 3)
    assert c["scheduled"] == 540
    assert balanced(c) and c["in_flight"] == 0
    ok = c["ok"]
    # a healthy server answers most of it; a starved shared box may make some drop
    assert ok >= 0.5 * 540, c
    assert c["failed"]["cross_wired"] == c["failed"]["drift"] == c["failed"]["id_mismatch"] == 0
    assert not sc["partial"] and sc["error"] is None
    # every answer verified, none mismatched on a healthy server
    integ = sc["integrity"]
    assert integ["checked"] == ok and integ["ok"] == ok
    assert integ["cross_wired"] == integ["drift"] == integ["id_mismatch"] == 0
    # histograms agree with the counters, per class and per stage
    assert hist(sc["latency_hdr"]).get_total_count() == ok
    per_class = {k: v["counters"]["scheduled"] for k, v in sc["by_class"].items()}
    assert set(per_class) == {"high", "default"} and sum(per_class.values()) == 540
    assert 0.15 < per_class["high"] / 540 < 0.45  # share 0.3
    stage_n = {
        s: sum(v["counters"]["scheduled"] for v in d.values()) for s, d in sc["by_stage"].items()
    }
    assert stage_n == {"a": 180, "b": 360}
    rows = sc["windows"]["rows"]
    assert sum(r["scheduled"] for r in rows) == 540 and sum(r["ok"] for r in rows) == ok
    assert {r["class"] for r in rows} == {"high", "default"}
    assert hist(sc["dispatch_lag_hdr"]).get_total_count() == 540 - c["dropped"]
    assert sc["first_requests"]["n"] == 100
    # the sampler watched the server
    sampler_log = tmp_path / "samples" / "sampler.log"
    why = sampler_log.read_text() if sampler_log.exists() else "no sampler.log"
    assert sc["server"] is not None, why
    assert sc["server"]["pid"] == srv.pid and sc["server"]["ticks"] >= 3
    assert sc["check_config"] == {"accounting.balanced": {}}


def test_open_loop_shows_a_stall_that_closed_loop_hides(tmp_path) -> None:
    # The server stalls 0.5 s every 2.5 s. Open loop keeps sending on schedule, so the
    # requests due during a stall wait and p99 carries the stall; closed loop stops
    # sending while stalled, so only one request per user sees it and p99 stays low.
    with start_server(*SIM, "--fault", "stall:2.5,0.5") as srv:
        open_run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "stall.toml"),
            "--out",
            str(tmp_path / "open"),
            "--no-sample",
        )
        closed_run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "stall.toml"),
            "--out",
            str(tmp_path / "closed"),
            "--no-sample",
            "--closed-loop",
            "1",
        )
    assert open_run.returncode == NOT_JUDGED, open_run.stdout[-3000:]
    assert closed_run.returncode == NOT_JUDGED, closed_run.stdout[-3000:]
    o, c = scenario_result(tmp_path / "open"), scenario_result(tmp_path / "closed")
    assert balanced(o["counters"]) and balanced(c["counters"])
    ho, hc = hist(o["latency_hdr"]), hist(c["latency_hdr"])
    assert ho.get_total_count() > 200 and hc.get_total_count() > 5 * ho.get_total_count() / 10
    open_p99, closed_p99 = ho.get_value_at_percentile(99), hc.get_value_at_percentile(99)
    open_p50 = ho.get_value_at_percentile(50)
    # the stall is in the open-loop tail: p99 is far above its own median ...
    assert open_p99 > 10 * open_p50
    # ... and far above the closed-loop p99 of a run of the same length
    assert open_p99 > 5 * closed_p99, (open_p99, closed_p99)
    assert c["stages"][0]["kind"] == "closed" and o["stages"][0]["kind"] == "open"


def test_cross_wired_answers_are_counted(tmp_path) -> None:
    with start_server(*SIM, "--max-delay-ms", "10", "--fault", "cross-wire:0.5") as srv:
        run = run_locust(
            "--host",
            srv.url,
            "--scenario",
            str(SCENARIOS / "short_open.toml"),
            "--out",
            str(tmp_path),
            "--no-sample",
        )
    assert run.returncode == NOT_JUDGED, run.stdout[-3000:]
    sc = scenario_result(tmp_path)
    integ, c = sc["integrity"], sc["counters"]
    assert integ["cross_wired"] > 0
    assert c["failed"]["cross_wired"] == integ["cross_wired"]
    assert (
        integ["checked"]
        == integ["ok"] + integ["cross_wired"] + integ["drift"] + integ["id_mismatch"]
    )
    assert balanced(c)
    kinds = {e["kind"] for e in integ["examples"]}
    assert "cross_wired" in kinds
    ex = next(e for e in integ["examples"] if e["kind"] == "cross_wired")
    assert ex["matched_input"] != ex["sent_input"]
