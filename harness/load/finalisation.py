"""The end of a run on the master / local runner: collect, stop, merge, write.

``finish_run`` takes a run from ``draining`` to ``written``: the workers' final reports
(or the local engine's last delta) are merged, the side tasks stop (chaos reverted, the
sampler's files read), the recording is closed and ``--out/results.json`` is written.
``write_results`` is also the periodic partial write, so a killed soak keeps its data.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import results
from harness.load import server_stats
from harness.load.distribution import LOCAL
from harness.load.lifecycle import RunState
from harness.load.result import scenario_result

if TYPE_CHECKING:
    from harness.load.controller import HarnessState

log = logging.getLogger("harness.load")

FINALS_GRACE_S = 15.0  # beyond the request timeout, for the workers' final reports


def finish_run(state: HarnessState) -> Path:
    """``draining`` → ``writing`` → ``written``; the path of the results written."""
    assert state.lifecycle.state is RunState.DRAINING, state.lifecycle
    if state.is_master:
        missing = state.finals.request(
            state.env.runner, state.scenario.load.request_timeout_s + FINALS_GRACE_S
        )
        if missing:
            log.warning("harness: no final report from workers %s", sorted(missing))
    else:
        final = state.load.final(encoded=False)
        if final.recording is not None:
            state.merge(LOCAL, final.recording, final.cpu_s, final.conns, final=True)
    state.lifecycle.advance(RunState.WRITING)
    state.ended_unix = time.time()
    samples = state.tasks.stop(state.out_dir / "samples")
    state.aggregate.finish()
    state.partial = is_partial(state)
    _wait_partial_write(state)
    path = write_results(state, partial=state.partial, samples=samples)
    state.lifecycle.advance(RunState.WRITTEN)
    return path


def _wait_partial_write(state: HarnessState, timeout_s: float = 60.0) -> None:
    """Let a partial results.json still being written on the threadpool land first: it
    must never replace the final one."""
    pending = state.partial_write
    if pending is not None and not pending.ready():
        pending.wait(timeout_s)
        if not pending.ready():
            log.warning("harness: a partial results.json write still pending after %g s", timeout_s)


def is_partial(state: HarnessState) -> bool:
    """The stages did not all run, the server died, an error stopped the run, or a
    worker's final report never came."""
    return (
        not state.lifecycle.reached(RunState.COMPLETED)
        or state.sut_exit is not None
        or state.error is not None
        or bool(state.finals.missing())
    )


def write_results(
    state: HarnessState,
    partial: bool,
    samples: dict[str, Any] | None,
    off_loop: Callable[[Callable[[], None]], Any] | None = None,
) -> Path:
    """``--out/results.json`` from what the run has so far (atomically replaced; its
    serialising and write through ``off_loop``, ``results.write_document``)."""
    doc = build_document(state, partial, samples)
    return results.write_document(state.out_dir / "results.json", doc, off_loop)


def build_document(
    state: HarnessState, partial: bool, samples: dict[str, Any] | None
) -> dict[str, Any]:
    """The results document of what the run has so far (also the web UI's live view)."""
    end = state.ended_unix or time.time()
    prep = state.prep
    sc = scenario_result(
        scenario=state.scenario,
        file=state.opts.scenario,
        recording=state.aggregate,
        started_unix=state.origin_unix,
        duration_s=round(max(0.0, end - (state.origin_unix or end)), 3),
        partial=partial,
        capacity_rps=prep.capacity_rps if prep else None,
        calibration=prep.calibration if prep else None,
        time_to_ready_s=prep.time_to_ready_s if prep else None,
        fresh_sut=prep.fresh_sut if prep else False,
        golden_summary=prep.golden_summary if prep else None,
        chaos=state.tasks.chaos_records(),
        samples=samples,
        sut_cores=prep.sut_cores_n if prep else 1,
        error=state.error,
        sut_exit=state.sut_exit,
        workers=state.slots,
        loadgen_cpu_s=dict(state.cpu_by_source),
        server_stats=server_stats.result_of(state, final=state.lifecycle.state is RunState.WRITING),
    )
    import locust

    doc = results.new_document(
        sut=(prep.sut_doc if prep else None) or {"target": state.env.host},
        loadgen={
            "workers": state.slots,
            "locust_version": locust.__version__,
            "cores": sorted(os.sched_getaffinity(0)),
            "master_cpu_s": round(sum(os.times()[:2]), 3),
        },
    )
    doc["partial"] = partial
    if state.opts.allow_skip:
        doc["allow_skip"] = list(state.opts.allow_skip)  # judged with the document
    doc["scenarios"].append(sc)
    return doc
