"""The scenario result (``scenarios[i]`` of results.json) built from a merged Recording.

Built through the records of ``harness.results.records`` (field by field:
docs/outputs.md). Pure assembly — it measures nothing and judges nothing;
``harness.checks`` fills ``checks`` and ``verdict`` later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.load.recording import Recording, counters_view
from harness.load.scenario import Scenario
from harness.load.stream_recording import by_stage_class
from harness.results import hdr
from harness.results.readers import usl_params
from harness.results.records import (
    ChaosEvent,
    Contention,
    ContentionBlock,
    Integrity,
    Linearity,
    LinearityPoint,
    Load,
    ScenarioResult,
    ServerStats,
    Stage,
    Tokens,
    TrafficClass,
    Windows,
)


def stages_view(scenario: Scenario, capacity_rps: float | None) -> list[Stage]:
    out = []
    for s in scenario.stages:
        try:
            rate = s.rate_rps(capacity_rps)
        except Exception:  # relative rate, never calibrated (the run failed before)
            rate = None
        out.append(
            Stage(
                name=s.name,
                start_s=s.start_s,
                end_s=s.end_s,
                kind=s.kind,
                rate_rps=rate,
                rate=None if s.rate is None else str(s.rate),
                users=s.users,
                threads=s.threads,
                warmup_s=s.warmup_s,
            )
        )
    return out


def classes_view(scenario: Scenario) -> dict[str, TrafficClass]:
    return {
        c.name: TrafficClass(priority=c.priority, share=c.share, timeout_us=c.timeout_us)
        for c in scenario.classes
    }


def linearity_view(
    scenario: Scenario, rows: Sequence[Mapping[str, Any]], cores: int | None
) -> Linearity | None:
    """Throughput of each linearity stage (ok answers per second after its warm-up), and
    the USL fitted to them (the one fit, which the report plots)."""
    spec = scenario.linearity
    if spec is None:
        return None
    points: dict[int, list[float]] = {}
    for stage in scenario.stages:
        n = stage.threads if spec.vary == "threads" else stage.users
        lo, hi = stage.start_s + stage.warmup_s, stage.end_s
        ok = sum(int(r["ok"]) for r in rows if lo <= r["t"] < hi)
        points.setdefault(int(n or 0), []).append(ok / max(hi - lo, 1e-9))
    pts = [LinearityPoint(n=n, throughput_rps=v) for n, v in sorted(points.items())]
    return Linearity(vary=spec.vary, points=pts, cores_available=cores, usl=usl_params(pts))


def contention_view(scenario: Scenario) -> Contention | None:
    spec = scenario.contention
    if spec is None:
        return None
    return Contention(
        blocks=[
            ContentionBlock(kind=b.kind, stage=b.stage, start_s=b.start_s, end_s=b.end_s)
            for b in spec.blocks
        ],
        warmup_s=spec.warmup_s,
    )


def scenario_result(
    *,
    scenario: Scenario,
    file: str,
    recording: Recording | None,
    started_unix: float | None,
    duration_s: float,
    partial: bool,
    capacity_rps: float | None,
    calibration: Mapping[str, Any] | None,
    time_to_ready_s: float | None,
    fresh_sut: bool = False,
    golden_summary: Mapping[str, Any] | None,
    chaos: Sequence[Mapping[str, Any]],
    samples: Mapping[str, Any] | None,
    sut_cores: int | None,
    error: Mapping[str, Any] | None,
    sut_exit: Mapping[str, Any] | None,
    workers: int,
    loadgen_cpu_s: Mapping[str, float] | None = None,
    server_stats: ServerStats | None = None,
) -> ScenarioResult:
    rec = recording if recording is not None else Recording(window_s=scenario.load.window_s)
    total = rec.totals()
    golden = golden_summary or {}
    integrity = Integrity(
        checked=int(rec.integrity.get("checked", 0)),
        ok=int(rec.integrity.get("ok", 0)),
        drift=int(rec.integrity.get("drift", 0)),
        cross_wired=int(rec.integrity.get("cross_wired", 0)),
        id_mismatch=int(rec.integrity.get("id_mismatch", 0)),
        verified=golden_summary is not None,
        tolerance=golden.get("tolerance"),
        pool=golden.get("pool"),
        distinct=golden.get("distinct"),
        golden=golden.get("golden"),
        examples=list(rec.examples),
    )
    samples = samples or {}
    result = ScenarioResult(
        name=scenario.name,
        file=file,
        mode=scenario.mode,
        description=scenario.description,
        started_unix=started_unix,
        duration_s=duration_s,
        partial=partial,
        error=dict(error) if error else None,
        sut_exit=dict(sut_exit) if sut_exit else None,
        capacity_rps=capacity_rps,
        calibration=dict(calibration) if calibration else None,
        check_config=scenario.check_config(),
        defined_by=list(scenario.defining_checks()),
        time_to_ready_s=time_to_ready_s,
        # true when the load met a server started just before it, untouched since
        fresh_sut=fresh_sut,
        load=Load(
            mode=scenario.load.mode,
            arrival=scenario.load.arrival,
            request_timeout_s=scenario.load.request_timeout_s,
            max_in_flight=scenario.load.max_in_flight,
            seed=scenario.load.seed,
            workers=workers,
            scheduled_by_worker=dict(sorted(rec.by_source.items())),
            # CPU the load processes used from receiving the plan to their last report
            cpu_s_by_worker=dict(sorted((loadgen_cpu_s or {}).items())),
            cpu_cores_mean=(
                round(sum((loadgen_cpu_s or {}).values()) / duration_s, 3)
                if duration_s > 0
                else None
            ),
        ),
        stages=stages_view(scenario, capacity_rps),
        classes=classes_view(scenario),
        counters=counters_view(total.counts, rec.in_flight_final),
        by_class=rec.by_class(),
        by_stage=rec.by_stage(),
        windows=Windows(width_s=rec.window_s, rows=list(rec.rows)),
        first_requests=rec.first_requests(),
        latency_hdr=hdr.encode(total.hdr),
        dispatch_lag_hdr=hdr.encode(rec.dispatch_lag),
        error_latency_hdr=hdr.encode(rec.error_latency),
        integrity=integrity,
        linearity=linearity_view(scenario, rec.rows, sut_cores),
        contention=contention_view(scenario),
        chaos=[ChaosEvent(**c) for c in chaos],
        server=samples.get("server"),
        system=samples.get("system"),
        metrics=samples.get("metrics"),
        checks=[],
        verdict=None,
    )
    if server_stats is not None:  # absent when the server offers no statistics
        result["server_stats"] = server_stats
    if any(t.cells for t in rec.tokens.values()):  # a streaming protocol's
        result["tokens"] = Tokens(
            by_class=rec.tokens["class"].summary(),
            by_stage=rec.tokens["stage"].summary(),
            by_stage_class=by_stage_class(rec.tokens["stage_class"]),
        )
    return result
