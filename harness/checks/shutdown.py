"""Rolling-shutdown checks: what a SIGTERM of the server (the ``terminate`` action: drain,
exit, restart) does to the requests it had, judged from the chaos record and the load.

Each check reads the scenario's first ``terminate`` record (``chaos_records.py``); one
that did not apply is a skip. Thresholds and their reasoning: docs/checks.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.analysis.resilience import (
    MISANSWERED_KINDS,
    UNANSWERED_KINDS,
)
from harness.checks import _data as d
from harness.checks._data import fmt
from harness.checks.chaos_records import (
    finite_number,
    first_event,
    skip_unless_applied,
)
from harness.checks.model import Check, Result
from harness.checks.registry import implements


def _in_flight_at_signal(
    result: Mapping[str, Any], name: str, signal_s: float
) -> tuple[float, float, float] | None:
    """How many requests of stage ``name`` (all sent before the signal) are expected to
    have been in flight when the signal came at ``signal_s``: (expected count, the stage's
    answered rate in req/s, the mean time its requests still had to run at the signal in
    s). None when the stage answered nothing.

    A request sent ``u`` s before the stage's end with latency ``L`` was still in flight at
    the signal when ``L > u + gap`` (``gap``: signal − stage end). With arrivals at rate λ
    (Poisson or constant) and latencies drawn from the stage's own ok latencies, the count
    in flight is Poisson with mean λ · E[(L − gap)+] (Little's law for the tail of the
    stage). What is counted is an expectation: the load side does not record which
    request was open at the signal."""
    st = d.stage(result, name)
    c = d.counters(result, stage_names=[name])
    if st is None or c is None:
        return None
    secs = float(st["end_s"]) - float(st["start_s"])
    hist = d.histogram(result, stage_names=[name])
    n = hist.get_total_count()
    if n == 0 or secs <= 0:
        return None
    gap_us = max(0.0, signal_s - float(st["end_s"])) * 1e6
    left_us = sum(
        item.count_added_in_this_iter_step * max(0.0, item.value_iterated_to - gap_us)
        for item in hist.get_recorded_iterator()
    )
    rate = int(c.get("ok") or 0) / secs
    mean_left_s = left_us / n / 1e6
    return rate * mean_left_s, rate, mean_left_s


@implements("shutdown.lost")
def shutdown_lost(result: Mapping[str, Any], r: Result) -> Check:
    rec = first_event(result, "terminate")
    if (skip := skip_unless_applied(rec, r, "terminate")) is not None:
        return skip
    assert rec is not None
    at = finite_number(rec.get("at_s"))
    name = str(r.params["before_stage"])
    stages = d.stages(result)
    if not name:
        # the stage that ends where the SIGTERM was planned: every request of it was
        # sent before the signal, whatever the window width
        name = next(
            (
                str(s["name"])
                for s in stages
                if at is not None and abs(float(s["end_s"]) - at) < 1e-6
            ),
            "",
        )
    if not name or d.stage(result, name) is None:
        return r.skipped(
            f"no stage ends at the SIGTERM (planned at {fmt(at)} s): end a stage exactly "
            "at the terminate event's at_s (or name it: before_stage), so the requests sent "
            "before the signal are known exactly"
        )
    c = d.counters(result, stage_names=[name])
    if c is None or not c.get("scheduled"):
        return r.skipped(f"no request recorded in stage {name!r}")
    failed = c.get("failed") or {}
    lost = {k: int(failed.get(k, 0)) for k in (*UNANSWERED_KINDS, *MISANSWERED_KINDS)}
    lost = {k: v for k, v in lost.items() if v}
    in_flight = int(c.get("in_flight") or 0)
    value = sum(lost.values()) + in_flight
    sent = int(c["scheduled"]) - int(c.get("dropped") or 0)
    detail_rec = rec.get("detail") or {}
    signal_s = float(rec["start_s"])
    expected = _in_flight_at_signal(result, name, signal_s)
    min_open = float(r.params["min_in_flight"])
    tested = (
        f"~{fmt(expected[0])} requests expected in flight at the signal "
        f"({fmt(expected[1])} req/s answered × {fmt(expected[2] * 1000)} ms each still "
        "had to run)"
        if expected is not None
        else "no request of the stage was answered, so none is known to have been in "
        "flight at the signal"
    )
    ok_ = r.compare(value)
    if ok_ and (expected is None or expected[0] < min_open):
        # nothing lost, but nothing (or too little) was open when the signal came: the
        # drain was never asked to finish anything
        return r.skipped(
            f"drain not tested: no request was in flight at SIGTERM — {tested}, fewer "
            f"than {fmt(min_open)} (even at {fmt(min_open)} expected, none would be open "
            f"{math.exp(-min_open):.1%} of the time); {sent} requests sent before the "
            "signal, none lost — raise the rate",
            value=value,
            n=sent,
        )
    detail = (
        f"{value} of the {sent} requests sent before SIGTERM (stage {name!r}) were never "
        f"answered (by kind {lost or 'none'}, still in flight {in_flight}); {c.get('ok')} "
        f"ok, {sum(int(v) for v in failed.values()) - sum(lost.values())} answered with an "
        f"error status; {tested}; the server stopped saying ready "
        f"{fmt(finite_number(detail_rec.get('unready_s')))} s and exited "
        f"{fmt(finite_number(detail_rec.get('exit_s')))} s after the signal"
    )
    if not ok_:
        detail += (
            " — the server dropped requests it had accepted: on SIGTERM, stop accepting, "
            "answer what is in flight, then exit"
        )
    return r.judged(value, ok_, detail, n=sent)


@implements("shutdown.exit_s")
def shutdown_exit(result: Mapping[str, Any], r: Result) -> Check:
    rec = first_event(result, "terminate")
    if (skip := skip_unless_applied(rec, r, "terminate")) is not None:
        return skip
    assert rec is not None
    det = rec.get("detail") or {}
    params = rec.get("params") or {}
    exit_s = finite_number(det.get("exit_s"))
    code = det.get("exit_code")
    drain = finite_number(params.get("drain_timeout_s"))
    unready = fmt(finite_number(det.get("unready_s")))
    if exit_s is None and det.get("cut_short"):
        return r.skipped(
            f"the run ended before the server exited and before the {fmt(drain)} s drain "
            "timeout: its exit was not observed — lengthen the stage after the SIGTERM beyond "
            "drain_timeout_s"
        )
    if exit_s is None and (det.get("killed") is True or "exit_s" in det):
        # the terminate action watched the process until the drain timeout and it was
        # still running: the data says it never exited by itself
        return r.judged(
            None,
            False,
            f"the server did not exit within the drain timeout ({fmt(drain)} s) after "
            f"SIGTERM and was SIGKILLed (it stopped saying ready after {unready} s) — "
            "something keeps the process alive after the drain: a non-daemon thread, a "
            "child process, a blocking atexit hook",
            n=1,
        )
    if exit_s is None:
        return r.skipped(
            "the terminate record holds no exit time (written by a harness that did not "
            "time the exit): run the scenario again"
        )
    in_time = r.compare(exit_s)
    timing = (
        f"exited {fmt(exit_s)} s after SIGTERM ({'<=' if in_time else '>'} "
        f"{fmt(r.threshold)} s); stopped saying ready after {unready} s"
    )
    if not in_time:
        # too slow is a failure whatever the exit code was
        return r.judged(
            round(exit_s, 3),
            False,
            f"{timing}, exit code {code if isinstance(code, int) else 'unknown'} — the "
            "drain took longer than the orchestrator's grace period allows",
            n=1,
        )
    if not isinstance(code, int) or isinstance(code, bool):
        return r.skipped(
            f"{timing}, but its exit code is unknown: the server was attached by pid "
            "(neither the harness nor its agent started it), so nothing read how the "
            "process ended — an orchestrator counts a non-zero exit on SIGTERM as a "
            "crash; start the server with --sut-cmd to judge it",
            value=round(exit_s, 3),
            n=1,
        )
    passed = code == 0
    detail = f"{timing}; exit code {code}"
    if not passed:
        detail += (
            f" — exit code {code}: an orchestrator counts a non-zero exit on SIGTERM as a "
            "crash (restarts, alerts); exit 0 after a clean drain"
        )
    return r.judged(round(exit_s, 3), passed, detail, n=1)
