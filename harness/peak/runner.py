"""``harness peak``: measure points for ``harness.peak.search`` with the harness's own runs.

One point is one headless Locust run (``harness.locust_run.run_one``, the path every
scenario takes) of a generated one-stage scenario: open loop, Poisson arrivals at the
point's rate, a warmup the checks do not judge, then long enough for the early-stopping
sample count at the asked confidence (``search.samples_needed``). The run's own
judgement decides the point: ``steady.p99_ms`` at the SLO (p99 over *every* request,
failures and drops counted as over it, MLPerf's early-stopping rule), ``steady.error_rate``
at the error limit, and the harness's validity rules (generator saturation, dispatch
lag, sampler coverage) — an invalid run is a limit of the load generator, not of the
server. The server is started once and kept running between points (its pid is given
to each run, so the sampler and the validity rules see it); a guard process
(``harness.sut.guard``, started by ``SutProcess``) stops it if this process dies, SIGKILL
included. A server that dies during a point — its process exits, or the point's run
records that it exited or stopped answering — ends the search as a failure (exit 1), the
cause and the rate in its answer, the points measured so far written.

The first point, unless ``--start-rps`` is given, is half of the harness's capacity
probe (the scenario's rate is "0.5x", so the run calibrates as every relative scenario
does); bracketing goes on from there.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import protocols
from harness.errors import ExitCode, TargetUnavailable
from harness.locust_run import RunSettings, StopFlag, Target
from harness.peak.answer import (
    combine_searches,
    exit_code,
    new_peak_document,
    summarize,
    write_outputs,
)
from harness.peak.config import PeakConfig, point_scenario
from harness.peak.outcomes import Point
from harness.peak.point import classify
from harness.peak.search import PeakSearch, SearchParams
from harness.peak.server import ManagedServer
from harness.sut import check_command as check_sut_cmd

# what the CLI and `harness tune` take from here
__all__ = ["NEW_LIFETIME", "quiet", "run_peak", "run_point", "search", "target_for"]


# --- one search ---------------------------------------------------------------------------


def run_point(
    cfg: PeakConfig,
    target: RunSettings,
    out_dir: Path,
    index: int,
    rate: float | None,
    longer: bool,
    show: Callable[[str], None],
    interrupt: StopFlag,
) -> Point:
    """One Locust run of a point scenario; its judged results as a ``Point``."""
    from harness.locust_run import run_one

    out_dir.mkdir(parents=True, exist_ok=True)
    seconds = cfg.point_seconds(rate or 100.0, longer)
    name = f"point_{index:02d}"
    toml = out_dir / f"{name}.toml"
    toml.write_text(point_scenario(cfg, rate, seconds))
    settings = replace(
        target,
        mode="quick",
        # the golden outputs once per server process, not once per point
        extra_args=(*target.extra_args, "--golden-cache", str(out_dir / "golden.json")),
    )
    run = run_one(settings, out_dir, str(toml), index, 0, interrupt, show)
    if run.document is None or not run.document.get("scenarios"):
        return Point(
            rate_rps=float(rate or 0.0),
            outcome="invalid",
            reasons=(f"the point run wrote no results: {run.error}",),
            run_dir=str(run.out_dir),
        )
    return classify(run.document["scenarios"][0], cfg, str(run.out_dir))


def search(
    cfg: PeakConfig,
    target: RunSettings,
    out_dir: Path,
    show: Callable[[str], None] = print,
    points: list[Point] | None = None,
    on_point: Callable[[Point], None] | None = None,
    gone: Callable[[], str | None] = lambda: None,
    lifetime: int | None = None,
) -> tuple[PeakSearch, str]:
    """Measure points until the search stops; returns the search and why it stopped.
    ``points``: already measured (a resumed search); ``on_point``: called after each.
    ``gone``: None while the server runs, else how it ended (``ManagedServer.gone``); a
    point during which the server died (``gone``, or the run's own record of it) carries
    the cause (``Point.server_exit``) and the search stops there: a failure, not a limit.

    ``lifetime``: the server's lifetime number, stamped on every point measured; the
    search then stops with ``NEW_LIFETIME`` before measuring a rate again that this
    lifetime already judged (a repeat), so that the caller can start a fresh server and go
    on: every repeat at a rate comes from its own server lifetime. A longer re-measure of
    an insufficient point, or another try after an invalid one, is not a repeat."""
    from harness.primitives import trapped_signals

    points = list(points or [])
    start = cfg.start_rps
    if start is None:
        start = next((p.capacity_rps * 0.5 for p in points if p.capacity_rps), None)
    s = PeakSearch(_params(cfg, start or 1.0), points)
    why = ""
    interrupt = StopFlag()
    with trapped_signals(interrupt):
        while True:
            if interrupt.requested:
                why = "interrupted"
                break
            cause = gone()
            if cause is not None:  # died before this point began (no point to blame)
                why = f"{cause} before point {len(s.points) + 1}"
                break
            if start is None:
                rate: float | None = None  # the first point calibrates: "0.5x"
                longer = False
            else:
                step = s.next_step()
                if step.rate_rps is None:
                    why = step.why
                    break
                rate, longer = step.rate_rps, step.longer
                if lifetime is not None and not longer and _judged_in(s.points, rate, lifetime):
                    why = NEW_LIFETIME
                    break
            index = len(s.points) + 1
            p = run_point(cfg, target, out_dir / "points", index, rate, longer, quiet, interrupt)
            if lifetime is not None:
                p = replace(p, lifetime=lifetime)
            # the server's own exit status says more than the run's record of it (a server
            # gone with a Ctrl-C is the user's stop, not a crash)
            cause = None if interrupt.requested else (gone() or p.server_exit)
            if cause is not None:
                p = replace(p, outcome="missed", server_exit=cause)
                s.record(p)
                if on_point is not None:
                    on_point(p)
                show(_point_line(index, p, cfg))
                why = s.next_step().why
                break
            if start is None:
                if p.capacity_rps or p.rate_rps > 0:
                    # half the probe (or of a capacity pinned with --capacity-rps)
                    start = p.capacity_rps * 0.5 if p.capacity_rps else p.rate_rps
                    s = PeakSearch(_params(cfg, start), s.points)
                elif p.outcome != "invalid" or index >= 2:
                    raise TargetUnavailable(
                        "the first point's capacity probe measured nothing "
                        f"({'; '.join(p.reasons) or 'no calibration in its results'}); "
                        "give --start-rps RATE"
                    )
            s.record(p)
            if on_point is not None:
                on_point(p)
            show(_point_line(index, p, cfg))
    return s, why


# why ``search`` stopped when its next point is a repeat of a rate its server lifetime
# already judged (the caller starts a fresh server and searches on)
NEW_LIFETIME = "a repeat is due on a fresh server"


def _judged_in(points: list[Point], rate: float, lifetime: int) -> bool:
    return any(
        p.lifetime == lifetime
        and p.outcome in ("met", "missed", "insufficient")
        and abs(p.rate_rps - rate) < 0.01
        for p in points
    )


def quiet(text: str) -> None:
    """A point's progress shown nowhere (the search prints one line per point)."""


def _params(cfg: PeakConfig, start: float) -> SearchParams:
    return SearchParams(
        start_rps=start,
        tolerance=cfg.tolerance,
        repeats=cfg.repeats,
        max_points=cfg.max_points,
        min_rps=cfg.floor_rps or 1.0,
        precision=cfg.precision,
    )


def _point_line(index: int, p: Point, cfg: PeakConfig) -> str:
    p99 = "fail" if p.p99_ms is not None and math.isinf(p.p99_ms) else _ms(p.p99_ms)
    err = f"{p.error_rate:.2%}" if p.error_rate is not None else "n/a"
    if cfg.in_tokens:
        line = (
            f"  point {index:2d}: {p.rate_rps:8.1f} req/s  {p.outcome.upper():<12} "
            f"TTFT p99 {p99} (SLO {cfg.slo_p99_ms:g} ms)  TPOT p99 {_ms(p.tpot_p99_ms)} "
            f"(SLO {cfg.slo_tpot_ms:g} ms)  not whole {err}  n={p.n}"
        )
    else:
        line = (
            f"  point {index:2d}: {p.rate_rps:8.1f} req/s  {p.outcome.upper():<12} "
            f"p99 {p99} (SLO {cfg.slo_p99_ms:g} ms)  errors {err}  n={p.n}"
        )
    if p.server_exit:
        line += f"\n      {p.server_exit}"
    elif p.outcome in ("invalid", "insufficient") and p.reasons:
        line += f"\n      {p.reasons[0][:200]}"
    return line


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


@contextlib.contextmanager
def target_for(
    *,
    sut_cmd: str | None,
    url: str | None,
    sut_pid: int | None,
    sut_cores: str | None,
    model: str | None,
    log_path: Path,
    extra_args: tuple[str, ...] = (),
    protocol: str | None = None,
    deployment: Mapping[str, Any] | None = None,
) -> Iterator[tuple[RunSettings, Callable[[], str | None], dict[str, Any]]]:
    """The server the points go to, started here (kept between points) or the user's:
    (where the points go, ``gone`` — None while the server runs, else how it ended; always
    None for the user's server, whose death a point's run records — and its description).
    ``deployment``: the ``Target`` fields of --header, --ca-cert, --insecure,
    --metrics-url and --agent (``harness.acceptance.plan.deployment_of`` / ``agent_of``)."""
    deployment = deployment or {}
    if sut_cmd is not None:
        check_sut_cmd(sut_cmd)
        from harness.locust_run import core_split

        split = core_split(sut_cores)
        ready_path = protocols.get(protocol or protocols.DEFAULT).ready_path
        with ManagedServer(
            sut_cmd, cores=sut_cores, log_path=log_path, ready_path=ready_path
        ) as server:
            desc = {**server.proc.describe(), "time_to_ready_s": server.time_to_ready_s}
            loadgen = split[1] if split is not None else None
            where = Target(
                url=server.url, sut_pid=server.pid, model=model, protocol=protocol, **deployment
            )
            points = RunSettings(target=where, extra_args=extra_args, loadgen_cores=loadgen)
            yield points, server.gone, desc
        return
    assert url is not None
    yield (
        RunSettings(
            target=Target(url=url, sut_pid=sut_pid, model=model, protocol=protocol, **deployment),
            extra_args=extra_args,
        ),
        lambda: None,  # not ours to watch: a point's run records a server that died
        {"target": url, "pid": sut_pid, "cmd": None},
    )


def run_peak(
    cfg: PeakConfig,
    out_dir: Path,
    *,
    sut_cmd: str | None,
    url: str | None,
    sut_pid: int | None,
    sut_cores: str | None,
    model: str | None,
    extra_args: tuple[str, ...] = (),
    protocol: str | None = None,
    deployment: Mapping[str, Any] | None = None,
    show: Callable[[str], None] = print,
) -> tuple[dict[str, Any], ExitCode]:
    """The whole of ``harness peak``: the search (or ``cfg.searches`` of them), its
    document, its reports."""
    cfg.validate()
    if sut_cmd is not None:
        check_sut_cmd(sut_cmd)  # before anything is printed or measured
    if protocol is not None:
        protocols.get(protocol)
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    where = {
        "sut_cmd": sut_cmd,
        "url": url,
        "sut_pid": sut_pid,
        "sut_cores": sut_cores,
        "model": model,
        "protocol": protocol,
        "extra_args": extra_args,
        "deployment": deployment or {},
    }
    show(
        f"peak: SLO {cfg.slo_text()}, "
        + (
            f"whole answers >= {1 - cfg.max_error_rate:.1%}; ~{cfg.samples} requests per "
            f"point, at most {cfg.max_point_s:g} s measured"
            if cfg.in_tokens
            else f"errors <= {cfg.max_error_rate:.1%}; {cfg.samples} requests per point "
            f"({cfg.confidence:.0%} early stopping)"
        )
        + (
            ""
            if cfg.searches == 1
            else f"; {cfg.searches} searches, "
            + ("each on a freshly started server" if sut_cmd else "on the same server")
        )
    )
    if cfg.searches == 1:
        s, why, sut_desc = _one_search(cfg, out_dir, where, show)
        doc = new_peak_document(sut_desc)
        doc["peak"] = summarize(cfg, s, why, started=started, extra={})
    else:
        from harness.primitives import trapped_signals
        from harness.report.peak import peak_sentence

        sections: list[dict[str, Any]] = []
        start = cfg.start_rps
        # SIGINT/SIGTERM between two searches (a server starting or stopping) ends the run
        # as one during a search does: what was measured is written
        between = StopFlag()
        with trapped_signals(between):
            for k in range(1, cfg.searches + 1):
                if between.requested:
                    break
                one = replace(cfg, start_rps=start, searches=1)
                t0 = time.monotonic()
                s, why, sut_desc = _one_search(one, out_dir / f"search_{k}", where, show)
                sec = summarize(one, s, why, started=t0, extra={"search": k, "server": sut_desc})
                sections.append(sec)
                show(f"search {k}/{cfg.searches}: {peak_sentence(sec)}")
                # every later search starts where the first did (half its capacity probe):
                # the searches are alike, and the probe is not measured again
                start = start or s.params.start_rps
                if why == "interrupted" or (sec["estimate"] or {}).get("limit") != "slo":
                    break
        doc = new_peak_document(sections[0]["server"])
        doc["peak"] = combine_searches(cfg, sections, started=started)
    code = exit_code(doc["peak"])
    doc["verdict"] = None  # a measurement, not a checklist verdict: see peak.estimate
    write_outputs(out_dir, doc)
    (out_dir / "peak.json").write_text(json.dumps(doc["peak"], indent=2, default=str))
    return doc, code


def _one_search(
    cfg: PeakConfig, out_dir: Path, where: Mapping[str, Any], show: Callable[[str], None]
) -> tuple[PeakSearch, str, dict[str, Any]]:
    """One search on the server ``where`` names (started for it, stopped after it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with target_for(**where, log_path=out_dir / "server.log") as (target, gone, sut_desc):
        url, pid = target.target.url, target.target.sut_pid
        show(f"  server {url}" + (f" (pid {pid})" if pid else ""))
        s, why = search(cfg, target, out_dir, show, gone=gone)
    return s, why, sut_desc
