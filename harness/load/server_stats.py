"""The server's own time split per stage, from its statistics endpoint.

A server whose protocol has a statistics endpoint (``harness.protocols``: for KServe V2,
Triton's statistics extension, which the reference server offers too) keeps
cumulative per-model counters: requests that succeeded or failed, their time queued
and computing, model executions and the inferences (rows) they carried. Read at the
start and at the end of every stage on the scenario's clock, the differences give what
perf_analyzer prints per measurement: requests, executions, the average batch, and the
mean queue and compute time per request — where the latency went on the server's side.

One GET when the run is prepared decides whether the server offers it (200 with the
model's counters); without it nothing is read and the scenario result has no
``server_stats``. During the run every read is one GET through the load client
(``harness.load.http``: the run's ``--header`` values and TLS apply), never retried: a
read that fails leaves the stages at its edge out, with the reason.

The counters cover every client of the server, and requests finished between two reads:
a stage's figures differ from the harness's own counts by the requests in flight at its
edges (and by anyone else's traffic).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from harness import protocols
from harness.errors import HarnessError
from harness.load import http
from harness.protocols import Counters, WireProtocol
from harness.results.records import ServerStats, ServerStatsStage

if TYPE_CHECKING:
    from harness.load.preparation import Preparation
    from harness.load.scenario import Scenario
    from harness.load.side_tasks import SideTasks

log = logging.getLogger("harness.load")

READ_TIMEOUT_S = 2.0  # a paused or hung server must not hold the next stage edge's read


def stats_url(base: str, model: str, protocol: WireProtocol | None = None) -> str | None:
    """The statistics endpoint of ``model`` (None: the protocol has none)."""
    path = (protocol if protocol is not None else protocols.default()).stats_path(model)
    return None if path is None else f"{base.rstrip('/')}{path}"


def read(
    url: str, model: str, protocol: WireProtocol | None = None
) -> tuple[Counters | None, str | None]:
    """One GET, no retry → (counters, None) or (None, why not)."""
    import json

    proto = protocol if protocol is not None else protocols.default()

    try:
        status, body = http.request(url, "GET", timeout=READ_TIMEOUT_S)
    except http.RequestTimeout:
        return None, f"no answer within {READ_TIMEOUT_S:g} s"
    except http.ConnectionFailed as exc:
        return None, f"connection failed: {exc}"
    if status != 200:
        return None, f"HTTP {status}"
    try:
        counters = proto.stats_counters(json.loads(body), model)
    except ValueError:
        counters = None
    return (counters, None) if counters is not None else (None, f"no model_stats for {model!r}")


def _ms(ns: int, count: int) -> float | None:
    return round(ns / count / 1e6, 3) if count > 0 else None


def stage_split(start: Counters, end: Counters) -> ServerStatsStage | None:
    """The stage's figures from the counters at its two edges; None when a counter went
    backwards (the server restarted: the difference measures nothing)."""
    d = {k: end[k] - start[k] for k in start}
    if any(v < 0 for v in d.values()):
        return None
    n_ok = d["success_count"]
    executions = d["execution_count"]
    compute_ns = d["compute_input_ns"] + d["compute_infer_ns"] + d["compute_output_ns"]
    return ServerStatsStage(
        start_s=0.0,
        end_s=0.0,
        requests=n_ok + d["fail_count"],
        success=n_ok,
        fail=d["fail_count"],
        executions=executions,
        avg_batch=round(d["inference_count"] / executions, 3) if executions else None,
        queue_ms=_ms(d["queue_ns"], d["queue_count"]),
        compute_ms=_ms(compute_ns, d["compute_infer_count"]),
        compute_infer_ms=_ms(d["compute_infer_ns"], d["compute_infer_count"]),
        request_ms=_ms(d["success_ns"], n_ok),
    )


class StageReader:
    """Reads the counters at every stage edge and turns them into per-stage splits."""

    def __init__(
        self, url: str, model: str, stages: Sequence[Any], protocol: WireProtocol | None = None
    ) -> None:
        self.url = url
        self.model = model
        self.protocol = protocol if protocol is not None else protocols.default()
        self.stages = [(s.name, float(s.start_s), float(s.end_s)) for s in stages]
        self.edges = sorted({e for _, a, b in self.stages for e in (a, b)})
        self.reads: dict[float, tuple[float, Counters]] = {}  # edge → (read at t, counters)
        self.failed: dict[float, str] = {}  # edge → why its read failed
        self.closing: tuple[float, Counters] | None = None
        self._closed = False

    def take(self, edge: float, t: float) -> None:
        counters, why = read(self.url, self.model, self.protocol)
        if counters is not None:
            self.reads[edge] = (t, counters)
        else:
            self.failed[edge] = why or "failed"
            log.warning("harness: server statistics at t=%.1f s not read: %s", edge, why)

    def follow(
        self,
        scenario_time: Callable[[], float],
        collecting: Callable[[], bool],
        sleep: Callable[[float], Any],
    ) -> None:
        """The side task: one read as each edge comes, until the run stops collecting."""
        for edge in self.edges:
            while (t := scenario_time()) < edge:
                sleep(min(edge - t, 1.0))
            if not collecting():
                return
            self.take(edge, scenario_time())

    def close(self, t: float) -> None:
        """At the final write: one read for a stage the side task did not see end (the run
        stopped early, or its greenlet stopped before the last edge's read)."""
        if self._closed:
            return
        self._closed = True
        open_ = [e for e in self.edges if e not in self.reads and e not in self.failed]
        if open_ and self.reads:
            counters, why = read(self.url, self.model, self.protocol)
            if counters is not None:
                self.closing = (t, counters)
            else:
                self.failed[open_[0]] = why or "failed"

    def result(self) -> ServerStats:
        stages: dict[str, ServerStatsStage] = {}
        missing: dict[str, str] = {}
        closing_used = False
        for name, a, b in self.stages:
            start = self.reads.get(a)
            end = self.reads.get(b)
            if start is not None and end is None and self.closing is not None and not closing_used:
                end, closing_used = self.closing, True  # the stage the run stopped in
            if start is None or end is None:
                edge = a if start is None else b
                why = self.failed.get(edge)
                missing[name] = (
                    f"the read at t={edge:g} s failed: {why}"
                    if why
                    else f"not reached (t={edge:g} s)"
                )
                continue
            split = stage_split(start[1], end[1])
            if split is None:
                missing[name] = "a counter went backwards: the server restarted during the stage"
                continue
            split["start_s"] = round(start[0], 3)
            split["end_s"] = round(end[0], 3)
            stages[name] = split
        source = self.protocol.stats_source or self.protocol.name
        out = ServerStats(source=source, url=self.url, model=self.model, stages=stages)
        if missing:
            out["missing"] = missing
        return out


def start(
    tasks: SideTasks,
    prep: Preparation,
    scenario: Scenario,
    scenario_time: Callable[[], float],
    collecting: Callable[[], bool],
) -> StageReader | None:
    """At the end of preparation: one GET; when the server offers the statistics, the
    reader (kept on ``tasks``, so a new run starts without one) and its side task."""
    import gevent

    tasks.server_stats = None  # type: ignore[attr-defined]
    if not prep.base_url or not prep.model:
        return None
    protocol = prep.protocol
    url = stats_url(prep.base_url, prep.model, protocol)
    if url is None:  # the protocol has no statistics endpoint
        return None
    try:
        counters, why = read(url, prep.model, protocol)
    except HarnessError:
        return None
    if counters is None:
        log.info("harness: no server statistics (GET %s: %s); not read during the run", url, why)
        return None
    reader = StageReader(url, prep.model, scenario.stages, protocol)
    tasks.server_stats = reader  # type: ignore[attr-defined]
    tasks.spawn(reader.follow, scenario_time, collecting, gevent.sleep)
    return reader


def result_of(state: Any, final: bool) -> ServerStats | None:
    """The scenario result's ``server_stats`` (None: the server does not offer them).
    ``final``: the run's last write, which closes a stage the side task did not see end."""
    reader: StageReader | None = getattr(state.tasks, "server_stats", None)
    if reader is None:
        return None
    if final:
        reader.close(state.scenario_time())
    return reader.result()
