"""No PASS without evidence, for the overload checks.

The chaos must have happened (a validity rule) and the contention checks judge
the hog intervals that really ran. Recovery needs both p99 and the error rate
back in band, and is "not exercised" (skipped) when the event disturbed neither.
Fail-fast's timing bound is a sound upper bound over the judged window.

Each test here reproduces a false PASS (or a misleading verdict) of the old code
on a synthetic scenario result; the new analysis APIs are imported inside the tests so
this file still imports against the old code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from harness.checks import judge_scenario, validity
from harness.testing.checks import (
    counters,
    failed,
    hdr,
    hog_record,
    passed,
    result,
    row,
    run,
    skipped,
    spike_result,
)
from harness.testing.results import stage

BLOCKS = [
    {"kind": "baseline", "stage": "baseline_1", "start_s": 0, "end_s": 20},
    {"kind": "hog", "stage": "hog_1", "start_s": 20, "end_s": 40},
    {"kind": "after", "stage": "after", "start_s": 40, "end_s": 60},
]
CONTENTION_CHECKS = {
    "contention.throughput_ratio": {},
    "contention.fail_fast": {},
    "contention.recovery_s": {},
}


def contention_run(chaos: list[dict[str, Any]], rows: list[dict[str, Any]] | None = None):
    """A contention result whose windows look the same in every block (default): what a
    server shows when the hog never took its CPU."""
    rows = rows or [row(t, 10.0, ok=100) for t in range(60)]
    ok = sum(r["ok"] for r in rows)
    c = counters(ok)
    return result(
        contention={"blocks": [dict(b) for b in BLOCKS], "warmup_s": 0.0},
        windows={"width_s": 1.0, "rows": rows},
        check_config=dict(CONTENTION_CHECKS),
        counters=c,
        chaos=chaos,
    )


def failed_hog() -> dict[str, Any]:
    return hog_record(
        20.0,
        20.0,
        ok=False,
        error="apply: OSError: [Errno 22] Invalid argument",
        detail={},
    )


# --- the chaos never happened ----------------------------------------------------------


def test_a_hog_that_failed_makes_the_run_invalid_not_a_pass() -> None:
    sc = contention_run([failed_hog()])
    # old code: ratio 1.0 >= 0.4 passed and recovery passed with 0 s, run valid
    reasons = validity(sc)
    assert any("did not apply" in r and "OSError" in r for r in reasons), reasons
    skipped(run("contention.throughput_ratio", sc), "no CPU hog ran")
    skipped(run("contention.recovery_s", sc), "no CPU hog ran")
    skipped(run("contention.fail_fast", sc), "no CPU hog ran")
    assert judge_scenario(sc)["verdict"] == "invalid"


def test_a_hog_skipped_for_want_of_a_sut_makes_the_run_invalid() -> None:
    # what the controller records when there is no SUT process to act on
    rec = {
        "action": "cpu_hog",
        "params": {"cores": "sut", "pin": "sut", "duration_s": 20.0},
        "start_s": 20.0,
        "end_s": None,
        "ok": False,
        "error": "no SUT process to act on: pass --sut-pid or --sut-cmd",
    }
    reasons = validity(contention_run([rec]))
    assert len(reasons) == 1 and "no SUT process to act on" in reasons[0], reasons


def test_a_hog_block_without_any_record_makes_the_run_invalid() -> None:
    reasons = validity(contention_run([]))
    assert any("hog block 'hog_1'" in r and "no cpu_hog record" in r for r in reasons), reasons
    # a block the run never reached (it ended first) is not asked for
    sc = contention_run([])
    sc["duration_s"] = 15.0
    assert not any("hog_1" in r for r in validity(sc))


def test_a_hog_that_got_no_cpu_is_not_evidence() -> None:
    starved = hog_record(20.0, 40.0)
    starved["detail"]["hog_cpu_s"] = [0.4]  # 2 % of 20 s x 1 core
    reasons = validity(contention_run([starved]))
    assert any("0.4 CPU-s" in r and "2% < 25%" in r for r in reasons), reasons
    gone = hog_record(20.0, 40.0)
    gone["detail"]["hog_cpu_s"] = [None]  # exited before the end
    assert any("no CPU time" in r for r in validity(contention_run([gone])))
    assert validity(contention_run([hog_record(20.0, 40.0)])) == []


def test_hogs_on_the_wrong_cores_or_too_few_are_not_evidence() -> None:
    few = hog_record(20.0, 40.0, cores=2)
    few["detail"]["pids"] = [901]
    assert any("1 hog process(es) for 2 core(s)" in r for r in validity(contention_run([few])))
    wrong = hog_record(20.0, 40.0)
    wrong["detail"]["cores_used"] = [0]
    assert any("instead of [1]" in r for r in validity(contention_run([wrong])))
    unpinned = hog_record(20.0, 40.0)
    unpinned["detail"]["affinity"] = [[0, 1]]
    assert any("affinity" in r for r in validity(contention_run([unpinned])))


def test_contention_judges_the_hog_interval_that_ran_not_the_plan() -> None:
    # The hog died 8 s into its 20 s block: throughput fell only while it ran.
    rows = [row(t, 10.0 if not 20 <= t < 28 else 40.0, ok=30 if 20 <= t < 28 else 100)
            for t in range(60)]  # fmt: skip
    sc = contention_run([hog_record(20.0, 28.0)], rows)
    # old code: the plan's windows 23–39 have a median of 100 req/s: 1.0x, a pass
    c = run("contention.throughput_ratio", sc)
    failed(c)
    assert c.value == pytest.approx(0.3)
    # and the run is invalid: the hog did not hold for its block
    assert any("ran 20–28 s, not within 1 s of its plan 20–40 s" in r for r in validity(sc))


def test_a_pause_the_kernel_never_showed_is_not_evidence() -> None:
    def pause(**detail: Any) -> dict[str, Any]:
        return {
            "action": "pause",
            "params": {"duration_s": 5.0},
            "at_s": 25.0,
            "start_s": 25.0,
            "end_s": 30.0,
            "ok": True,
            "error": None,
            "detail": {"pids": [4242, 4243], **detail},
        }

    sc = spike_result(33, chaos=[pause(stopped=[4242])])  # a child kept running
    assert any("[4243] not seen stopped" in r for r in validity(sc))
    sc = spike_result(33, chaos=[pause()])  # no observation recorded: no evidence
    assert any("[4242, 4243] not seen stopped" in r for r in validity(sc))
    ok = pause(stopped=[4242, 4243], still_stopped=[4242, 4243])
    assert validity(spike_result(33, chaos=[ok])) == []
    late = dict(ok, start_s=27.5)
    assert any(
        "not within 1 s of its plan 25–30 s" in r for r in validity(spike_result(33, chaos=[late]))
    )


def test_a_kill_that_found_no_process_is_not_evidence() -> None:
    rec = {
        "action": "kill",
        "params": {"restart": True, "signal": "SIGKILL", "duration_s": 0.0},
        "at_s": 25.0,
        "start_s": 25.0,
        "end_s": 27.1,  # restart + ready: late by design
        "ok": True,
        "error": None,
        "detail": {"old_pid": 4242, "found": False, "gone": True},
    }
    assert any(
        "found no running process 4242" in r for r in validity(spike_result(33, chaos=[rec]))
    )
    rec["detail"] = {
        "old_pid": 4242, "found": True, "gone": True, "new_pid": 4300, "time_to_ready_s": 1.9
    }  # fmt: skip
    assert validity(spike_result(33, chaos=[rec])) == []


def test_pause_and_kill_record_what_the_kernel_showed() -> None:
    from harness.chaos import KillRestart, Pause
    from harness.sut import attach

    sut = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        pause = Pause(attach(sut.pid), duration_s=0.2)
        pause.apply()
        time.sleep(0.05)
        pause.revert()
        assert pause.detail["stopped"] == [sut.pid]
        assert pause.detail["still_stopped"] == [sut.pid]
        kill = KillRestart(attach(sut.pid), restart=False)
        kill.apply()
        assert kill.detail["found"] is True and kill.detail["gone"] is True
    finally:
        sut.kill()
        sut.wait()

    class Gone:  # a target whose process has exited (and was reaped)
        pid = sut.pid
        can_restart = False

        def kill(self) -> None:
            pass

    late = KillRestart(Gone(), restart=False)
    late.apply()
    assert late.detail["found"] is False


@pytest.mark.slow
def test_a_real_hog_records_its_cpu_and_affinity() -> None:
    from harness.analysis.chaos_evidence import MIN_HOG_CPU_FRACTION
    from harness.chaos import CpuHog

    core = sorted(os.sched_getaffinity(0))[-1]
    hog = CpuHog(cores=1, duration_s=1.0, pin=[core])
    t0 = time.monotonic()
    hog.apply()
    time.sleep(1.0)
    hog.revert()
    ran = time.monotonic() - t0
    assert hog.detail["affinity"] == [[core]]
    (cpu,) = hog.detail["hog_cpu_s"]
    assert cpu >= MIN_HOG_CPU_FRACTION * ran, (cpu, ran)


# --- recovery was never exercised -------------------------------------------------------


def test_recovery_that_was_never_exercised_is_skipped() -> None:
    # the spike left p99 and the error rate inside their bands: old code passed with 0 s
    skipped(run("spike.recovery_s", spike_result(20)), "not exercised")
    # the same for hogs that did not disturb the server (a valid hog, a strong server)
    c = run("contention.recovery_s", contention_run([hog_record(20.0, 40.0)]))
    skipped(c, "not exercised", "CPU hogs")


def test_fast_503s_after_the_spike_are_not_recovery() -> None:
    # p99 is back at once, but the server keeps refusing 60 % of requests with fast 503s
    sc = spike_result(30)
    for r in sc["windows"]["rows"]:
        if r["t"] >= 20:
            r["ok"], r["errors"] = 40, {"http_503": 60}
    # old code: p99 in band -> passed with 0 s
    c = run("spike.recovery_s", sc)
    failed(c)
    assert c.value is None and "error rate 60.0%" in c.detail
    # when the refusals stop 8 s after the spike, that is the recovery time
    for r in sc["windows"]["rows"]:
        if r["t"] >= 38:
            r["ok"], r["errors"] = 100, {}
    c = run("spike.recovery_s", sc)
    passed(c)
    assert c.value == pytest.approx(8.0, abs=1.01)


def test_a_spike_that_only_raised_errors_was_exercised() -> None:
    sc = spike_result(20)  # p99 never left the band ...
    for r in sc["windows"]["rows"]:
        if 20 <= r["t"] < 30:
            r["ok"], r["errors"] = 50, {"http_503": 50}  # ... but the spike was shed
    c = run("spike.recovery_s", sc)
    passed(c)
    assert c.value <= 1.0 and "peak p99" in c.detail


def test_error_band_has_a_floor_and_tracks_the_baseline() -> None:
    from harness.analysis.recovery import baseline_error_rate, error_rate_band, error_rates

    assert error_rate_band(0.0) == pytest.approx(0.01)  # healthy: no errors + 1 %
    assert error_rate_band(0.05) == pytest.approx(0.10)  # x2 of a noisy baseline
    assert error_rates([99, 0, 50], [1, 0, 50]) == [0.01, None, 0.5]
    # pooled over the baseline windows, not a median of mostly-zero windows
    assert baseline_error_rate([0, 1, 2, 3], [100] * 4, [0, 0, 4, 0], [(0, 3)]) == pytest.approx(
        4 / 304
    )


def test_recovery_time_needs_both_series_in_band() -> None:
    from harness.analysis.recovery import recovery_time

    t = [float(i) for i in range(20)]
    p99 = [5.0] * 20
    err = [0.0] * 5 + [0.5] * 10 + [0.0] * 5
    r = recovery_time(
        t, p99, 10.0, 5.0, factor=2.0, hold_s=3.0, error_rate=err, error_band=0.01,
        event_start_s=5.0,
    )  # fmt: skip
    assert r.recovery_s == pytest.approx(5.0) and r.disturbed is True
    assert r.peak_error == 0.5 and r.worst_error_after == 0.5
    # p99 alone says "recovered at once"
    assert recovery_time(t, p99, 10.0, 5.0, hold_s=3.0).recovery_s == 0.0
    calm = recovery_time(
        t, p99, 10.0, 5.0, hold_s=3.0, error_rate=[0.0] * 20, error_band=0.01, event_start_s=5.0
    )
    assert calm.disturbed is False
    # a gap in the windows after the event's start is silence, not health
    gap = recovery_time(
        t[:8] + t[10:], p99[:18], 12.0, 5.0, hold_s=3.0, error_rate=[0.0] * 18,
        error_band=0.01, event_start_s=5.0,
    )  # fmt: skip
    assert gap.disturbed is True


# --- fail-fast's timing bound ------------------------------------------------------------


def fail_fast_spike(window_errors: dict[str, int], failure_times_us: list[float]):
    """A spike whose requests sent in 20–35 s failed with ``window_errors`` per window
    (15 windows); the run's failure histogram holds ``failure_times_us``."""
    sc = spike_result(33)
    for r in sc["windows"]["rows"]:
        if 20 <= r["t"] < 35:
            r["errors"] = dict(window_errors)
    sc["error_latency_hdr"] = hdr(failure_times_us)
    return sc


def test_fail_fast_is_not_passed_by_fast_failures_of_another_kind() -> None:
    # 150 503s that each waited 3 s in a queue; 300 instant 500s elsewhere in the run.
    # Old code: the 75th fastest failure (1 ms) "bounds" the 503 median -> pass.
    sc = fail_fast_spike({"http_503": 10}, [3_000_000] * 150 + [1000] * 300)
    sc["counters"] = counters(5000, {"http_503": 150, "http_500": 300})
    c = run("spike.fail_fast", sc)
    assert c.passed is not True, c.detail
    skipped(c, "cannot be shown quick", "between 1 and 3,000 ms")


def test_fail_fast_judges_the_window_not_the_whole_run() -> None:
    # The spike's 150 503s were slow (3 s); 1000 quick 503s came at another time.
    # Old code used the whole run's 1150 503s: rank 575 of the histogram = 2 ms -> pass.
    sc = fail_fast_spike({"http_503": 10}, [3_000_000] * 150 + [2000] * 1000)
    sc["counters"] = counters(5000, {"http_503": 1150})
    c = run("spike.fail_fast", sc)
    assert c.passed is not True, c.detail
    assert c.n == 150  # the window's failures, not the run's


def test_fail_fast_still_passes_and_fails_when_the_histogram_can_tell() -> None:
    # quick 503s with a few timeouts: the upper bound is a 503 time -> a sound pass
    sc = fail_fast_spike({"http_503": 20, "timeout": 1}, [2000] * 300 + [5_000_000] * 15)
    c = run("spike.fail_fast", sc)
    passed(c)
    assert "median 503/429 time 2 ms (<= 1,000 ms)" in c.detail
    # all 503s slow: the lower bound is above the limit -> a sound fail
    sc = fail_fast_spike({"http_503": 20, "timeout": 1}, [3_000_000] * 300 + [5_000_000] * 15)
    c = run("spike.fail_fast", sc)
    failed(c)
    assert "> 1,000 ms" in c.detail


def test_fail_fast_without_a_failure_histogram_is_not_a_pass() -> None:
    sc = fail_fast_spike({"http_503": 20}, [])
    sc["error_latency_hdr"] = None
    skipped(run("spike.fail_fast", sc), "no failure-time histogram")


def test_upper_bound_inequality_holds_for_every_split() -> None:
    """m <= x_(N - floor(q/2)) and x_(ceil(q/2)) <= m, whichever q of N failures are the
    rejections (exhaustive over small cases, exact values)."""
    import itertools

    from hdrh.histogram import HdrHistogram

    from harness.analysis.contention import quick_rejection_bounds_ms

    times = [1000, 2000, 2000, 3000, 5000, 8000, 13000]
    h = HdrHistogram(1, 60_000_000, 3)
    for v in times:
        h.record_value(v)
    for q in range(1, len(times) + 1):
        b = quick_rejection_bounds_ms(h, q)  # knows q, not which failures they were
        for chosen in itertools.combinations(range(len(times)), q):
            rej = sorted(times[i] for i in chosen)
            median = rej[(q + 1) // 2 - 1] / 1000.0  # the ceil(q/2)-th fastest
            assert b.low_ms <= median <= b.high_ms, (q, chosen, b)


def test_chaos_evidence_asks_nothing_of_a_run_without_chaos() -> None:
    # a scenario without chaos gains no reason
    sc = spike_result(33, counters=counters(6000), check_config={"spike.recovery_s": {}})
    assert judge_scenario(sc)["validity"] == []
    # and the stage plan alone (no contention) asks for no record
    assert validity(result(stages=[stage("s", 0, 10)])) == []
