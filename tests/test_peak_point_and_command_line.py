"""One peak point (its scenario and how its judged run is classified), the guard that
stops a server when the harness is killed, and bad input before any load."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.peak.config import PeakConfig

# --- the guard and the command line ------------------------------------------------------


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_guard_stops_the_server_when_the_harness_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    guard = subprocess.Popen(
        [sys.executable, "-m", "harness.sut.guard", str(parent.pid), str(server.pid)]
    )
    try:
        time.sleep(1.0)
        assert not _gone(server.pid)  # the parent lives: the server is left alone
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        server.wait(timeout=10)
        assert server.returncode == -signal.SIGTERM
        guard.wait(timeout=15)
    finally:
        for p in (parent, server, guard):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize(
    "argv",
    [
        ["peak", "--slo-p99-ms", "0"],
        ["peak", "--slo-p99-ms", "100", "--confidence", "1.5"],
        ["peak", "--slo-p99-ms", "100", "--repeats", "0"],
        ["peak", "--slo-p99-ms", "100", "--sut-pid", "1"],
        ["peak", "--slo-p99-ms", "100", "--target", "localhost:8000"],
        ["peak", "--slo-p99-ms", "100", "--sut-cmd", "python -m harness_reference_server"],
        ["peak", "--slo-p99-ms", "100", "--searches", "3", "--precision", "0.1"],
        ["peak", "--slo-p99-ms", "100", "--searches", "0"],
        ["tune", "--sut-cmd", "x --port {port} {a}", "--space", "b=1", "--slo-p99-ms", "1"],
        [
            "tune",
            "--sut-cmd",
            "x --port {port} {a}",
            "--space",
            "a=1,2",
            "--default",
            "a=3",
            "--slo-p99-ms",
            "1",
        ],
        [
            "tune",
            "--sut-cmd",
            "x --port {port} {a}",
            "--space",
            "a=1,2",
            "--append-for",
            "a=1",
            "--slo-p99-ms",
            "1",
        ],
        ["tune", "--sut-cmd", "x --port {port} {a}", "--space", "a=1,2"],
        # in tokens: a whole-request p99 is the wrong SLO, token SLOs need the protocol
        ["peak", "--protocol", "openai", "--slo-p99-ms", "100"],
        ["peak", "--slo-ttft-ms", "500"],
        ["peak", "--protocol", "openai", "--slo-tpot-ms", "0"],
    ],
)
def test_bad_input_exits_2_in_one_line_before_load(argv, tmp_path, capsys) -> None:
    from harness.cli import main

    try:
        code = main([*argv, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # argparse's own errors (our parser: one line, exit 2)
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "error" in err
    assert not (tmp_path / "o" / "points").exists()  # nothing was measured


# --- one point: its scenario and its classification -------------------------------------


def test_point_scenario_is_a_warmup_then_a_judged_open_loop_stage(tmp_path) -> None:
    from harness.load.scenario import load_scenario
    from harness.peak.config import point_scenario

    cfg = PeakConfig(slo_p99_ms=80.0, confidence=0.99, max_error_rate=0.02, warmup_s=2.0)
    path = tmp_path / "p.toml"
    path.write_text(point_scenario(cfg, 150.0, cfg.point_seconds(150.0)))
    sc = load_scenario(str(path), "quick")
    assert [s.name for s in sc.stages] == ["warmup", "point"]
    assert sc.stages[1].duration_s == pytest.approx(2144 / 150.0, abs=0.01)
    assert sc.stages[0].rate.value == sc.stages[1].rate.value == 150.0
    assert sc.load.mode == "open" and sc.load.arrival == "poisson"
    checks = dict(sc.checks)
    assert checks["steady.p99_ms"] == {"stage": "point", "threshold": 80, "confidence": 0.99}
    assert checks["steady.error_rate"]["threshold"] == 0.02
    path.write_text(point_scenario(cfg, None, 5.0))
    assert load_scenario(str(path), "quick").stages[1].rate.relative  # "0.5x": it calibrates
    assert cfg.point_seconds(10.0) == cfg.max_point_s  # a slow rate is capped
    assert cfg.point_seconds(10000.0) == cfg.min_point_s
    assert cfg.point_seconds(150.0, longer=True) == pytest.approx(2 * 2144 / 150.0, abs=0.01)


def _sc(checks, validity=(), **extra):
    from harness.results import hdr

    h = hdr.new_histogram()
    for v in range(1, 1001):
        h.record_value(v * 50)  # 0.05 .. 50 ms
    return {
        "name": "peak_point",
        "stages": [{"name": "point", "start_s": 3.0, "end_s": 13.0, "rate_rps": 100.0}],
        "by_stage": {
            "point": {
                "default": {
                    "counters": {
                        "scheduled": 1000,
                        "ok": 1000,
                        "dropped": 0,
                        "in_flight": 0,
                        "failed": {},
                    },
                    "latency_hdr": hdr.encode(h),
                }
            }
        },
        "checks": [
            {"id": i, "passed": p, "skipped": s, "detail": f"{i} detail"} for i, p, s in checks
        ],
        "validity": list(validity),
        **extra,
    }


def test_classify_reads_the_runs_own_judgement() -> None:
    from harness.peak.point import classify

    cfg = PeakConfig(slo_p99_ms=40.0)
    ok = [("steady.p99_ms", True, None), ("steady.error_rate", True, None)]
    p = classify(_sc(ok), cfg)
    assert p.outcome == "met" and p.rate_rps == 100.0 and p.n == 1000
    assert p.achieved_rps == pytest.approx(100.0)
    assert p.goodput_rps == pytest.approx(80.0, abs=0.5)  # 800 of 1000 within 40 ms
    assert p.p99_ms == pytest.approx(49.5, abs=0.2)
    miss = [("steady.p99_ms", False, None), ("steady.error_rate", True, None)]
    assert classify(_sc(miss), cfg).outcome == "missed"
    short = [("steady.p99_ms", None, "insufficient samples"), ("steady.error_rate", True, None)]
    q = classify(_sc(short), cfg)
    assert q.outcome == "insufficient" and "insufficient samples" in q.reasons
    bad = classify(_sc(ok, validity=["dispatch lag p99 30 ms > 10 ms"]), cfg)
    assert bad.outcome == "invalid" and "dispatch lag" in bad.reasons[0]
    died = classify(_sc(ok, sut_exit={"cause": "exit 1"}), cfg)
    assert died.outcome == "missed"  # a server that died did not sustain the rate


def test_a_point_in_tokens_is_judged_by_ttft_tpot_and_whole_answers(tmp_path) -> None:
    """Against an OpenAI-compatible server a point is a token-streaming run judged by
    llm.ttft_p99 and llm.tpot_p99 at the SLOs and llm.goodput at 1 - the error limit; its
    curve is TTFT (p99 a failure when more than 1 % of the streams failed) and TPOT."""
    from harness.load.scenario import load_scenario
    from harness.peak.config import point_scenario
    from harness.peak.point import classify

    cfg = PeakConfig(slo_p99_ms=500.0, slo_tpot_ms=30.0, max_error_rate=0.02, warmup_s=2.0)
    assert cfg.in_tokens and cfg.slo_text() == "TTFT p99 <= 500 ms and TPOT p99 <= 30 ms"
    path = tmp_path / "p.toml"
    path.write_text(point_scenario(cfg, 4.0, 30.0))
    sc = load_scenario(str(path), "quick")
    assert sc.load.protocol == "openai" and sc.load.mode == "open"
    assert [s.name for s in sc.stages] == ["warmup", "point"]
    checks = dict(sc.checks)
    assert checks["llm.ttft_p99"] == {"stage": "point", "threshold": 500}
    assert checks["llm.tpot_p99"] == {"stage": "point", "threshold": 30}
    assert checks["llm.goodput"] == {"stage": "point", "threshold": 0.98}
    assert "steady.p99_ms" not in checks
    # the first point of a search without --start-rps: half of a probe of the same streams
    path.write_text(point_scenario(cfg, None, 30.0))
    first = load_scenario(str(path), "quick")
    assert first.load.calibrate and first.needs_capacity
    assert [str(s.rate) for s in first.stages] == ["0.5x", "0.5x"]

    def result(verdicts, failed=0):
        cell = {
            "requests": 120,
            "ok": 120 - failed,
            "failed": failed,
            "dropped": 0,
            "conforming": 120 - failed,
            "ttft_ms": {"count": 120 - failed, "p50_ms": 90.0, "p99_ms": 310.0},
            "tpot_ms": {"count": 120 - failed, "p50_ms": 20.0, "p99_ms": 24.0},
        }
        return {
            **_sc([(i, v, None) for i, v in verdicts]),
            "tokens": {"by_stage": {"classes": {"point": cell}}},
        }

    judged = ("llm.ttft_p99", "llm.tpot_p99", "llm.goodput")
    p = classify(result([(i, True) for i in judged]), cfg)
    assert p.outcome == "met" and (p.p50_ms, p.p99_ms, p.tpot_p99_ms) == (90.0, 310.0, 24.0)
    assert p.error_rate == 0.0 and p.goodput_rps == pytest.approx(12.0)  # 120 in 10 s
    slow = [("llm.ttft_p99", True), ("llm.tpot_p99", False), ("llm.goodput", True)]
    assert classify(result(slow), cfg).outcome == "missed"
    # the V2 checks passing decide nothing in tokens
    v2 = [("steady.p99_ms", True), ("steady.error_rate", True)]
    assert classify(result(v2), cfg).outcome == "insufficient"
    failing = classify(result([(i, False) for i in judged], failed=6), cfg)
    assert failing.outcome == "missed" and math.isinf(failing.p99_ms)
    assert failing.error_rate == pytest.approx(6 / 120)
