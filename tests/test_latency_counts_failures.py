"""No latency or integrity PASS that leaves the bad requests out.

* the p99 SLO checks rank every failed, timed-out or dropped request above every
  success (goodput), so a server cannot pass by failing its slowest requests;
* the cold-start checks judge the first requests *sent*, whatever their outcome, not
  the first ok answers to come back (``cold_start.first_error_rate`` is new);
* drift beyond the tolerance fails ``integrity.mismatches`` unless the checklist
  declares the model nondeterministic.

Each test builds the synthetic result that passed before the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from harness.analysis.hdr import decode
from harness.analysis.percentiles import (
    early_stopping_min_n,
    percentile_ms,
    percentile_with_failures_ms,
    slo_assessment,
)
from harness.checks import REGISTRY, resolve_params
from harness.checks._data import fmt
from harness.errors import ConfigError
from harness.load.recording import Recording
from harness.testing.checks import (
    counters,
    failed,
    hdr,
    passed,
    priority_result,
    result,
    run,
    skipped,
)
from harness.testing.results import stage
from harness.testing.server import infer_body
from harness.testing.server_app import SIM
from harness.testing.server_app import client as server_client
from harness_reference_server.errors import ConfigError as ServerConfigError
from harness_reference_server.fault_catalog import parse_faults


def steady(
    latencies_ms: list[float],
    fails: dict[str, int] | None = None,
    dropped: int = 0,
    in_flight: int = 0,
) -> dict[str, Any]:
    """A one-stage steady result whose counters match its histogram."""
    c = counters(len(latencies_ms), fails, dropped=dropped, in_flight=in_flight)
    entry = {"counters": c, "latency_hdr": hdr_ms(latencies_ms)}
    return result(
        stages=[stage("steady", 0, 120, 100.0)],
        counters=c,
        by_class={"default": entry},
        by_stage={"steady": {"default": entry}},
    )


def hdr_ms(latencies_ms: list[float]) -> str:
    return hdr(x * 1000 for x in latencies_ms)


def fast(n: int, seed: int = 0) -> list[float]:
    """``n`` healthy latencies, 15–60 ms (p99 well under 159 ms)."""
    rng = np.random.default_rng(seed)
    return list(np.clip(rng.lognormal(np.log(25), 0.25, n), 15, 60))


# --- failed requests count against the latency SLO -------------------------------------------


def test_steady_p99_counts_failed_and_dropped_requests_as_over_the_slo() -> None:
    # the stall server: ok answers fast (p99 < 159 ms), the stalled 1.5 % timed out or
    # were dropped at the client's cap — the old check judged the ok ones only and passed
    lat = fast(19_700)
    sc = steady(lat, {"timeout": 200}, dropped=100)
    c = run("steady.p99_ms", sc, stage="steady", threshold=159)
    failed(c)
    assert c.value == math.inf and c.to_dict()["value"] is None  # a failure, over any SLO
    assert c.n == 20_000
    assert "300 of 20000" in c.detail and "1.50%" in c.detail
    assert f"successful-only p99 {fmt(percentile_ms(decode(hdr_ms(lat)), 99.0))} ms" in c.detail
    # dropped requests alone do it too (requests the server never got to answer)
    failed(run("steady.p99_ms", steady(fast(9_800), dropped=200), threshold=159))


def test_steady_p99_is_the_ok_latency_at_the_rank_shifted_by_failures() -> None:
    # 0.6 % slow ok answers and 0.6 % failures: each alone fits in the 1 % a p99 leaves,
    # together they do not. Ok-only the p99 is 20 ms; ranked with the failures it is 600.
    lat = [20.0] * 9_940 + [600.0] * 60
    sc = steady(lat, {"http_503": 60})
    c = run("steady.p99_ms", sc, threshold=200)
    failed(c)
    assert c.value == pytest.approx(600, rel=0.01) and c.n == 10_060
    assert "successful-only p99 20 ms" in c.detail and "60 of them failed or dropped" in c.detail
    # without the failures it passes: the rule shifts the rank, it does not fail on any error
    passed(run("steady.p99_ms", steady(lat), threshold=200))


def test_requests_in_flight_at_the_end_are_neither_ok_nor_failed() -> None:
    c = run("steady.p99_ms", steady(fast(10_000), in_flight=500), threshold=159)
    passed(c)
    assert c.n == 10_000


def test_early_stopping_counts_failures_as_overs() -> None:
    # 500 fast ok answers and 2 timeouts: ok-only that is 0 over in 500 >= 459, a pass;
    # with the 2 failures as overs a confident pass needs more requests
    sc = steady([10.0] * 500, {"timeout": 2})
    c = run("steady.p99_ms", sc, threshold=50)
    skipped(c, "insufficient samples", f"n >= {early_stopping_min_n(2)}", "2 of them failed")
    assert c.n == 502
    h = decode(sc["by_class"]["default"]["latency_hdr"])
    a = slo_assessment(h, 50.0, failed=2)
    assert (a.verdict, a.n, a.overs, a.failed) == ("insufficient", 502, 2, 2)
    assert slo_assessment(h, 50.0).verdict == "pass"  # the old, ok-only view


def test_percentile_with_failures_ranks_them_above_every_success() -> None:
    h = decode(hdr([1000 * (i + 1) for i in range(99)]))  # 1..99 ms
    assert percentile_with_failures_ms(h, 99.0, 0) == pytest.approx(99, rel=0.01)
    assert percentile_with_failures_ms(h, 50.0, 1) == pytest.approx(50, rel=0.01)
    # 1 failure in 100: rank 99 is still the slowest ok answer; 2 in 101: rank 100 fails
    assert percentile_with_failures_ms(h, 99.0, 1) == pytest.approx(99, rel=0.01)
    assert percentile_with_failures_ms(h, 99.0, 2) == math.inf
    assert percentile_with_failures_ms(decode(hdr([])), 99.0, 3) == math.inf
    assert percentile_with_failures_ms(decode(hdr([])), 99.0, 0) is None


def test_high_p99_counts_the_high_class_failures() -> None:
    # the high class answers fast but fails 3 % (within its 5 % reject budget): the old
    # p99 over its ok answers passed at 30 ms
    sc = priority_result(high_ms=30, high_fail=30)
    passed(run("priority.high_reject_rate", sc, stage="overload"))
    c = run("priority.high_p99_ms", sc, stage="overload", class_name="high")
    failed(c)
    assert c.value == math.inf and "30 of 1000" in c.detail and "successful-only" in c.detail


# --- cold start judges the first requests sent, whatever their outcome ----------------------


def first_doc(rec: Recording) -> dict[str, Any]:
    """``first_requests`` as the results document carries it (JSON round trip)."""
    return json.loads(json.dumps(rec.first_requests()))


def test_recording_follows_the_first_requests_sent_across_drain_and_merge() -> None:
    rec = Recording(first_n=10)
    master = Recording(first_n=10)
    ts = [i * 0.1 for i in range(15)]
    for t in ts:
        rec.scheduled("c", "cold", t)
    # the first one sent is dropped at the cap; the rest go out
    rec.dropped("c", "cold", ts[0])
    for t in ts[1:]:
        rec.sent("c", "cold", t, 0.0)
    # the five sent last answer first (1 ms) and ship in a drain of their own
    for t in ts[10:]:
        rec.done("c", "cold", t, "ok", 1_000)
    master.merge(rec.drain(now_t=0.5), source="w0")
    # then the first ones end: two 503s, a timeout, five ok after 2 s; ts[1] never ends
    rec.done("c", "cold", ts[2], "http_503", 50_000)
    rec.done("c", "cold", ts[3], "http_503", 50_000)
    rec.done("c", "cold", ts[4], "timeout", 5_000_000)
    for t in ts[5:10]:
        rec.done("c", "cold", t, "ok", 2_000_000)
    master.merge(rec.drain(now_t=3.0, final=True), source="w0")
    master.finish()
    # the 1 ms answers came back first but were not among the first sent
    assert master.first.get_total_count() == 5 and master.first.get_min_value() >= 1_990_000
    first = first_doc(master)
    assert first["scheduled"] == 10 and first["ok"] == 5 and first["n"] == 5
    assert first["dropped"] == 1 and first["in_flight"] == 1
    assert first["failed"]["http_503"] == 2 and first["failed"]["timeout"] == 1
    assert first["failed_total"] == 3
    assert first["scheduled"] == first["ok"] + first["failed_total"] + first["dropped"] + 1
    assert decode(first["latency_hdr"]).get_total_count() == 5


def test_first_requests_are_capped_per_worker_and_added_on_merge() -> None:
    master = Recording()
    for source in ("w0", "w1"):
        rec = Recording(first_n=3)
        for i in range(5):
            t = i / 10
            rec.scheduled("c", "s", t)
            rec.sent("c", "s", t, 0.0)
            rec.done("c", "s", t, "ok" if i else "http_500", 1_000 * (i + 1))
        master.merge(rec.drain(now_t=1.0, final=True), source=source)
    first = first_doc(master)
    assert first["scheduled"] == 6 and first["ok"] == 4 and first["failed"]["http_500"] == 2
    assert decode(first["latency_hdr"]).get_max_value() < 3_100  # only i = 1, 2


def cold_result(first: dict[str, Any], steady_ms: float = 20.0) -> dict[str, Any]:
    lat = [steady_ms] * 2_000
    c = counters(len(lat))
    entry = {"counters": c, "latency_hdr": hdr_ms(lat)}
    return result(
        stages=[stage("cold", 0, 30, 60.0), stage("steady", 30, 90, 60.0)],
        counters=c,
        by_class={"default": entry},
        by_stage={"steady": {"default": entry}},
        first_requests=first,
    )


def first_block(ok_ms: list[float], **fails: int) -> dict[str, Any]:
    """A ``first_requests`` block as ``Recording.first_requests()`` writes it."""
    dropped = fails.pop("dropped", 0)
    c = counters(len(ok_ms), fails, dropped=dropped)
    return {"n": len(ok_ms), "latency_hdr": hdr_ms(ok_ms), **c, "failed_total": sum(fails.values())}


def test_cold_start_fails_a_server_that_fails_its_first_requests() -> None:
    # the first 100 sent: 90 answered as fast as the warm ones, 10 answered 503 — the old
    # check saw 90 "first" ok latencies (>= min_first 20) at 1.0x and passed
    sc = cold_result(first_block([20.0] * 90, http_503=10))
    c = run("cold_start.first_p99_ratio", sc, steady_stage="steady")
    failed(c)
    assert c.value == math.inf and c.n == 100
    assert "10 of the first 100" in c.detail and "successful-only p99 20 ms" in c.detail
    c = run("cold_start.first_error_rate", sc)
    failed(c)
    assert c.value == pytest.approx(0.10) and c.n == 100 and "http_503 10" in c.detail
    # dropped first requests count too
    failed(run("cold_start.first_error_rate", cold_result(first_block([20.0] * 95, dropped=5))))


def test_cold_start_one_failure_shifts_the_first_p99_without_failing_it() -> None:
    # 1 failure in the first 100: judged at their 5th slowest (rank 96), it ranks above
    # every success, so the rank lands one answer lower — on the slowest of 4 slow ones
    sc = cold_result(first_block([20.0] * 95 + [400.0] * 4, timeout=1))
    c = run("cold_start.first_p99_ratio", sc)
    failed(c)  # 400 ms vs 20 ms warm: 20x
    assert c.value == pytest.approx(20, rel=0.01)
    passed(run("cold_start.first_error_rate", sc))  # 1 % is within the budget
    # without the failure the same 4 slow answers are not 5: a warm answer is judged
    passed(run("cold_start.first_p99_ratio", cold_result(first_block([20.0] * 96 + [400.0] * 4))))
    ok = cold_result(first_block([20.0] * 99, timeout=1))
    passed(run("cold_start.first_p99_ratio", ok))


def test_first_error_rate_passes_a_clean_start_and_skips_without_evidence() -> None:
    c = run("cold_start.first_error_rate", cold_result(first_block([20.0] * 100)))
    passed(c)
    assert c.value == 0 and c.n == 100
    skipped(run("cold_start.first_error_rate", cold_result(None)), "no first-request")  # type: ignore[arg-type]
    few = cold_result(first_block([20.0] * 5, http_503=2))
    skipped(run("cold_start.first_error_rate", few), "only 7")
    # a results document from before failures were counted: not judged, never a pass
    old = cold_result({"n": 100, "latency_hdr": hdr_ms([20.0] * 100)})
    skipped(run("cold_start.first_error_rate", old), "older harness")
    assert REGISTRY["cold_start.first_error_rate"].defaults["threshold"] == 0.01


# --- drift beyond tolerance is a wrong answer -------------------------------------------------


def test_integrity_fails_drift_unless_the_model_is_declared_nondeterministic() -> None:
    integ = {
        "checked": 3_000,
        "ok": 2_995,
        "drift": 5,
        "cross_wired": 0,
        "id_mismatch": 0,
        "tolerance": 1e-4,
        "examples": [
            {
                "kind": "drift",
                "sent_input": 7,
                "matched_input": 7,
                "distance": 0.25,
                "request_id": "r1",
            },
        ],
    }
    c = run("integrity.mismatches", result(integrity=integ))
    failed(c)  # the old default (count_drift = false) passed this
    assert c.value == 5 and "5 drifted beyond tolerance" in c.detail
    assert "its own output off by 0.25" in c.detail and "nondeterministic = true" in c.detail
    c = run("integrity.mismatches", result(integrity=integ), nondeterministic=True)
    passed(c)
    assert c.value == 0 and "5 drifted" in c.detail
    # a cross-wired answer fails a nondeterministic model all the same
    bad = {**integ, "cross_wired": 1}
    failed(run("integrity.mismatches", result(integrity=bad), nondeterministic=True))
    # the old switch is gone: a checklist still using it is told so, not silently ignored
    with pytest.raises(ConfigError, match="count_drift"):
        resolve_params("integrity.mismatches", {"count_drift": True})


# --- the reference server's cold-errors fault (the detection case for first_error_rate) ----


def test_cold_errors_fault_refuses_only_the_first_n_inference_requests() -> None:
    assert parse_faults(["cold-errors"]).names() == ["cold-errors:10"]
    with pytest.raises(ServerConfigError, match="cold-errors:N_REQUESTS"):
        parse_faults(["cold-errors:0"])
    config = dataclasses.replace(SIM, faults=parse_faults(["cold-errors:3"]))
    with server_client(config) as c:
        assert c.get("/v2/health/ready").status_code == 200  # ready, yet:
        body = infer_body([[float(i) for i in range(16)]])
        statuses = [c.post("/v2/models/sim/infer", content=body).status_code for _ in range(6)]
        assert statuses == [503, 503, 503, 200, 200, 200]
        assert "cold-errors:3" in c.get("/v2").json()["faults"]
