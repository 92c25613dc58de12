"""The result of a scenario whose Locust run wrote none: a failed ``run.completed`` check
naming the cause, in a scenario result the schema accepts (built through the records of
``harness.results.records``), with whatever the sampler measured before the run died
(the server's and the machine's series: often what explains the death)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import ExitCode
from harness.locust_run import ScenarioRun
from harness.results.readers import ZERO_COUNTERS
from harness.results.records import Check, ScenarioResult


def failed_scenario(run: ScenarioRun, mode: str) -> dict[str, Any]:
    """``run``'s scenario result: failed, partial, ``no_results`` (its failure stands:
    ``harness.finish.judge`` does not judge it again)."""
    from harness.load.target import samples_left

    samples = samples_left(run.out_dir / "samples") or {}
    completed = Check(
        id="run.completed",
        passed=False,
        value=run.returncode,
        threshold=int(ExitCode.PASS),
        op="==",
        unit="exit code",
        n=None,
        detail=f"the scenario produced no results: {run.error}. See {run.out_dir}/locust.log.",
        skipped=None,
    )
    result = ScenarioResult(
        name=Path(run.name).stem,
        file=str(run.name),
        mode=mode,
        started_unix=run.started_unix,
        duration_s=round(run.elapsed_s, 3),
        partial=True,
        capacity_rps=None,
        check_config={},
        time_to_ready_s=None,
        stages=[],
        classes={},
        counters={**ZERO_COUNTERS, "failed": {}},
        by_class={},
        by_stage={},
        windows=None,
        first_requests=None,
        dispatch_lag_hdr=None,
        error_latency_hdr=None,
        integrity=None,
        linearity=None,
        contention=None,
        chaos=[],
        server=samples.get("server"),
        system=samples.get("system"),
        metrics=samples.get("metrics"),
        verdict="fail",
        checks=[completed],
    )
    # `no_results` (not a field of the records yet; the judging path reads it) follows
    # `partial`, where results.json has always had it
    out: dict[str, Any] = {}
    for key, value in result.items():
        out[key] = value
        if key == "partial":
            out["no_results"] = True
    return out
