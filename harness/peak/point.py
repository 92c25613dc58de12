"""One point's judged run → a ``Point``: its outcome, its curve figures, the server's
cost, and whether the server died during it.

The run's own judgement decides the point: ``steady.p99_ms`` at the SLO (p99 over
*every* request, failures and drops counted as over it, MLPerf's early-stopping rule),
``steady.error_rate`` at the error limit — in tokens, ``llm.ttft_p99`` and
``llm.tpot_p99`` at their SLOs and ``llm.goodput`` at 1 - the error limit — and the
harness's validity rules (generator saturation, dispatch lag, sampler coverage) — an
invalid run is a limit of the load generator, not of the server. A run that records the server exited, or could not reach
it, is a miss carrying the cause.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from typing import Any

from harness.peak.config import POINT_STAGE, PeakConfig
from harness.peak.outcomes import Point

# the checks whose verdicts decide a point: by latency and errors (KServe V2), or in
# tokens (an OpenAI-compatible server: TTFT, TPOT, whole answers)
JUDGED_BY = {
    False: ("steady.p99_ms", "steady.error_rate"),
    True: ("llm.ttft_p99", "llm.tpot_p99", "llm.goodput"),
}


def classify(sc: Mapping[str, Any], cfg: PeakConfig, run_dir: str | None = None) -> Point:
    """A judged point scenario result → a ``Point`` (its outcome and curve figures)."""
    from harness.analysis.percentiles import (
        count_above_ms,
        percentile_ms,
        percentile_with_failures_ms,
    )
    from harness.results import readers

    names = [POINT_STAGE]
    hist = readers.latency(sc, stage_names=names)
    c = readers.counters(sc, stage_names=names) or dict(readers.ZERO_COUNTERS)
    stage = readers.stage(sc, POINT_STAGE) or {}
    secs = max(1e-9, float(stage.get("end_s", 0)) - float(stage.get("start_s", 0)))
    rate = float(stage.get("rate_rps") or 0.0)
    failed = readers.failed_total(c) - int((c.get("failed") or {}).get("cancelled") or 0)
    bad = failed + int(c.get("dropped") or 0)
    ok = int(c.get("ok") or 0)
    finished = ok + bad
    p99 = percentile_with_failures_ms(hist, 99.0, bad) if finished else None
    within = ok - count_above_ms(hist, cfg.slo_p99_ms) if ok else 0
    checks = {ch.get("id"): ch for ch in sc.get("checks") or []}
    reasons: list[str] = [str(r) for r in sc.get("validity") or []]
    err = sc.get("error") or {}
    if err and not reasons:
        reasons.append(f"{err.get('type')}: {err.get('message')}")
    server_exit = None
    if sc.get("sut_exit"):
        reasons.append(f"the server exited: {sc['sut_exit'].get('cause')}")
        server_exit = exit_text(sc["sut_exit"].get("exit_code"))
    elif err.get("type") == "TargetUnavailable":
        # the run could not reach the server: it is gone or hung, not the load generator
        first = str(err.get("message") or "").splitlines()[:1]
        server_exit = "the server did not answer" + (f" ({first[0][:200]})" if first else "")
    outcome: str
    if server_exit is not None:
        outcome = "missed"  # a server that died did not sustain the rate
    elif reasons or not checks:
        outcome = "invalid"
        if not reasons:
            reasons.append("the point run judged nothing (no checks in its results)")
    else:
        judging = [checks.get(cid) or {} for cid in JUDGED_BY[cfg.in_tokens]]
        if any(x.get("passed") is False for x in judging):
            outcome = "missed"
            reasons += [str(x.get("detail")) for x in judging if x.get("passed") is False]
        elif all(x.get("passed") is True for x in judging):
            outcome = "met"
        else:
            outcome = "insufficient"
            reasons += [str(x.get("skipped")) for x in judging if x.get("skipped")]
    if cfg.in_tokens:
        # the curve in tokens: TTFT (p50, and p99 with failures over it, as the check
        # judged it), TPOT p99, whole answers per second
        cell = ((sc.get("tokens") or {}).get("by_stage") or {}).get("classes", {}).get(
            POINT_STAGE
        ) or {}
        ttft = cell.get("ttft_ms") or {}
        failed_n = int(cell.get("failed") or 0) + int(cell.get("dropped") or 0)
        streams = int(cell.get("ok") or 0) + failed_n
        p50, tpot_p99 = ttft.get("p50_ms"), (cell.get("tpot_ms") or {}).get("p99_ms")
        # more than 1 % failed: the p99 is one of the failures (as llm.ttft_p99 judges it)
        p99 = math.inf if streams and failed_n / streams > 0.01 else ttft.get("p99_ms")
        within = int(cell.get("conforming") or 0)
        finished = int(cell.get("requests") or 0) + int(cell.get("dropped") or 0)
        bad = finished - within
    else:
        p50, tpot_p99 = percentile_ms(hist, 50.0), None
    return Point(
        rate_rps=round(rate, 3),
        outcome=outcome,  # type: ignore[arg-type]
        p50_ms=p50,
        p99_ms=p99,
        tpot_p99_ms=tpot_p99,
        error_rate=(bad / finished) if finished else None,
        goodput_rps=within / secs,
        achieved_rps=ok / secs,
        n=finished,
        duration_s=round(secs, 2),
        reasons=tuple(reasons),
        run_dir=run_dir,
        capacity_rps=sc.get("capacity_rps") if sc.get("calibration") else None,
        server_exit=server_exit,
        **_server_cost(sc, stage, ok),
    )


def exit_text(code: int | None) -> str:
    """How a server process ended, for a sentence: "the server exited (code 1)", "the
    server exited (signal 9, SIGKILL)"; "the server exited" when its code is unknown (a
    server the harness did not start)."""
    if code is None:
        return "the server exited"
    if code < 0:
        try:
            name = f", {signal.Signals(-code).name}"
        except ValueError:
            name = ""
        return f"the server exited (signal {-code}{name})"
    return f"the server exited (code {code})"


# the start of every server-gone cause (``exit_text`` and ``classify``'s "did not answer")
SERVER_GONE = ("the server exited", "the server did not answer")


def server_gone(why: str | None) -> bool:
    """Whether a search stopped because its server died (``search``'s ``why``)."""
    return bool(why) and str(why).startswith(SERVER_GONE)


def _server_cost(sc: Mapping[str, Any], stage: Mapping[str, Any], ok: int) -> dict[str, Any]:
    """Server CPU per answered request over the point stage (the sampler's per-tick CPU
    %, its ticks moved onto the scenario's clock) and its largest RSS in the run."""
    server = sc.get("server") or {}
    series = server.get("series") or {}
    t, cpu, rss = series.get("t") or [], series.get("cpu_pct") or [], series.get("rss_bytes") or []
    out: dict[str, Any] = {"cpu_ms_per_request": None, "rss_mib": None}
    rss_known = [x for x in rss if x is not None]
    if rss_known:
        out["rss_mib"] = round(max(rss_known) / 2**20, 1)
    if not t or len(cpu) != len(t) or not ok or sc.get("started_unix") is None:
        return out
    offset = float(server.get("started_unix") or sc["started_unix"]) - float(sc["started_unix"])
    interval = float(server.get("interval_s") or 1.0)
    lo, hi = float(stage.get("start_s") or 0.0), float(stage.get("end_s") or 0.0)
    # a tick at t covers (t - interval, t]: count the ticks wholly inside the stage
    inside = [
        c
        for tt, c in zip(t, cpu, strict=True)
        if c is not None and lo + interval <= tt + offset <= hi
    ]
    if not inside:
        return out
    cpu_s = sum(inside) / 100.0 * interval
    covered = len(inside) * interval
    answered = ok * covered / max(hi - lo, 1e-9)  # the answers in the covered ticks
    out["cpu_ms_per_request"] = round(1000.0 * cpu_s / max(answered, 1e-9), 3)
    return out
