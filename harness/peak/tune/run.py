"""``harness tune``'s run: the search over configurations (``Tuner``), its document and
reports, the fastest configuration's checklist (``run_tune``)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.errors import ExitCode, TargetUnavailable
from harness.locust_run import RunSettings, StopFlag
from harness.peak.config import PeakConfig
from harness.peak.outcomes import Point
from harness.peak.runner import NEW_LIFETIME, quiet, run_point, search, target_for
from harness.peak.tune import verdict
from harness.peak.tune.head_to_head import HeadToHeadRounds
from harness.peak.tune.ranking import (
    FAILED,
    MEASURED,
    NOT_MEASURED,
    config_result,
    pareto,
    rank,
    standing,
    status,
    tied_with,
)
from harness.peak.tune.space import Config, TuneConfig, command, dirname, key
from harness.peak.tune.state import H2H_OPEN, STATE, State
from harness.primitives import trapped_signals


class Tuner(HeadToHeadRounds):
    """The search over configurations: each one's peak (resumed from the state file when
    it has one), the climb (quick) or the cross product (brute), the head-to-head rounds
    (``HeadToHeadRounds``), and the summary ranked."""

    def __init__(
        self,
        tc: TuneConfig,
        out_dir: Path,
        show: Callable[[str], None] = print,
        measure: Callable[
            [Config, PeakConfig, list[Point], Callable[[Point], None]], tuple[list[Point], str]
        ]
        | None = None,
        measure_at: Callable[[Config, PeakConfig, float, int], Point] | None = None,
    ) -> None:
        self.tc = tc
        self.out_dir = out_dir
        self.show = show
        out_dir.mkdir(parents=True, exist_ok=True)
        self.state = State(out_dir / STATE, tc.identity())
        self.measure = measure or self._measure
        # one point at a rate on a fresh server (head-to-head): a simulated ``measure``
        # needs a simulated one too, never a real server behind a simulated search
        self.measure_at = measure_at or (self._measure_at if measure is None else None)
        self.results: dict[str, dict[str, Any]] = {}
        self.pruned: dict[str, str] = {}
        self._replay: list[tuple[str, Point]] = []  # a resumed head to head's points

    def cmd(self, cfg: Config) -> str:
        return command(self.tc.template, cfg, [(dict(s), a) for s, a in self.tc.append])

    def _measure(
        self, cfg: Config, pc: PeakConfig, points: list[Point], on_point: Callable[[Point], None]
    ) -> tuple[list[Point], str]:
        d = self.out_dir / "configs" / dirname(cfg)
        d.mkdir(parents=True, exist_ok=True)
        try:
            return self._search(cfg, pc, points, on_point, d)
        except TargetUnavailable as e:
            # a configuration the server refuses (a bad flag value, a crash at start) is a
            # result of the tune, not the end of it
            first = str(e).splitlines()[0]
            self.show(f"    the server did not start: {first}")
            return points, f"the server did not start: {first}"

    def _search(
        self,
        cfg: Config,
        pc: PeakConfig,
        points: list[Point],
        on_point: Callable[[Point], None],
        d: Path,
    ) -> tuple[list[Point], str]:
        """The configuration's search, each repeat at a rate on a fresh server: the search
        runs on one server until its next point would judge a rate that server already
        judged, then a new server is started and it goes on (``runner.NEW_LIFETIME``). A
        configuration's peak moves between server lifetimes by more than one lifetime's
        repeats show (docs/peak.md, "Each repeat on a fresh server"); with its repeats spread
        over lifetimes, [L, U] and the rank hold that move. A resumed search starts a new
        lifetime."""
        lifetime = max((p.lifetime or 0 for p in points), default=0)
        first = lifetime + 1
        while True:
            lifetime += 1
            log = d / ("server.log" if lifetime == 1 else f"server-{lifetime}.log")
            with contextlib.ExitStack() as stack:
                try:
                    target, gone, _desc = stack.enter_context(
                        target_for(
                            sut_cmd=self.cmd(cfg),
                            url=None,
                            sut_pid=None,
                            sut_cores=self.tc.sut_cores,
                            model=self.tc.model,
                            protocol=self.tc.protocol,
                            log_path=log,
                            extra_args=self.tc.extra_args,
                        )
                    )
                except TargetUnavailable as e:
                    if lifetime == first:
                        raise
                    # what the earlier lifetimes measured stands; the search ends with it
                    return points, f"the server did not start again: {str(e).splitlines()[0]}"
                assert isinstance(target, RunSettings)
                s, why = search(
                    pc,
                    target,
                    d,
                    self.show,
                    points=points,
                    on_point=on_point,
                    gone=gone,
                    lifetime=lifetime,
                )
            points = s.points
            if why != NEW_LIFETIME:
                return points, why
            self.show(f"    a fresh server (lifetime {lifetime + 1}) for the next repeat")

    def _measure_at(self, cfg: Config, pc: PeakConfig, rate: float, lifetime: int) -> Point:
        """One point at ``rate`` on a server started for it (server lifetime ``lifetime``)."""
        d = self.out_dir / "configs" / dirname(cfg)
        d.mkdir(parents=True, exist_ok=True)
        index = len(self.state.points(key(cfg))) + 1
        interrupt = StopFlag()
        try:
            with (
                target_for(
                    sut_cmd=self.cmd(cfg),
                    url=None,
                    sut_pid=None,
                    sut_cores=self.tc.sut_cores,
                    model=self.tc.model,
                    protocol=self.tc.protocol,
                    log_path=d / f"server-{lifetime}.log",
                    extra_args=self.tc.extra_args,
                ) as (target, gone, _desc),
                trapped_signals(interrupt),
            ):
                assert isinstance(target, RunSettings)
                p = run_point(pc, target, d / "points", index, rate, False, quiet, interrupt)
                if interrupt.requested:
                    raise KeyboardInterrupt
                cause = gone() or p.server_exit
                if cause is not None:  # died during the point: the configuration failed
                    p = replace(p, outcome="missed", server_exit=cause)
        except TargetUnavailable as e:
            p = Point(rate, "invalid", reasons=(f"the server did not start: {e}",))
        return p

    def evaluate(self, cfg: Config, hint_rps: float | None) -> dict[str, Any]:
        """One configuration's result: from the state file, or measured now."""
        k = key(cfg)
        if k in self.results:
            return self.results[k]
        done = self.state.done(k)
        if done is not None and not _budget_grew(done, self.tc.peak.max_points):
            self.show(f"[{len(self.results) + 1}] {k}: from {STATE} ({_peak_text(done)})")
            self.results[k] = done
            return done
        prior = self.state.points(k)
        # bracketing starts near the best peak so far (--start-rps / the probe: the first)
        pc = replace(self.tc.peak, start_rps=hint_rps or self.tc.peak.start_rps)
        if hint_rps:
            # a configuration below 0.3 x the best peak so far is out of the running
            pc = replace(pc, floor_rps=0.3 * hint_rps / 0.8)
        if prior and pc.start_rps is None:
            pc = replace(pc, start_rps=prior[0].rate_rps)
        self.show(
            f"[{len(self.results) + 1}] {k}: searching"
            + (f" (resumed after {len(prior)} points)" if prior else "")
            + (f" from {pc.start_rps:.1f} req/s" if pc.start_rps else " (capacity probe first)")
        )
        points, why = self.measure(cfg, pc, prior, lambda p: self.state.add_point(k, p))
        res = config_result(
            cfg, points, why, self.cmd(cfg), pc.floor_rps, pc.repeats, pc.tolerance, pc.max_points
        )
        if why == "interrupted":
            raise KeyboardInterrupt
        self.state.finish(k, res)
        self.results[k] = res
        self.show(
            f"    → {_peak_text(res)}"
            + (
                f", {'TTFT ' if pc.in_tokens else ''}p99 {res['p99_at_peak_ms']:.1f} ms"
                if res.get("p99_at_peak_ms")
                else ""
            )
            + (
                f", TPOT p99 {res['tpot_p99_at_peak_ms']:.1f} ms"
                if res.get("tpot_p99_at_peak_ms")
                else ""
            )
            + (
                f", {res['cpu_ms_per_request']:.2f} CPU ms/request"
                if res.get("cpu_ms_per_request")
                else ""
            )
            + f" ({len(points)} points; {why})"
        )
        return res

    def run(self) -> dict[str, Any]:
        self.started = started = time.monotonic()
        tol = self.tc.peak.tolerance
        if self.tc.mode == "brute":
            hint = None
            for cfg in self.tc.space.all():
                r = self.evaluate(cfg, hint)
                hint = _hint(r, hint)
            self._head_to_head()
        else:
            self._quick()
        ranked = rank(list(self.results.values()), tol)
        return self._summary(ranked, time.monotonic() - started)

    def so_far(self) -> dict[str, Any]:
        """The summary of an interrupted tune: what was measured, ranked, marked interrupted
        (no recommendation: the search did not finish; the state file resumes it)."""
        for k in self.state.data["order"]:
            done = self.state.done(k)
            if done is not None:
                self.results.setdefault(k, done)
        summary = self._summary(
            rank(list(self.results.values()), self.tc.peak.tolerance),
            time.monotonic() - getattr(self, "started", time.monotonic()),
        )
        summary.update(recommended=None, recommended_cmd=None, interrupted=True)
        return summary

    def _quick(self) -> None:
        """Climb on what was measured: measure the default's neighbours, then the
        neighbours of every configuration no measured one is better than (rank 1,
        ``standing``), the highest peak first, until every such configuration's neighbours
        are measured or pruned. Where the search separates one best configuration this is
        the classic hill climb (model_analyzer's quick mode); where it does not (two peaks
        inside each other's evidence), the climb goes on from each of them, not from the
        one whose peak came out higher by chance (which would send two tunes of the same
        space into different regions)."""
        expanded: set[str] = set()
        origin = self.evaluate(self.tc.default, None)
        while origin is not None:
            expanded.add(origin["key"])
            cfg = self.tc.space.parse_config(origin["key"], "--default")
            for nb, dim, d in self.tc.space.neighbours(cfg):
                if key(nb) in self.pruned:
                    continue
                r = self.evaluate(nb, _hint(origin, None))
                if status(r) != MEASURED:  # no peak: no evidence to prune or climb on
                    continue
                base = origin["peak_rps"]  # None: the origin was not measured, or failed
                if base is not None and float(r["peak_rps"]) < float(base) * (
                    1 - self.tc.prune_margin
                ):
                    # a dominated direction: the values further along it are not measured
                    self._prune_beyond(nb, dim, d, r, origin)
            self._head_to_head()
            ranks = standing(list(self.results.values()), self.tc.peak.tolerance)
            frontier = [
                r
                for r in self.results.values()
                if r["key"] not in expanded
                and (ranks.get(r["key"]) == 1 or (not ranks and status(r) != MEASURED))
            ]
            origin = max(
                frontier, key=lambda r: (float(r["peak_rps"] or 0.0), r["key"]), default=None
            )
        if H2H_OPEN in self.state.data:  # rounds a resumed climb did not come back to
            self._head_to_head(final=True)
        left = [key(c) for c in self.tc.space.all() if key(c) not in self.results]
        for k in left:
            self.pruned.setdefault(
                k,
                "not reached: the climb stopped (every neighbour of the configurations no "
                "other was measured better than is measured or pruned)",
            )

    def _prune_beyond(
        self, cfg: Config, dim: str, d: int, r: Mapping[str, Any], from_r: Mapping[str, Any]
    ) -> None:
        names = [n for n, _ in self.tc.space.dims]
        i = names.index(dim)
        values = self.tc.space.dims[i][1]
        j = values.index(cfg[i][1])
        for jj in range(j + d, -1 if d < 0 else len(values), d):
            nxt = list(cfg)
            nxt[i] = (dim, values[jj])
            k = key(tuple(nxt))
            if k not in self.results:
                self.pruned[k] = (
                    f"dominated: {dim} {cfg[i][1]} already fell to {float(r['peak_rps']):.1f} req/s "
                    f"from {float(from_r['peak_rps']):.1f} (> {self.tc.prune_margin:.0%} worse)"
                )

    def _summary(self, ranked: list[Mapping[str, Any]], elapsed: float) -> dict[str, Any]:
        dk = key(self.tc.default)
        default = self.results.get(dk)
        valid = [r for r in ranked if r.get("peak_rps")]
        winner = valid[0] if valid else None
        worst = valid[-1] if valid else None
        margin = None
        if winner and default and default.get("peak_rps"):
            margin = winner["peak_rps"] / default["peak_rps"] - 1.0
        over_worst = None
        if winner and worst and worst.get("peak_rps"):
            over_worst = winner["peak_rps"] / worst["peak_rps"] - 1.0
        return {
            "mode": self.tc.mode,
            # the configuration the ranking puts first; recommended unless its quick
            # checklist fails (``conclude``)
            "fastest": winner["key"] if winner else None,
            "objective": (
                f"highest peak under the SLO (open-loop Poisson, {self.tc.peak.slo_text()}, "
                + (
                    f"whole answers >= {1 - self.tc.peak.max_error_rate:.1%} of the streams"
                    if self.tc.peak.in_tokens
                    else f"errors <= {self.tc.peak.max_error_rate:.1%}"
                )
                + (
                    f"; a peak is a rate that held it in all {self.tc.peak.repeats} repeats"
                    if self.tc.peak.repeats > 1
                    else ""
                )
                + "); "
                "a configuration ranks below another only when that one met the SLO in every "
                f"outcome up to a rate at least {self.tc.peak.tolerance:.0%} above the one from "
                "which it missed in every outcome (the search's resolution; shared ranks: not "
                "separated by the search); within a "
                f"rank, peaks within {self.tc.peak.tolerance:.0%} tie, broken by lower CPU "
                "ms/request; only a configuration whose search ended at the server's edge is "
                "ranked on its peak (one stopped by the load generator, the point budget or "
                "the search's ceiling is not measured; one whose server died or did not start "
                "failed, below every measured one); the first is recommended if its quick "
                "checklist passes"
            ),
            "template": self.tc.template,
            "space": {n: list(v) for n, v in self.tc.space.dims},
            "space_size": self.tc.space.size,
            "default": dk,
            "ranked": [dict(r) for r in ranked],
            "recommended": winner["key"] if winner else None,
            "tied_with_recommended": tied_with(ranked, winner["key"]) if winner else [],
            "recommended_cmd": winner["cmd"] if winner else None,
            "default_is_best": bool(winner and winner["key"] == dk),
            "margin_over_default": margin,
            "margin_over_worst": over_worst,
            "worst": worst["key"] if worst else None,
            "pareto": pareto(ranked),
            "pruned": [{"key": k, "reason": why} for k, why in sorted(self.pruned.items())],
            "head_to_head": list(self.state.data.get("head_to_head") or []),
            "measured": len(self.results),
            "resumed": self.state.resumed,
            "elapsed_s": round(elapsed, 1),
            "slo_p99_ms": self.tc.peak.slo_p99_ms,
            "slo_tpot_ms": self.tc.peak.slo_tpot_ms,
            "peak_config": {
                "confidence": self.tc.peak.confidence,
                "tolerance": self.tc.peak.tolerance,
                "samples_per_point": self.tc.peak.samples,
            },
        }


def _peak_text(r: Mapping[str, Any]) -> str:
    st = status(r)
    if st == FAILED:
        return f"failed: {r.get('status_reason')}"
    if st == NOT_MEASURED:
        return f"not measured: {r.get('status_reason') or 'every point invalid'}"
    return f"peak {float(r['peak_rps']):.1f} req/s under the SLO"


def _budget_grew(done: Mapping[str, Any], max_points: int) -> bool:
    """Whether a configuration stopped by its point budget has more points now (the same
    tune resumed with a larger ``--max-points``): its search goes on from its points."""
    return (
        status(done) == NOT_MEASURED
        and done.get("limit") == "budget"
        and int(done.get("max_points") or max_points) < max_points
    )


def _hint(r: Mapping[str, Any], prev: float | None) -> float | None:
    """Where the next configuration's bracketing starts: 0.8 x the best peak seen (the
    search goes up by 1.5 x or down by 0.5 x from there)."""
    pk = float(r.get("peak_rps") or 0.0)
    if pk <= 0:
        return prev
    return 0.8 * pk


def write_outputs(out_dir: Path, doc: dict[str, Any]) -> None:
    from harness.report import tune as report
    from harness.results import write_document

    write_document(out_dir / "results.json", doc)
    (out_dir / "summary.md").write_text(report.tune_markdown(doc))
    (out_dir / "report.html").write_text(report.tune_html(doc))


def _raise_interrupt(signum: int) -> None:
    raise KeyboardInterrupt


def run_tune(
    tc: TuneConfig,
    out_dir: Path,
    *,
    checklist: bool,
    fresh: bool = False,
    show: Callable[[str], None] = print,
) -> tuple[dict[str, Any], ExitCode]:
    """The whole of ``harness tune``: search, rank, reports, the winner's checklist."""
    from harness.results import machine_metadata, new_document

    tc.peak.validate()
    out_dir.mkdir(parents=True, exist_ok=True)
    if fresh and (out_dir / STATE).exists():
        (out_dir / STATE).unlink()
    tuner = Tuner(tc, out_dir, show)
    if tuner.state.resumed:
        done = sum(1 for e in tuner.state.data["configs"].values() if e.get("done"))
        show(f"tune: resuming from {out_dir / STATE} ({done} configurations done)")
    # SIGTERM (a CI job cancelled, `kill`) ends a tune as Ctrl-C does, also between points
    # (a server starting or stopping: the points trap it themselves): the server is stopped
    # on the way out and what was measured is written, not left to the guard and the state
    # file alone
    with trapped_signals(_raise_interrupt, (signal.SIGTERM,)):
        try:
            summary = tuner.run()
        except KeyboardInterrupt:
            doc = new_document(machine=machine_metadata(), sut={"cmd": tc.template}, loadgen={})
            doc["tune"] = tuner.so_far()
            write_outputs(out_dir, doc)
            show(
                f"tune: interrupted — what was measured is in {out_dir / 'summary.md'}; "
                f"the same command resumes from {out_dir / STATE}"
            )
            raise
    doc = new_document(machine=machine_metadata(), sut={"cmd": tc.template}, loadgen={})
    doc["tune"] = summary
    if not checklist:
        summary["checklist_skipped"] = "--no-checklist"
    elif summary.get("recommended_cmd"):
        show(f"tune: quick checklist on {summary['recommended']} …")
        try:
            argv = verdict.checklist_argv(
                summary["recommended_cmd"],
                out_dir / "checklist",
                tc.sut_cores,
                tc.protocol,
                tc.model,
            )
            summary["checklist"] = verdict.run_checklist(argv, out_dir / "checklist")
        except KeyboardInterrupt:
            summary["checklist"] = {
                "exit_code": int(ExitCode.INTERRUPTED),
                "verdict": "not_judged",
                "failed_checks": [],
                "out": str(out_dir / "checklist"),
                "line": "`harness acceptance --quick` on it: interrupted",
            }
            verdict.conclude(summary)
            write_outputs(out_dir, doc)
            raise
    code = verdict.conclude(summary)
    write_outputs(out_dir, doc)
    return doc, code
