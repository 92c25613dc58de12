"""Freeze, crash-restart and rolling shutdown — the actions against real
processes (pause with its undo guard, terminate), the evidence rule, the bands, and the
checks on hand-built results whose numbers say what each check must conclude."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.chaos_evidence import chaos_not_applied
from harness.analysis.resilience import Span, event_bands, resource_steps, spans
from harness.chaos.base import proc_state
from harness.chaos.guard import ContGuard
from harness.chaos.pause import Pause
from harness.chaos.terminate import Terminate, sigterm_ignored
from harness.checks import REGISTRY, resolve_params
from harness.errors import ConfigError
from harness.load.scenario import load_scenario
from harness.testing.results import hdr

REPO = Path(__file__).resolve().parents[1]


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _wait_state(pid: int, want: set[str | None], timeout_s: float = 5.0) -> str | None:
    deadline = time.monotonic() + timeout_s
    while (s := proc_state(pid)) not in want and time.monotonic() < deadline:
        time.sleep(0.01)
    return s


class _Target:
    """A ChaosTarget over one process."""

    can_restart = False

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        return [self.proc.pid]


# -- the undo guard ---------------------------------------------------------------------


def test_guard_continues_a_paused_process_when_its_owner_is_sigkilled() -> None:
    """The owner (a stand-in for the harness) arms a guard, stops the target and dies by
    SIGKILL — no handler, no atexit runs; the kernel's pipe EOF makes the guard continue
    the target."""
    target = _sleeper()
    owner_code = textwrap.dedent(
        f"""
        import os, signal, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from harness.chaos.guard import ContGuard
        g = ContGuard([{target.pid}]).start()
        os.kill({target.pid}, signal.SIGSTOP)
        print(g.pid, flush=True)
        time.sleep(60)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        guard_pid = int(owner.stdout.readline())
        assert _wait_state(target.pid, {"T", "t"}) in ("T", "t")
        owner.kill()
        owner.wait(5)
        assert _wait_state(target.pid, {"S", "R"}) in ("S", "R")
        assert _wait_state(guard_pid, {None, "Z"}) in (None, "Z")  # the guard is gone too
    finally:
        owner.kill()
        target.kill()
        target.wait(5)


def test_guard_leaves_alone_a_pid_it_was_not_given() -> None:
    """A pid whose start time no longer matches (the process exited, the pid reused) is
    not signalled: the guard remembers (pid, start ticks)."""
    target = _sleeper()
    try:
        g = ContGuard([target.pid])
        g.targets = [(target.pid, g.targets[0][1] + 1)]  # as if another process had the pid
        g.start()
        os.kill(target.pid, signal.SIGSTOP)
        assert _wait_state(target.pid, {"T", "t"}) in ("T", "t")
        g.close()
        time.sleep(0.2)
        assert proc_state(target.pid) in ("T", "t")
    finally:
        os.kill(target.pid, signal.SIGCONT)
        target.kill()
        target.wait(5)


def test_pause_arms_the_guard_and_undoes_everything() -> None:
    target = _sleeper()
    try:
        p = Pause(_Target(target), 1.0)
        p.apply()
        guard = p.detail["guard_pid"]
        assert proc_state(target.pid) in ("T", "t") and proc_state(guard) not in (None, "Z")
        assert p.detail["stopped"] == [target.pid]
        p.revert()
        assert p.detail["still_stopped"] == [target.pid]
        assert _wait_state(target.pid, {"S", "R"}) in ("S", "R")
        assert _wait_state(guard, {None, "Z"}) in (None, "Z")
        rec = {"action": "pause", "ok": True, "start_s": 0.0, "end_s": 1.0,
               "params": {"duration_s": 1.0}, "detail": p.detail}  # fmt: skip
        assert chaos_not_applied({"chaos": [rec]}) == []
    finally:
        target.kill()
        target.wait(5)


# -- terminate --------------------------------------------------------------------------

DRAINING = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.2), sys.exit(0)))
    time.sleep(60)
    """
)
IGNORING = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
CRASHING = textwrap.dedent(
    """
    import os, signal, time
    signal.signal(signal.SIGTERM, lambda *a: os._exit(3))
    time.sleep(60)
    """
)


def _sut(tmp_path: Path, code: str):
    from harness.sut import SutProcess

    script = tmp_path / "srv.py"
    script.write_text(code)
    sut = SutProcess([sys.executable, str(script)]).start()
    time.sleep(0.3)  # let it install its handler
    return sut


def test_terminate_times_a_clean_exit(tmp_path: Path) -> None:
    sut = _sut(tmp_path, DRAINING)
    try:
        t = Terminate(sut, 0.0, drain_timeout_s=5.0, restart=False)
        t.apply()
        t.revert()
        d = t.detail
        assert d["found"] is True and d["ignored"] is False and d["gone"] is True
        assert d["exit_code"] == 0 and d["killed"] is False
        assert 0.2 <= d["exit_s"] < 5.0
        # it never answered ready on its port: "unready" from the first probe
        assert d["unready_s"] is not None and d["unready_s"] <= d["exit_s"]
    finally:
        sut.stop()


def test_terminate_kills_at_the_drain_timeout_and_records_the_exit_code(
    tmp_path: Path,
) -> None:
    sut = _sut(tmp_path, IGNORING)
    try:
        assert sigterm_ignored(sut.pid) is True
        t = Terminate(sut, 0.0, drain_timeout_s=0.5, restart=False)
        t.apply()
        assert t.detail["ignored"] is True and t.detail["killed"] is True
        assert t.detail["exit_s"] is None and t.detail["gone"] is True
        rec = {"action": "terminate", "ok": True, "start_s": 0.0, "end_s": 0.6,
               "at_s": 0.0, "params": t.params, "detail": t.detail}  # fmt: skip
        (reason,) = chaos_not_applied({"chaos": [rec]})
        assert "SIG_IGN" in reason  # the signal asked nothing of it: invalid, not a fail
    finally:
        sut.stop()
    sut = _sut(tmp_path, CRASHING)
    try:
        t = Terminate(sut, 0.0, drain_timeout_s=5.0, restart=False)
        t.apply()
        assert t.detail["exit_code"] == 3 and t.detail["killed"] is False
    finally:
        sut.stop()


def test_terminate_params_are_checked_before_the_run() -> None:
    from harness.sut import attach

    with pytest.raises(ConfigError, match="cannot restart it"):
        Terminate.for_target(attach(os.getpid()), {"restart": True})
    with pytest.raises(ConfigError, match="drain_timeout_s"):
        Terminate.for_target(attach(os.getpid()), {"restart": False, "drain_timeout_s": 0})


def test_terminate_evidence() -> None:
    base = {"action": "terminate", "ok": True, "at_s": 10.0, "start_s": 10.0, "end_s": 12.0,
            "params": {"restart": True, "drain_timeout_s": 30.0, "duration_s": 0.0}}  # fmt: skip
    good = {"found": True, "ignored": False, "unready_s": 0.05, "exit_s": 0.3, "exit_code": 0,
            "killed": False, "gone": True, "new_pid": 2, "time_to_ready_s": 1.2}  # fmt: skip
    assert chaos_not_applied({"chaos": [{**base, "detail": good}]}) == []
    # drained (unready) but never exited: evidence of a defect, not an invalid run
    hung = {**good, "exit_s": None, "exit_code": None, "killed": True}
    assert chaos_not_applied({"chaos": [{**base, "detail": hung}]}) == []
    silent = {**hung, "unready_s": None}
    (why,) = chaos_not_applied({"chaos": [{**base, "detail": silent}]})
    assert "no sign it got the signal" in why
    (why,) = chaos_not_applied({"chaos": [{**base, "detail": {**good, "found": False}}]})
    assert "nothing to shut down" in why
    (why,) = chaos_not_applied({"chaos": [{**base, "detail": {**good, "new_pid": None}}]})
    assert "no restarted process" in why


def test_scenarios_parse_and_validate_terminate(tmp_path: Path) -> None:
    for name in ("freeze", "crash_restart", "rolling_shutdown"):
        for mode in ("quick", "full"):
            sc = load_scenario(name, mode=mode)
            assert sc.chaos and sc.chaos[0].end_s <= sc.stages[-1].end_s
    roll = load_scenario("rolling_shutdown", mode="quick")
    serving = next(s for s in roll.stages if s.name == "serving")
    assert roll.chaos[0].at_s == serving.end_s  # shutdown.lost needs the stage edge
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[load]\nmode = "open"\ncapacity_rps = 10\n[[stages]]\nname = "a"\nduration_s = 5\n'
        'rate = 1\n[[chaos]]\nat_s = 1\naction = "terminate"\ndrain_timeout_s = -1\n'
    )
    with pytest.raises(ConfigError, match="drain_timeout_s"):
        load_scenario(str(bad))


# -- bands ------------------------------------------------------------------------------


def test_spans_and_bands_keep_event_edges_apart() -> None:
    before, during, after = spans(10.0005, 13.03, 30.0, span_s=5.0)
    assert (before.start_s, during.start_s, after.end_s) == pytest.approx((5.0005, 10.0005, 18.03))
    t = [float(i) for i in range(20)]
    windows = {"t": t, "n": [100] * 20, "ok": [100 if not 10 <= i < 14 else 40 for i in t],
               "p99_ms": [10.0 if not 10 <= i < 14 else 900.0 for i in t]}  # fmt: skip
    server = {"t": t, "rss_bytes": [100 << 20] * 20, "threads": [6] * 14 + [7] * 6,
              "fds": [20] * 20, "socket_fds": [9] * 20}  # fmt: skip
    b, d, a = event_bands(10.0005, 13.03, 30.0, windows, 1.0, server, span_s=5.0)
    # the window starting 0.5 ms before the freeze is during it, not a baseline window
    assert b.p99_max_ms == 10.0 and b.error_rate == 0.0 and b.sent == 500
    assert d.sent == 300 and d.p99_ms == 900.0 and d.error_rate == pytest.approx(0.6)
    assert a.p99_max_ms == 900.0  # window 13 (30 ms of freeze) leads the after span
    assert a.fds == 11.0 and b.threads == 6.0
    steps = {s.name: s.step for s in resource_steps(server, Span("before", 5, 10),
                                                    Span("after", 15, 20))}  # fmt: skip
    assert steps == {"threads": 1.0, "fds": 0.0, "rss_mib": 0.0}


# -- the checks on hand-built results ---------------------------------------------------


def _run(check_id: str, result: dict[str, Any], **overrides: Any):
    spec = REGISTRY[check_id]
    return spec.fn(result, resolve_params(check_id, None, overrides or None))


def _scenario(
    n_s: int,
    *,
    p99=lambda t: 20.0,
    errors=lambda t: {},
    width: float = 1.0,
    chaos: list | None = None,
    stages: list | None = None,
    by_stage: dict | None = None,
    server: dict | None = None,
    rate: int = 100,
) -> dict[str, Any]:
    rows = []
    steps = int(round(n_s / width))
    for i in range(steps):
        t = round(i * width, 6)
        e = errors(t)
        n = int(rate * width)
        rows.append({"t": t, "class": "default", "n": n, "ok": n - sum(e.values()),
                     "errors": e, "p50_ms": 5.0, "p99_ms": p99(t), "max_ms": p99(t)})  # fmt: skip
    return {
        "name": "x",
        "duration_s": float(n_s),
        "stages": stages or [{"name": "all", "start_s": 0.0, "end_s": float(n_s), "warmup_s": 2}],
        "windows": {"width_s": width, "rows": rows},
        "chaos": chaos or [],
        "counters": {"scheduled": 0, "ok": 0, "dropped": 0, "in_flight": 0, "failed": {}},
        "by_stage": by_stage or {},
        "server": {"series": server} if server else None,
    }


def _pause(start=10.0, end=13.0):
    return [{"action": "pause", "ok": True, "at_s": start, "start_s": start, "end_s": end,
             "params": {"duration_s": end - start}, "detail": {}}]  # fmt: skip


def test_freeze_recovery_passes_a_prompt_recovery_and_fails_a_stuck_one() -> None:
    def stall(t):
        return 3000.0 if 10 <= t < 13 else 20.0

    ok = _run("freeze.recovery_s", _scenario(40, p99=stall, chaos=_pause()))
    assert ok.passed is True and ok.value == 0.0
    # stall-trip's shape: one request per batch after the freeze, p99 and 503s stay up
    stuck = _scenario(
        40,
        p99=lambda t: 3000.0 if t >= 10 else 20.0,
        errors=lambda t: {"http_503": 30} if t >= 13 else {},
        chaos=_pause(),
    )
    bad = _run("freeze.recovery_s", stuck)
    assert bad.passed is False and bad.value is None
    none = _run("freeze.recovery_s", _scenario(40))
    assert none.passed is None and "no pause event" in none.skipped


def test_freeze_unanswered_counts_lost_not_refused() -> None:
    refused = _scenario(30, errors=lambda t: {"http_503": 50, "dropped": 20} if 10 <= t < 13
                        else {}, chaos=_pause())  # fmt: skip
    c = _run("freeze.unanswered", refused)
    assert c.passed is True and c.value == 0 and c.n == 240
    lost = _scenario(30, errors=lambda t: {"timeout": 7} if t == 11 else {}, chaos=_pause())
    c = _run("freeze.unanswered", lost)
    assert c.passed is False and c.value == 7 and "held unanswered" in c.detail
    # a keep-alive connection the server timed out at the resume fails at once: reported,
    # not held (the healthy server showed 6 in one run of three)
    closed = _scenario(30, errors=lambda t: {"connection": 6} if t == 11 else {},
                       chaos=_pause())  # fmt: skip
    c = _run("freeze.unanswered", closed)
    assert c.passed is True and c.value == 0 and "6 failed at once" in c.detail


def test_freeze_resource_step_sees_threads_left_behind() -> None:
    t = [float(i) for i in range(40)]

    def series(threads_after: int) -> dict:
        return {"t": t, "rss_bytes": [200 << 20] * 40, "fds": [60] * 40,
                "socket_fds": [49] * 40,
                "threads": [6 if x < 13 else threads_after for x in t]}  # fmt: skip

    ok = _run("freeze.resource_step", _scenario(40, chaos=_pause(), server=series(6)))
    assert ok.passed is True and ok.value == 0
    bad = _run("freeze.resource_step", _scenario(40, chaos=_pause(), server=series(8)))
    assert bad.passed is False and bad.value == 2.0 and "threads 6 → 8" in bad.detail


def _kill(start=12.0, ready=13.5):
    return [{"action": "kill", "ok": True, "at_s": start, "start_s": start, "end_s": ready,
             "params": {"restart": True, "signal": "SIGKILL", "duration_s": 0.0},
             "detail": {"found": True, "gone": True, "new_pid": 2,
                        "time_to_ready_s": ready - start - 0.1}}]  # fmt: skip


def test_crash_checks_judge_the_restart() -> None:
    def outage(t):
        return {"connection": 25} if 12 <= t < 13.5 else {}

    healthy = _scenario(35, width=0.25, errors=outage, chaos=_kill())
    for cid in ("crash.recovery_s", "crash.errors_after_ready", "crash.cold_penalty"):
        c = _run(cid, healthy)
        assert c.passed is True, (cid, c.detail)
    # cold-errors' shape: 503s in the first half second after ready
    cold = _scenario(35, width=0.25, errors=lambda t: {"http_503": 20} if 13.5 <= t < 14
                     else outage(t), chaos=_kill())  # fmt: skip
    c = _run("crash.errors_after_ready", cold)
    assert c.passed is False and c.value == pytest.approx(40 / 500)
    # slow-start's shape: the first requests after ready queue behind a lazy init
    slow = _scenario(35, width=0.25, p99=lambda t: 2500.0 if 13.5 <= t < 15 else 20.0,
                     errors=outage, chaos=_kill())  # fmt: skip
    c = _run("crash.cold_penalty", slow)
    assert c.passed is False and c.value == pytest.approx(125.0)
    # a slow model load: the outage lasts 16 s
    long = _scenario(45, width=0.25, errors=lambda t: {"connection": 25} if 12 <= t < 28
                     else {}, chaos=_kill(12.0, 28.0))  # fmt: skip
    c = _run("crash.recovery_s", long)
    assert c.passed is False and c.value >= 16.0


def _terminate(**detail: Any):
    d = {"found": True, "ignored": False, "unready_s": 0.01, "exit_s": 0.4, "exit_code": 0,
         "killed": False, "gone": True, "new_pid": 2, "time_to_ready_s": 1.0} | detail  # fmt: skip
    return [{"action": "terminate", "ok": True, "at_s": 12.0, "start_s": 12.0, "end_s": 13.6,
             "params": {"restart": True, "drain_timeout_s": 10.0, "duration_s": 0.0},
             "detail": d}]  # fmt: skip


def test_shutdown_checks() -> None:
    stages = [{"name": "serving", "start_s": 0.0, "end_s": 12.0},
              {"name": "replaced", "start_s": 12.0, "end_s": 27.0}]  # fmt: skip

    def by_stage(failed: dict) -> dict:
        # 100 req/s answered in 80 ms: ~8 requests in flight when the signal comes
        ok = 1200 - sum(failed.values())
        return {"serving": {"default": {"counters": {"scheduled": 1200, "ok": ok,
            "dropped": 0, "in_flight": 0, "failed": failed},
            "latency_hdr": hdr([80_000] * ok)}}}  # fmt: skip

    good = _scenario(27, chaos=_terminate(), stages=stages, by_stage=by_stage({}))
    assert _run("shutdown.lost", good).passed is True
    assert _run("shutdown.exit_s", good, threshold=10).passed is True
    dropped = _scenario(27, chaos=_terminate(), stages=stages,
                        by_stage=by_stage({"connection": 3}))  # fmt: skip
    c = _run("shutdown.lost", dropped)
    assert c.passed is False and c.value == 3
    hung = _scenario(27, chaos=_terminate(exit_s=None, exit_code=None, killed=True),
                     stages=stages)  # fmt: skip
    c = _run("shutdown.exit_s", hung, threshold=10)
    assert c.passed is False and c.value is None and "SIGKILLed" in c.detail
    crashed = _scenario(27, chaos=_terminate(exit_code=1), stages=stages)
    c = _run("shutdown.exit_s", crashed, threshold=10)
    assert c.passed is False and "exit code 1" in c.detail
    # no stage edge at the signal: the lost count would be a guess — skipped
    off = _scenario(27, chaos=_terminate(), by_stage=by_stage({}))
    assert _run("shutdown.lost", off).skipped


def test_report_has_a_band_table_per_chaos_event() -> None:
    from harness.report.html import _chaos_bands

    sc = _scenario(40, p99=lambda t: 3000.0 if 10 <= t < 13 else 20.0, chaos=_pause())
    sc["chaos"].append({**_kill(25.0, 27.0)[0], "action": "network"})  # any action
    html = _chaos_bands(sc)
    assert html.count("<table>") == 2 and "#1 pause" in html and "#2 network" in html
    assert json.dumps(sc)  # the table reads the document only


SLOW_DRAIN = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))
    time.sleep(60)
    """
)


def test_terminate_cut_short_by_the_run_ending_neither_kills_nor_restarts(
    tmp_path: Path,
) -> None:
    """The run ends (revert from another thread) while the server still drains: the
    watch stops, nothing is SIGKILLed or restarted, and shutdown.exit_s skips."""
    import threading

    sut = _sut(tmp_path, SLOW_DRAIN)
    try:
        t = Terminate(sut, 0.0, drain_timeout_s=30.0, restart=True)
        t.can_restart = True
        worker = threading.Thread(target=t.apply)
        worker.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        t.revert()
        worker.join(5)
        assert time.monotonic() - t0 < 1.5  # not the 30 s drain timeout, nor the 2 s drain
        assert t.detail["cut_short"] is True and t.detail["killed"] is False
        assert "new_pid" not in t.detail and sut.alive()
        sc = _scenario(27, chaos=_terminate(exit_s=None, exit_code=None, cut_short=True))
        assert _run("shutdown.exit_s", sc).skipped
    finally:
        sut.stop()
