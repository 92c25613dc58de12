"""``harness peak``: measure points for ``harness.peak.search`` with the harness's own runs.

One point is one headless Locust run (``harness.acceptance.run_one``, the path every
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
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, ExitCode, TargetUnavailable
from harness.peak.search import (
    EdgeFit,
    Estimate,
    PeakSearch,
    Point,
    SearchParams,
    edge_confidence,
    fit_edge,
    knee,
    samples_needed,
    searches_interval,
)

POINT_STAGE = "point"


@dataclass(frozen=True)
class PeakConfig:
    """What ``harness peak`` was asked (validated: ``validate()`` raises ConfigError)."""

    slo_p99_ms: float
    max_error_rate: float = 0.01
    confidence: float = 0.95
    tolerance: float = 0.05
    repeats: int = 3
    start_rps: float | None = None
    warmup_s: float = 3.0
    min_point_s: float = 5.0
    max_point_s: float = 60.0
    max_points: int = 30
    request_timeout_s: float | None = None
    seed: int = 1
    # tune: below this rate a configuration is out of the running (its peak is "below
    # floor_rps", not searched further: a dominated configuration costs few points)
    floor_rps: float | None = None
    # the refine phase (search.SearchParams.precision): harness peak's --precision; None
    # for tune and --capacity=peak, whose answers are [L, U] from the repeats alone
    precision: float | None = None
    # harness peak's --searches: K > 1 searches, each on a freshly started server (when
    # the harness starts it), the peak their mean and its interval from their spread
    # (search.searches_interval); each search without a refine phase
    searches: int = 1

    def validate(self) -> PeakConfig:
        def bad(flag: str, value: Any, valid: str) -> ConfigError:
            return ConfigError(f"{flag} has value {value!r}; expected {valid}")

        if not (self.slo_p99_ms > 0 and math.isfinite(self.slo_p99_ms)):
            raise bad("--slo-p99-ms", self.slo_p99_ms, "a latency in ms > 0, e.g. 100")
        if not 0 <= self.max_error_rate < 1:
            raise bad("--max-error-rate", self.max_error_rate, "a fraction in [0, 1), e.g. 0.01")
        if not 0.5 <= self.confidence < 1:
            raise bad("--confidence", self.confidence, "a probability in [0.5, 1), e.g. 0.95")
        if not 0 < self.tolerance < 1:
            raise bad("--tolerance", self.tolerance, "a fraction in (0, 1), e.g. 0.05")
        if not 1 <= self.repeats <= 10:
            raise bad("--repeats", self.repeats, "an integer in 1..10, e.g. 3")
        if self.start_rps is not None and not self.start_rps > 0:
            raise bad("--start-rps", self.start_rps, "a rate in req/s > 0")
        if not (self.warmup_s >= 0 and 0 < self.min_point_s <= self.max_point_s):
            raise bad(
                "--point-s",
                (self.min_point_s, self.max_point_s),
                "0 < min <= max seconds per point",
            )
        if self.max_points < 2:
            raise bad("--max-points", self.max_points, "an integer >= 2")
        if self.precision is not None and not 0 < self.precision < 1:
            raise bad("--precision", self.precision, "a fraction in (0, 1), e.g. 0.15")
        if not 1 <= self.searches <= 20:
            raise bad("--searches", self.searches, "an integer in 1..20, e.g. 6")
        if self.searches > 1 and self.precision is not None:
            raise ConfigError(
                "--precision and --searches > 1 are both set; give one: with several searches "
                "the interval comes from their spread (--precision 0 or --searches 1)"
            )
        return self

    @property
    def samples(self) -> int:
        return samples_needed(self.confidence)

    def point_seconds(self, rate: float, longer: bool = False) -> float:
        """Measured seconds at ``rate`` for ``samples`` requests (doubled when the last
        try had too few), within [min_point_s, max_point_s]."""
        need = self.samples * (2 if longer else 1) / max(rate, 1e-9)
        hi = self.max_point_s * (2 if longer else 1)
        return round(min(hi, max(self.min_point_s, need)), 2)


def point_scenario(cfg: PeakConfig, rate: float | None, seconds: float) -> str:
    """The TOML of one point: one open-loop Poisson stage (``rate`` None: half the
    calibrated capacity, "0.5x"), judged by the steady-state checks at the SLO."""
    rate_text = '"0.5x"' if rate is None else f"{rate:.3f}"
    timeout = f"request_timeout_s = {cfg.request_timeout_s:g}\n" if cfg.request_timeout_s else ""
    # the warmup is a stage of its own at the same rate (one continuous open loop): the
    # checks judge the point stage only, so the queue's fill-up is never in its figures
    warmup = (
        f'[[stages]]\nname = "warmup"\nduration_s = {cfg.warmup_s:.2f}\nrate = {rate_text}\n\n'
        if cfg.warmup_s > 0
        else ""
    )
    return (
        "# generated by `harness peak`: one point of the peak search\n"
        'name = "peak_point"\n'
        'description = "One open-loop point of the peak search"\n\n'
        "[load]\n"
        'mode = "open"\n'
        'arrival = "poisson"\n'
        f"seed = {cfg.seed}\n"
        "calibration_s = 5\n"
        f"{timeout}\n"
        f"{warmup}"
        "[[stages]]\n"
        f'name = "{POINT_STAGE}"\n'
        f"duration_s = {seconds:.2f}\n"
        f"rate = {rate_text}\n\n"
        "[checks]\n"
        f'"steady.p99_ms" = {{ stage = "{POINT_STAGE}", threshold = {cfg.slo_p99_ms:g}, '
        f"confidence = {cfg.confidence:g} }}\n"
        f'"steady.error_rate" = {{ stage = "{POINT_STAGE}", threshold = {cfg.max_error_rate:g} }}\n'
        f'"steady.throughput" = {{ stage = "{POINT_STAGE}" }}\n'
        '"accounting.balanced" = {}\n'
    )


def classify(sc: Mapping[str, Any], cfg: PeakConfig, run_dir: str | None = None) -> Point:
    """A judged point scenario result → a ``Point`` (its outcome and curve figures)."""
    from harness.analysis.percentiles import (
        count_above_ms,
        percentile_ms,
        percentile_with_failures_ms,
    )
    from harness.results import records

    names = [POINT_STAGE]
    hist = records.latency(sc, stage_names=names)
    c = records.counters(sc, stage_names=names) or dict(records.ZERO_COUNTERS)
    stage = records.stage(sc, POINT_STAGE) or {}
    secs = max(1e-9, float(stage.get("end_s", 0)) - float(stage.get("start_s", 0)))
    rate = float(stage.get("rate_rps") or 0.0)
    failed = records.failed_total(c) - int((c.get("failed") or {}).get("cancelled") or 0)
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
        p99c, errc = checks.get("steady.p99_ms") or {}, checks.get("steady.error_rate") or {}
        if p99c.get("passed") is False or errc.get("passed") is False:
            outcome = "missed"
            reasons += [str(x.get("detail")) for x in (p99c, errc) if x.get("passed") is False]
        elif p99c.get("passed") is True and errc.get("passed") is True:
            outcome = "met"
        else:
            outcome = "insufficient"
            reasons += [str(x.get("skipped")) for x in (p99c, errc) if x.get("skipped")]
    return Point(
        rate_rps=round(rate, 3),
        outcome=outcome,  # type: ignore[arg-type]
        p50_ms=percentile_ms(hist, 50.0),
        p99_ms=p99,
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


# --- the server, kept running between points --------------------------------------------


class ManagedServer:
    """A ``--sut-cmd`` server started once for a whole search (``SutProcess`` starts the
    guard that stops its process group when this process dies: ``harness.sut_guard``)."""

    def __init__(
        self,
        cmd: str,
        *,
        cores: str | None,
        log_path: Path,
        ready_timeout_s: float = 60.0,
    ) -> None:
        from harness import sut

        split = sut.split_cores(cores).sut
        self.proc = sut.SutProcess(cmd, cores=split, log_path=log_path)
        self.ready_timeout_s = ready_timeout_s
        self.time_to_ready_s: float | None = None

    def __enter__(self) -> ManagedServer:
        self.proc.start()
        try:
            self.time_to_ready_s = self.proc.wait_ready(timeout=self.ready_timeout_s)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def gone(self) -> str | None:
        """None while the server runs; once it has exited, how (``exit_text``)."""
        return None if self.proc.alive() else exit_text(self.proc.returncode)


# --- one search ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the points go: a started server's URL and pid (or the user's --target)."""

    url: str
    pid: int | None
    model: str | None = None
    extra_args: tuple[str, ...] = ()
    loadgen_cores: tuple[int, ...] | None = None  # acceptance.core_split's, when apart


def run_point(
    cfg: PeakConfig,
    target: Target,
    out_dir: Path,
    index: int,
    rate: float | None,
    longer: bool,
    show: Callable[[str], None],
    interrupt: Any,
) -> Point:
    """One Locust run of a point scenario; its judged results as a ``Point``."""
    from harness.acceptance import Plan, run_one
    from harness.acceptance import Target as RunTarget

    out_dir.mkdir(parents=True, exist_ok=True)
    seconds = cfg.point_seconds(rate or 100.0, longer)
    name = f"point_{index:02d}"
    toml = out_dir / f"{name}.toml"
    toml.write_text(point_scenario(cfg, rate, seconds))
    plan = Plan(
        scenarios=(str(toml),),
        mode="quick",
        out_dir=out_dir,
        target=RunTarget(url=target.url, sut_pid=target.pid, model=target.model),
        # the golden outputs once per server process, not once per point
        extra_args=(*target.extra_args, "--golden-cache", str(out_dir / "golden.json")),
        loadgen_cores=target.loadgen_cores,
    )
    run = run_one(plan, str(toml), index, 0, interrupt, show)
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
    target: Target,
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
    from harness.acceptance import _Interrupt

    points = list(points or [])
    start = cfg.start_rps
    if start is None:
        start = next((p.capacity_rps * 0.5 for p in points if p.capacity_rps), None)
    s = PeakSearch(_params(cfg, start or 1.0), points)
    why = ""
    with _Interrupt() as interrupt:
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
            p = run_point(cfg, target, out_dir / "points", index, rate, longer, _quiet, interrupt)
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


def _quiet(text: str) -> None:
    pass


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


def summarize(
    cfg: PeakConfig, s: PeakSearch, why: str, *, started: float, extra: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``peak`` section of results.json."""
    est: Estimate = s.estimate()
    if why == "interrupted":
        est = replace(est, limit="budget", note=why)
    elif server_gone(why) and est.limit != "server_exit":  # died between two points
        est = replace(est, peak_rps=None, confidence=0.0, limit="server_exit", note=why)
    curve = sorted(
        (p.as_dict() for p in s.points if p.outcome != "invalid"), key=lambda d: d["rate_rps"]
    )
    calibration = next((p.capacity_rps for p in s.points if p.capacity_rps), None)
    fit = fit_edge(s.points)
    headline, source, interval, interval_from = headline_peak(est, fit, cfg.precision)
    return {
        **_settings(cfg),
        "estimate": est.as_dict(),
        "peak_rps": headline,
        "peak_from": source,
        # the stated interval: the fitted edge's 95 % interval when the refine phase ran
        # and closed it, else [L, U] from the repeats; band_rps is always [L, U]
        "interval_rps": list(interval),
        "interval_from": interval_from,
        "band_rps": [est.low_rps, est.high_rps],
        "knee_rps": knee(s.points),
        "edge_fit": fit.as_dict() if fit else None,
        "calibration_rps": calibration,
        "stopped": why,
        "points": [p.as_dict() for p in s.points],
        "curve": curve,
        "elapsed_s": round(time.monotonic() - started, 1),
        **extra,
    }


def _settings(cfg: PeakConfig) -> dict[str, Any]:
    """What a ``peak`` section states about how it was asked (one search or several)."""
    return {
        "slo_p99_ms": cfg.slo_p99_ms,
        "max_error_rate": cfg.max_error_rate,
        "confidence": cfg.confidence,
        "samples_per_point": cfg.samples,
        "tolerance": cfg.tolerance,
        "repeats": cfg.repeats,
        "edge_confidence": edge_confidence(cfg.repeats),
        "config": asdict(cfg),
    }


def headline_peak(
    est: Estimate, fit: EdgeFit | None, precision: float | None = None
) -> tuple[float | None, str, tuple[float | None, float | None], str]:
    """The peak printed, where it comes from, the stated interval and what it is.

    With the refine phase (``precision``) and a fit whose 95 % interval is closed: the
    fitted edge and that interval — a confidence interval of the printed number, from
    every judged point, whose coverage is measured (tests/test_peak_edge_fit.py).
    Otherwise [L, U] from the repeats is the interval, and the peak is the logistic edge
    when it lies inside it (it uses the bracketing and bisection points too, so it is not
    tied to the bisection's grid the way the midpoint is), else the midpoint. A server that
    died during the search has no peak, whatever its points before held."""
    lo, hi = est.low_rps, est.high_rps
    if est.limit == "server_exit":
        return None, "none: the server died", (lo, hi), "repeats"
    if (
        precision is not None
        and fit is not None
        and lo is not None
        and None not in fit.ci_rps
        and est.limit == "slo"
    ):
        return fit.edge_rps, "logistic edge", fit.ci_rps, "edge_ci"
    if fit is not None and lo is not None and hi is not None and lo <= fit.edge_rps <= hi:
        return fit.edge_rps, "logistic edge", (lo, hi), "repeats"
    return est.peak_rps, "midpoint of [L, U]" if hi is not None else "L", (lo, hi), "repeats"


def exit_code(peak: Mapping[str, Any]) -> ExitCode:
    """0: a peak with its interval; 1: no rate met the SLO, or the server died during a
    point (exited, or stopped answering); 3: the generator (not the server) set the limit
    or the search stopped before it had an answer."""
    limit = (peak.get("estimate") or {}).get("limit")
    if limit == "slo" and peak.get("peak_rps"):
        return ExitCode.PASS
    if limit in ("none_met", "server_exit"):
        return ExitCode.FAIL
    return ExitCode.INVALID


def write_outputs(out_dir: Path, doc: dict[str, Any]) -> dict[str, Path]:
    """results.json (the harness's envelope, scenarios empty: every point's own results are
    in points/point_NN/), summary.md and report.html."""
    from harness.peak import report
    from harness.results import write_document

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results": write_document(out_dir / "results.json", doc)}
    paths["summary"] = out_dir / "summary.md"
    paths["summary"].write_text(report.peak_markdown(doc))
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(report.peak_html(doc))
    return paths


def new_peak_document(sut: Mapping[str, Any]) -> dict[str, Any]:
    from harness.results import machine_metadata, new_document

    return new_document(machine=machine_metadata(), sut=dict(sut), loadgen={})


def check_sut_cmd(sut_cmd: str) -> None:
    if "{port}" not in sut_cmd:
        raise ConfigError(
            f"--sut-cmd has value {sut_cmd!r}: no {{port}} placeholder; the harness picks "
            "the port, e.g. 'python -m reference_server --port {port}'"
        )


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
) -> Iterator[tuple[Target, Callable[[], str | None], dict[str, Any]]]:
    """The server the points go to, started here (kept between points) or the user's:
    (where the points go, ``gone`` — None while the server runs, else how it ended; always
    None for the user's server, whose death a point's run records — and its description)."""
    if sut_cmd is not None:
        check_sut_cmd(sut_cmd)
        from harness.acceptance import core_split

        split = core_split(sut_cores)
        with ManagedServer(sut_cmd, cores=sut_cores, log_path=log_path) as server:
            desc = {**server.proc.describe(), "time_to_ready_s": server.time_to_ready_s}
            loadgen = split[1] if split is not None else None
            yield Target(server.url, server.pid, model, extra_args, loadgen), server.gone, desc
        return
    assert url is not None
    yield (
        Target(url, sut_pid, model, extra_args),
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
    show: Callable[[str], None] = print,
) -> tuple[dict[str, Any], ExitCode]:
    """The whole of ``harness peak``: the search (or ``cfg.searches`` of them), its
    document, its reports."""
    cfg.validate()
    if sut_cmd is not None:
        check_sut_cmd(sut_cmd)  # before anything is printed or measured
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    where = {
        "sut_cmd": sut_cmd,
        "url": url,
        "sut_pid": sut_pid,
        "sut_cores": sut_cores,
        "model": model,
        "extra_args": extra_args,
    }
    show(
        f"peak: SLO p99 <= {cfg.slo_p99_ms:g} ms over all requests, errors <= "
        f"{cfg.max_error_rate:.1%}; {cfg.samples} requests per point "
        f"({cfg.confidence:.0%} early stopping)"
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
        from harness.acceptance import _Interrupt
        from harness.peak.report import peak_sentence

        sections: list[dict[str, Any]] = []
        start = cfg.start_rps
        # SIGINT/SIGTERM between two searches (a server starting or stopping) ends the run
        # as one during a search does: what was measured is written
        with _Interrupt() as between:
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
        show(f"  server {target.url}" + (f" (pid {target.pid})" if target.pid else ""))
        s, why = search(cfg, target, out_dir, show, gone=gone)
    return s, why, sut_desc


def combine_searches(
    cfg: PeakConfig, sections: list[dict[str, Any]], *, started: float
) -> dict[str, Any]:
    """The ``peak`` section of results.json for ``cfg.searches`` searches: the peak is the
    mean of their peaks and its interval is Student's t over them
    (``search.searches_interval``). Every search must have found its edge under the SLO;
    one that did not (cut short, the server exited, no rate met the SLO) is the run's
    answer, and the searches measured so far are still written."""
    k_asked = cfg.searches
    points = [{**p, "search": sec["search"]} for sec in sections for p in sec["points"]]
    pts = [Point.from_dict(p) for p in points]
    fit = fit_edge(pts)
    bands = [sec["band_rps"] for sec in sections]
    answered = [
        sec
        for sec in sections
        if (sec["estimate"] or {}).get("limit") == "slo" and sec.get("peak_rps")
    ]
    lows = [b[0] for b in bands if b[0] is not None]
    highs = [b[1] for b in bands if b[1] is not None]
    band = [min(lows, default=None), max(highs, default=None)]
    spread: float | None = None
    if len(answered) == k_asked:
        si = searches_interval([sec["peak_rps"] for sec in answered])
        est: dict[str, Any] = {
            "low_rps": band[0],
            "high_rps": band[1],
            "peak_rps": si.peak_rps,
            "confidence": si.confidence,
            "limit": "slo",
            "mixed_rps": [],
            "note": f"{k_asked} searches",
        }
        peak, interval, spread = si.peak_rps, list(si.ci_rps), si.sd_rps
        stopped = "found"
    elif len(answered) == len(sections):  # interrupted between two searches
        stopped = f"interrupted after {len(sections)} of {k_asked} searches"
        est = {
            "low_rps": band[0],
            "high_rps": band[1],
            "peak_rps": None,
            "confidence": 0.0,
            "limit": "budget",
            "mixed_rps": [],
            "note": stopped,
        }
        peak, interval = None, [None, None]
    else:
        bad = next(sec for sec in sections if sec not in answered)
        est = dict(bad["estimate"])
        est["note"] = f"search {bad['search']} of {k_asked}: {bad['stopped'] or est.get('note')}"
        est["peak_rps"] = None
        if est.get("limit") == "slo":  # found, then cut: no answer from it
            est["limit"] = "budget"
        peak, interval, stopped = None, [None, None], bad["stopped"]
    first = sections[0]
    return {
        **_settings(cfg),
        "estimate": est,
        "peak_rps": peak,
        "peak_from": f"mean of {k_asked} searches",
        "interval_rps": interval,
        "interval_from": "searches",
        "band_rps": band,
        "searches_asked": k_asked,
        "spread_rps": spread,  # the searches' sample sd
        "searches": [
            {key: v for key, v in sec.items() if key not in ("points", "curve", "config")}
            | {"n_points": len(sec["points"])}
            for sec in sections
        ],
        "knee_rps": knee(pts),
        "edge_fit": fit.as_dict() if fit else None,
        "calibration_rps": first.get("calibration_rps"),
        "stopped": stopped,
        "points": points,
        "curve": sorted(
            (p for p in points if p["outcome"] != "invalid"), key=lambda d: d["rate_rps"]
        ),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
