"""``harness tune``: which server configuration sustains the most traffic under the SLO.

A configuration is one value per ``--space`` dimension, filled into the ``--sut-cmd``
template (``{port}`` is the harness's). For each configuration measured: start the
server, find its peak under the SLO (``harness.peak.runner.search``: bisection to
``--tolerance``, then the edge repeats), record the server's CPU per request and its RSS at
the peak, stop the server.

Objective (stated in every report): the highest peak under the SLO wins; peaks within
one search tolerance of each other are a tie, broken by the lower CPU per request (the
cheaper configuration to run at the same traffic). Only a configuration whose search
ended at the server's edge has a peak to rank (``config_status``: measured); one stopped
by the load generator, its point budget or the search's ceiling is not measured, one whose
server died or would not start failed — neither is ever recommended. The tune's verdict
and exit code are the fastest configuration's quick-checklist verdict (``verdict_of``); a
fastest configuration whose checklist fails is not recommended (``conclude``).

Search, after Triton model_analyzer's two modes:

* ``brute`` — every configuration of the cross product;
* ``quick`` — start at the default configuration, measure its neighbours (one
  dimension one step away, in the order the values were given), then the neighbours of
  every configuration no other one was measured better than (rank 1: with one best,
  hill climbing; with ties, the climb goes on from each); a neighbour whose peak fell
  more than ``prune_margin`` below the configuration it was reached from prunes the rest
  of that direction (values further along it are not measured: a dominated region).

Resumable: ``DIR/tune_state.json`` is rewritten after every point, holding each
configuration's points; a killed tune started again with the same arguments measures
only what is missing (a configuration cut mid-search goes on from its points; head-to-head
rounds cut mid-way go on from the points they took, ``Tuner._resume_rounds``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shlex
import signal
import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, ExitCode, TargetUnavailable
from harness.peak.runner import (
    NEW_LIFETIME,
    PeakConfig,
    Target,
    _quiet,
    run_point,
    search,
    target_for,
)
from harness.peak.search import INVALID_TRIES, Point, Verdicts

STATE = "tune_state.json"
_H2H_OPEN = "head_to_head_open"  # the rounds under way, in the state file
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Config = tuple[tuple[str, str], ...]  # ((dimension, value), ...) in --space order


@dataclass(frozen=True)
class Space:
    dims: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, specs: Sequence[str], template: str) -> Space:
        """``name=v1,v2,...`` each; every name must be a placeholder of the template and
        every placeholder but {port}/{threads} a dimension (ConfigError naming the fix)."""
        if not specs:
            raise ConfigError("--space is required, e.g. --space max_batch=1,8,32")
        dims: list[tuple[str, tuple[str, ...]]] = []
        for spec in specs:
            name, sep, values = spec.partition("=")
            name = name.strip()
            vals = tuple(v.strip() for v in values.split(","))
            if not sep or not _NAME.match(name) or not values.strip():
                raise ConfigError(
                    f"--space has value {spec!r}; expected NAME=V1,V2,... such as max_batch=1,8,32"
                )
            if len(set(vals)) != len(vals):
                raise ConfigError(f"--space {name} lists a value twice: {values!r}")
            if any(n == name for n, _ in dims):
                raise ConfigError(f"--space {name} is given twice; give each dimension once")
            dims.append((name, vals))
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        names = {n for n, _ in dims}
        if "port" not in fields:
            raise ConfigError(
                f"--sut-cmd has value {template!r}: no {{port}} placeholder; the harness "
                "picks the port, e.g. 'python -m reference_server --port {port} ...'"
            )
        missing = sorted(names - fields)
        if missing:
            raise ConfigError(
                f"--space {', '.join(missing)} is not a placeholder of --sut-cmd; write "
                + " ".join(f"{{{m}}}" for m in missing)
                + " where its value goes"
            )
        unknown = sorted(fields - names - {"port", "threads"})
        if unknown:
            raise ConfigError(
                f"--sut-cmd has placeholder(s) {', '.join('{' + u + '}' for u in unknown)} "
                "with no --space; add --space NAME=V1,V2 for each"
            )
        return cls(tuple(dims))

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.dims)

    def all(self) -> list[Config]:
        names = [n for n, _ in self.dims]
        return [
            tuple(zip(names, combo, strict=True))
            for combo in itertools.product(*(v for _, v in self.dims))
        ]

    def parse_config(self, text: str, flag: str) -> Config:
        """``name=value,name=value`` (every dimension) → a Config of this space."""
        got: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, sep, val = part.partition("=")
            if not sep:
                raise ConfigError(f"{flag} has value {text!r}; expected NAME=VALUE,NAME=VALUE")
            got[k.strip()] = val.strip()
        out = []
        for name, values in self.dims:
            if name not in got:
                raise ConfigError(f"{flag} has no value for {name}; give every dimension")
            if got[name] not in values:
                raise ConfigError(
                    f"{flag} {name}={got[name]} is not in --space {name}={','.join(values)}"
                )
            out.append((name, got.pop(name)))
        if got:
            raise ConfigError(f"{flag} names {', '.join(got)}, not a --space dimension")
        return tuple(out)

    def partial(self, text: str, flag: str) -> dict[str, str]:
        """``name=value,...`` naming some dimensions (a selector)."""
        got: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, sep, val = part.partition("=")
            names = dict(self.dims)
            if not sep or k.strip() not in names or val.strip() not in names[k.strip()]:
                raise ConfigError(
                    f"{flag} has selector {text!r}; expected NAME=VALUE pairs of the --space "
                    "dimensions, e.g. max_batch=8,workers=1"
                )
            got[k.strip()] = val.strip()
        return got

    def neighbours(self, cfg: Config) -> list[tuple[Config, str, int]]:
        """Configs one step away in one dimension: (config, dimension, direction)."""
        out = []
        for i, (name, values) in enumerate(self.dims):
            j = values.index(cfg[i][1])
            for d in (-1, 1):
                if 0 <= j + d < len(values):
                    nxt = list(cfg)
                    nxt[i] = (name, values[j + d])
                    out.append((tuple(nxt), name, d))
        return out


def key(cfg: Config) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg)


def command(template: str, cfg: Config, append: Sequence[tuple[Mapping[str, str], str]]) -> str:
    """The template with the configuration's values ({port} and {threads} left for the
    harness), plus the arguments ``--append-for`` gives configurations it selects."""
    values = {k: shlex.quote(v) for k, v in cfg}
    cmd = template.format(**values, port="{port}", threads="{threads}")
    d = dict(cfg)
    for selector, extra in append:
        if all(d.get(k) == v for k, v in selector.items()):
            cmd += " " + extra
    return cmd


@dataclass(frozen=True)
class TuneConfig:
    template: str
    space: Space
    default: Config
    peak: PeakConfig
    mode: str = "quick"  # or "brute"
    prune_margin: float = 0.2
    append: tuple[tuple[tuple[tuple[str, str], ...], str], ...] = ()
    sut_cores: str | None = None
    model: str | None = None
    extra_args: tuple[str, ...] = ()

    def identity(self) -> dict[str, Any]:
        """What a state file must match to be resumed."""
        return {
            "template": self.template,
            "space": [[n, list(v)] for n, v in self.space.dims],
            "default": key(self.default),
            "slo_p99_ms": self.peak.slo_p99_ms,
            "max_error_rate": self.peak.max_error_rate,
            "confidence": self.peak.confidence,
            "tolerance": self.peak.tolerance,
            "repeats": self.peak.repeats,
            "append": [[dict(s), a] for s, a in self.append],
        }


# --- results per configuration ----------------------------------------------------------


# a configuration's status: its search ended at the server's edge (``measured``: a peak,
# or no rate met the SLO), or was stopped by something else — the load generator, the
# point budget, the search's ceiling (``not_measured``: no answer about the server) — or
# the server failed: it died during a point, or would not start (``failed``)
MEASURED, NOT_MEASURED, FAILED = "measured", "not_measured", "failed"
DID_NOT_START = "the server did not start"


def config_result(
    cfg: Config,
    points: Sequence[Point],
    why: str,
    cmd: str,
    floor_rps: float | None = None,
    repeats: int = 1,
    tolerance: float = 0.1,
    max_points: int = 40,
    search_limit: str | None = None,
) -> dict[str, Any]:
    """What one configuration's search found (peak = L: the highest rate that met the SLO
    in every repeat below every rate that missed it in every repeat; its p99, CPU/request
    and RSS at that rate) and its status (``config_status``). ``search_limit``: how its
    own search ended, when ``points`` hold more than that search's (head-to-head points,
    which move [L, U] but not what stopped the search)."""
    from harness.peak.search import PeakSearch, SearchParams

    params = SearchParams(
        # where the search began: it decides the next step only while nothing was judged
        start_rps=points[0].rate_rps if points and points[0].rate_rps > 0 else 1.0,
        repeats=repeats,
        tolerance=tolerance,
        max_points=max_points,
        min_rps=floor_rps or 1.0,
    )
    est = PeakSearch(params, points).estimate()
    limit = est.limit if est.limit == "server_exit" else (search_limit or est.limit)
    status, reason = config_status(points, why, limit, max_points)
    at = None
    if est.low_rps is not None and status == MEASURED:
        cands = [p for p in points if p.outcome == "met" and abs(p.rate_rps - est.low_rps) < 0.01]
        at = cands[-1] if cands else None
    return {
        "key": key(cfg),
        "config": dict(cfg),
        "cmd": cmd,
        "status": status,
        "status_reason": reason,
        # measured: L, or 0.0 (judged, and no rate met the SLO in every repeat); None when
        # not measured or failed — no peak to rank or recommend
        "peak_rps": (est.low_rps or 0.0) if status == MEASURED else None,
        "held_rps": est.low_rps,  # L as far as the points went, whatever the status
        "upper_rps": est.high_rps,
        "limit": limit,
        "repeats": repeats,
        "confidence": est.confidence,  # of [peak, upper] holding the edge (0: no repeats)
        "stopped": why,
        "floor_rps": floor_rps,
        "max_points": max_points,
        "p99_at_peak_ms": at.p99_ms if at else None,
        "p50_at_peak_ms": at.p50_ms if at else None,
        "cpu_ms_per_request": at.cpu_ms_per_request if at else None,
        "rss_mib": max((p.rss_mib for p in points if p.rss_mib is not None), default=None),
        # server lifetimes the search ran on (its repeats each on a fresh server)
        "lifetimes": len({p.lifetime for p in points if p.lifetime is not None}) or 1,
        "points": [p.as_dict() for p in points],
        "n_points": len(points),
    }


def config_status(
    points: Sequence[Point], why: str, limit: str | None, max_points: int
) -> tuple[str, str | None]:
    """(status, why) of a configuration's search: ``failed`` when its server died during a
    point ("crashed at 450.0 req/s (the server exited (signal 9, SIGKILL), point 7)") or
    would not start; ``measured`` when the search ended at the server's edge (limit
    ``slo``) or found no rate that met the SLO (``none_met``); else ``not_measured``, with
    what stopped it instead — the load generator, the point budget, the search's ceiling:
    what `harness peak` calls no answer (exit 3)."""
    from harness.peak.runner import server_gone

    for i, q in enumerate(points, start=1):
        if q.server_exit is not None:
            at = f"at {q.rate_rps:.1f} req/s" if q.rate_rps > 0 else "while calibrating"
            return FAILED, f"crashed {at} ({q.server_exit}, point {i})"
    if why.startswith(DID_NOT_START) or server_gone(why):
        return FAILED, why
    if limit in ("slo", "none_met"):
        return MEASURED, None
    if limit == "generator":
        v = Verdicts.of(points)
        at = [r for r in v.by_rate if v.invalid_count(r) >= INVALID_TRIES]
        return NOT_MEASURED, (
            "the load generator, not the server, was the limit"
            + (f" ({max(at):.1f} req/s invalid {INVALID_TRIES} times)" if at else "")
        )
    if limit == "max_rps":
        return NOT_MEASURED, f"it met the SLO up to the search's ceiling ({why})"
    if limit == "budget" and len(points) >= max_points:
        return NOT_MEASURED, (
            f"its {max_points}-point budget was spent before the server's edge was found"
        )
    return NOT_MEASURED, f"its search stopped before the server's edge was found ({why})"


def status(r: Mapping[str, Any]) -> str:
    """A result's status; for a result written before statuses were kept: from its limit
    (``slo``/``none_met`` measured, another one not), else from its peak (None: not
    measured)."""
    if r.get("status"):
        return str(r["status"])
    if r.get("peak_rps") is None:
        return NOT_MEASURED
    if r.get("limit") is not None and r["limit"] not in ("slo", "none_met"):
        return NOT_MEASURED
    return MEASURED


def evidence(r: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(held, missed_from) of one configuration's search, over *every* judged outcome:
    ``held`` the highest rate met in all its outcomes with every outcome at every lower rate
    met too; ``missed_from`` the lowest rate missed in all its outcomes with every outcome
    at every higher rate missed too. On a search whose outcomes are monotone in the rate
    they are its [L, U]; where they are not (a miss at one rate, then a met above it — a
    noisy server, or a search that ran out of points before its repeats), they widen to
    where every outcome agrees. Without points (a result from before points were kept):
    the peak and the rate it missed at."""
    pts = r.get("points")
    if not pts:
        return (float(r["peak_rps"]) or None) if r.get("peak_rps") else None, r.get("upper_rps")
    v = Verdicts.of([Point.from_dict(p) for p in pts])
    rates = sorted(x for x in v.by_rate if v.judged(x))
    held = None
    for x in rates:
        if any(o != "met" for o in v.judged(x)):
            break
        held = x
    missed_from = None
    for x in reversed(rates):
        if any(o != "missed" for o in v.judged(x)):
            break
        missed_from = x
    return held, missed_from


def met_once(r: Mapping[str, Any]) -> bool:
    """Whether any of a configuration's points met the SLO."""
    return any(p.get("outcome") == "met" for p in r.get("points") or [])


def standing(results: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, int]:
    """Each measured configuration's rank: 1 + how many others were *measured* better —
    held the SLO in every outcome up to a rate at least ``tolerance`` above the one from
    which it missed the SLO in every outcome (``evidence``). Configurations no other one
    was measured better than share rank 1, and so on: the search resolves peaks to its
    tolerance (it stops bisecting a bracket that narrow, and the table ties peaks that
    close), so two whose evidence overlaps, or is apart by less than that, are not
    separated, and the table says so ("=3") instead of ordering them on noise. Not at
    zero margin: a tune separated 32/20/2 from 8/5/1 at one rate (322 req/s, met in all
    three of one's server lifetimes, missed in all four of the other's) and the next tune,
    whose lifetimes of 32/20/2 held only 246, could not — an order finer than the search's
    own resolution is one set of server lifetimes, not the configurations. Judged on every outcome, not on [L, U] alone: a search out of
    points can leave U on one miss that mets above it contradict (a tune ranked 32/5/2
    below 8/5/1 on one miss at 220.8 req/s by 0.4 ms — 32/5/2 had met at 245, 270 and 294
    — and the next tune could not separate them). A configuration that never missed (no
    ``missed_from``) has no one measured better. One that met the SLO nowhere (peak 0, no
    point met: it missed everywhere the search looked, and the tune stops looking below its
    floor, so its edge is not resolved) is out of the running: every configuration that
    held the SLO somewhere is better than it. One whose repeats met somewhere but missed at
    every rate it measured (peak 0 too: p99 hovering at the SLO over a range of rates, no
    rate met in every repeat) has its edge inside what was measured, not below the floor:
    it is judged like any other, on where it missed in every outcome (a tune put 32/5/2,
    met at 159.8–199.8 req/s in some lifetimes and missed there in others, with the planted
    no-batching regression at the bottom; the other tune of the pair, and every tune
    before, had it with the configurations it is within the resolution of). One with
    every point invalid (peak None) has no rank; nor has one not measured or failed
    (``status``): ``rank`` places those."""
    measured = [r for r in results if status(r) == MEASURED]
    ev = {r["key"]: evidence(r) for r in measured}
    out: dict[str, int] = {}
    for r in measured:
        missed_from = ev[r["key"]][1]
        better = 0
        if not float(r["peak_rps"]) and not met_once(r):
            better = sum(1 for h in measured if ev[h["key"]][0] is not None)
        elif missed_from is not None:
            better = sum(
                1
                for h in measured
                if h["key"] != r["key"]
                and ev[h["key"]][0] is not None
                and float(ev[h["key"]][0]) >= float(missed_from) * (1 + tolerance)
            )
        out[r["key"]] = 1 + better
    return out


def contested(
    results: Sequence[Mapping[str, Any]], tolerance: float, band: float
) -> dict[str, list[tuple[str, float, float]]]:
    """The separations that alone keep a configuration out of rank 1, each closer than
    ``band``: for a configuration r some other one is measured better than (``standing``),
    where every one of those held the SLO less than ``band`` above the rate from which r
    missed it, the list of (better one, the rate it held, the rate r missed from). Those
    decide the recommendation and where the climb goes on from, and they are the ones a
    drift over minutes can make: a configuration's points run back to back, so a few slow
    minutes land on one configuration's whole evidence (a tune separated the reference
    server's default, which held 510.6 req/s, from 32/20/1, which missed 449.3 in three
    server lifetimes — 14 % apart, with the server using 32 % more CPU per request than in
    the next tune, where 32/20/1 met 451.1 in all six). A separation wider than ``band``
    on every side is not contested: a configuration that far below is a dominated
    direction to the climb as well (``TuneConfig.prune_margin``)."""
    measured = [r for r in results if status(r) == MEASURED]
    ev = {r["key"]: evidence(r) for r in measured}
    out: dict[str, list[tuple[str, float, float]]] = {}
    for r in measured:
        missed_from = ev[r["key"]][1]
        if (not float(r["peak_rps"]) and not met_once(r)) or missed_from is None:
            continue
        better = [
            (h["key"], float(ev[h["key"]][0]), float(missed_from))
            for h in measured
            if h["key"] != r["key"]
            and ev[h["key"]][0] is not None
            and float(ev[h["key"]][0]) >= float(missed_from) * (1 + tolerance)
        ]
        if better and all(held < missed_from * (1 + band) for _, held, _ in better):
            out[r["key"]] = better
    return out


def rank(results: Sequence[Mapping[str, Any]], tolerance: float) -> list[Mapping[str, Any]]:
    """Best first, each row with its ``rank`` (``standing``; shared ranks are ties the
    search could not separate). Within a rank: the highest peak under the SLO; peaks within
    ``tolerance`` of the best peak of their group are a tie, broken by CPU per request
    (lower first), then by key. Configurations that failed (the server died during a point,
    or would not start) rank below every measured one (each measured one is better);
    configurations not measured (``status``) come last, unranked: they have no peak to
    rank on."""
    ranks = standing(results, tolerance)
    failed = sorted((r for r in results if status(r) == FAILED), key=lambda r: r["key"])
    unmeasured = sorted((r for r in results if status(r) == NOT_MEASURED), key=lambda r: r["key"])
    results = [r for r in results if status(r) == MEASURED]
    out: list[Mapping[str, Any]] = []
    for level in sorted(set(ranks.values())):
        ordered = sorted(
            (r for r in results if ranks[r["key"]] == level),
            key=lambda r: (-float(r["peak_rps"] or 0.0), r["key"]),
        )
        i = 0
        while i < len(ordered):
            head = float(ordered[i]["peak_rps"] or 0.0)
            group = [
                r for r in ordered[i:] if float(r["peak_rps"] or 0.0) >= head * (1 - tolerance)
            ]
            if head <= 0:
                group = ordered[i:]
            group.sort(
                key=lambda r: (
                    r.get("cpu_ms_per_request") is None,
                    r.get("cpu_ms_per_request") or 0.0,
                    r["key"],
                )
            )
            out += [{**r, "rank": level} for r in group]
            i += len(group)
    out += [{**r, "rank": 1 + len(results)} for r in failed]
    return out + [{**r, "rank": None} for r in unmeasured]  # last: no evidence to rank them on


def tied_with(ranked: Sequence[Mapping[str, Any]], k: str) -> list[str]:
    """The other configurations sharing ``k``'s rank (not separated from it by the search)."""
    mine = next((r.get("rank") for r in ranked if r["key"] == k), None)
    if mine is None:
        return []
    return [r["key"] for r in ranked if r["key"] != k and r.get("rank") == mine]


def pareto(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Keys on the throughput–p99 Pareto front: no other configuration has both a higher
    (or equal) peak and a lower (or equal) p99 at its peak, one of them strictly."""
    pts = [
        (r["key"], float(r["peak_rps"]), float(r["p99_at_peak_ms"]))
        for r in results
        if r.get("peak_rps") and r.get("p99_at_peak_ms") is not None
    ]
    front = []
    for k, x, y in pts:
        dominated = any(
            (x2 >= x and y2 <= y) and (x2 > x or y2 < y) for k2, x2, y2 in pts if k2 != k
        )
        if not dominated:
            front.append(k)
    return front


# --- the state file ---------------------------------------------------------------------


class State:
    """``DIR/tune_state.json``: the tune's identity and every configuration's points."""

    def __init__(self, path: Path, identity: Mapping[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"identity": dict(identity), "configs": {}, "order": []}
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                raise ConfigError(
                    f"{path} is not a tune state file (bad JSON); remove it or use another --out"
                ) from None
            if old.get("identity") != self.data["identity"]:
                raise ConfigError(
                    f"{path} holds a different tune (other --sut-cmd/--space/--default/SLO); "
                    "use another --out, or --fresh to start this one over"
                )
            self.data = old
        self.resumed = bool(self.data["configs"])

    def points(self, k: str) -> list[Point]:
        entry = self.data["configs"].get(k) or {}
        return [Point.from_dict(p) for p in entry.get("points") or []]

    def done(self, k: str) -> dict[str, Any] | None:
        entry = self.data["configs"].get(k) or {}
        return entry.get("result") if entry.get("done") else None

    def add_point(self, k: str, p: Point) -> None:
        entry = self.data["configs"].setdefault(k, {"points": [], "done": False})
        entry["points"].append(p.as_dict())
        if k not in self.data["order"]:
            self.data["order"].append(k)
        self.save()

    def finish(self, k: str, result: Mapping[str, Any]) -> None:
        entry = self.data["configs"].setdefault(k, {"points": [], "done": False})
        entry["done"] = True
        entry["result"] = dict(result)
        if k not in self.data["order"]:
            self.data["order"].append(k)
        self.save()

    def note(self, **kw: Any) -> None:
        self.data.update(kw)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


# --- the search over configurations -----------------------------------------------------


class Tuner:
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
        d = self.out_dir / "configs" / _dirname(cfg)
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
        repeats show — 32/5/2 of the reference server held 204.6 req/s and missed at 242.9
        in one tune, held 301.6 in the next — and two tunes then ordered it against its
        neighbours in opposite ways; with its repeats spread over lifetimes, [L, U] and the
        rank hold that move. A resumed search starts a new lifetime."""
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
                            log_path=log,
                            extra_args=self.tc.extra_args,
                        )
                    )
                except TargetUnavailable as e:
                    if lifetime == first:
                        raise
                    # what the earlier lifetimes measured stands; the search ends with it
                    return points, f"the server did not start again: {str(e).splitlines()[0]}"
                assert isinstance(target, Target)
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
        from harness.acceptance import _Interrupt

        d = self.out_dir / "configs" / _dirname(cfg)
        d.mkdir(parents=True, exist_ok=True)
        index = len(self.state.points(key(cfg))) + 1
        try:
            with (
                target_for(
                    sut_cmd=self.cmd(cfg),
                    url=None,
                    sut_pid=None,
                    sut_cores=self.tc.sut_cores,
                    model=self.tc.model,
                    log_path=d / f"server-{lifetime}.log",
                    extra_args=self.tc.extra_args,
                ) as (target, gone, _desc),
                _Interrupt() as interrupt,
            ):
                assert isinstance(target, Target)
                p = run_point(pc, target, d / "points", index, rate, False, _quiet, interrupt)
                if interrupt.requested:
                    raise KeyboardInterrupt
                cause = gone() or p.server_exit
                if cause is not None:  # died during the point: the configuration failed
                    p = replace(p, outcome="missed", server_exit=cause)
        except TargetUnavailable as e:
            p = Point(rate, "invalid", reasons=(f"the server did not start: {e}",))
        return p

    def _add_point(self, cfg: Config, p: Point) -> None:
        """A head-to-head point joins the configuration's evidence; its result is redone."""
        k = key(cfg)
        self.state.add_point(k, p)
        self.state.finish(k, self._evidence_now(k))

    def _evidence_now(self, k: str) -> dict[str, Any]:
        """``k``'s result on its points in the state file, less those of a resumed head to
        head not yet given back (``_resume_rounds``)."""
        pts = self.state.points(k)
        pts = pts[: len(pts) - sum(1 for k2, _ in self._replay if k2 == k)]
        old = self.results[k]
        cfg = self.tc.space.parse_config(k, "--default")
        res = config_result(
            cfg,
            pts,
            old["stopped"],
            self.cmd(cfg),
            old.get("floor_rps"),
            self.tc.peak.repeats,
            self.tc.peak.tolerance,
            old.get("max_points") or self.tc.peak.max_points,
            search_limit=old.get("limit"),
        )
        self.results[k] = res
        return res

    def _head_to_head(self, final: bool = False) -> None:
        """Settle each contested separation (``contested``) by measuring the two sides
        alternately, each point on a fresh server: the worse one at the rate it missed
        from, then the better one at the rate it held, ``repeats`` rounds — A, B, A, B, so
        that a drift over minutes falls on both sides of the comparison, not on one side's
        whole evidence. The points join each side's evidence: a separation the
        interleaved rounds reproduce (the worse one missed, the better one met, every
        round) stands; one they do not is no longer a separation (the worse one met where
        it had missed, or the better one missed where it had held) and the two share a
        rank. Each pair is settled once; the outcome is kept in the state file."""
        pm = self.tc.prune_margin
        band = pm / (1 - pm)  # r missed from at least (1 - prune_margin) x what h held
        tol = self.tc.peak.tolerance
        settled = self.state.data.setdefault("head_to_head", [])
        done = {(c["better"], c["worse"]) for c in settled}
        while True:
            rec = self.state.data.get(_H2H_OPEN)
            if rec is not None:  # a tune killed mid-rounds: the same rounds, from where they were
                if any(k not in self.results for k in rec["base"]):
                    if not final:
                        return  # the resumed climb has not come back to where they ran
                    for k in rec["base"]:
                        self.evaluate(self.tc.space.parse_config(k, "--default"), None)
                r, missed = rec["worse"], float(rec["missed_rps"])
                pairs = [(h, float(held), missed) for h, held in rec["pairs"]]
                self._resume_rounds(rec)
                self.show(
                    f"    head to head resumed: {r} against {', '.join(h for h, _, _ in pairs)}"
                    f" ({len(self._replay)} points from {STATE})"
                )
            else:
                todo = {
                    r: [b for b in better if (b[0], r) not in done]
                    for r, better in contested(list(self.results.values()), tol, band).items()
                }
                todo = {r: b for r, b in todo.items() if b}
                if not todo:
                    return
                if self.measure_at is None:
                    raise RuntimeError("a simulated measure needs a simulated measure_at")
                r = max(todo, key=lambda k: (float(self.results[k]["peak_rps"] or 0.0), k))
                pairs = todo[r]
                missed = pairs[0][2]
                self.show(
                    f"    head to head: {r} missed from {missed:.1f} req/s, "
                    + ", ".join(f"{h} held {held:.1f}" for h, held, _ in pairs)
                    + f" — {self.tc.peak.repeats} alternating rounds, each on a fresh server"
                )
                # kept before the first point: a kill mid-rounds resumes these rounds
                self.state.note(
                    **{
                        _H2H_OPEN: {
                            "worse": r,
                            "missed_rps": missed,
                            "pairs": [[h, held] for h, held, _ in pairs],
                            # each side's points before the rounds, and the rounds' order
                            "base": {
                                k: len(self.state.points(k)) for k in [r, *(h for h, _, _ in pairs)]
                            },
                            "taken": [],
                        }
                    }
                )

            def apart(h: str, r: str = r) -> bool:
                if FAILED in (status(self.results[h]), status(self.results[r])):
                    return False  # a server died in the rounds: that configuration failed
                held, _ = evidence(self.results[h])
                missed_from = evidence(self.results[r])[1]
                return (
                    held is not None and missed_from is not None and held >= missed_from * (1 + tol)
                )

            rounds = 0
            for _ in range(self.tc.peak.repeats):
                live = [(h, held) for h, held, _ in pairs if apart(h)]
                if not live:
                    break
                ok = self._point_at(r, missed) == "missed"
                for h, held in live:
                    if not apart(h):
                        break
                    ok = self._point_at(h, held) == "met" and ok
                rounds += ok
            self._give_back()
            for h, held, _ in pairs:
                rec = {
                    "better": h,
                    "worse": r,
                    "held_rps": held,
                    "missed_rps": missed,
                    "stands": apart(h),
                    "rounds_reproduced": rounds,
                    # a side whose server died during the rounds (then it failed)
                    "failed": [k for k in (h, r) if status(self.results[k]) == FAILED],
                }
                settled.append(rec)
                done.add((h, r))
                self.show(
                    f"    → {h} over {r}: "
                    + (
                        f"{', '.join(rec['failed'])} failed: its server died in the rounds"
                        if rec["failed"]
                        else "stands (reproduced in alternating rounds)"
                        if rec["stands"]
                        else "not reproduced: not separated"
                    )
                )
            self.state.data.pop(_H2H_OPEN, None)
            self.state.save()

    def _resume_rounds(self, rec: Mapping[str, Any]) -> None:
        """The rounds' points, already in the state file, are held back from each side's
        evidence and given back one by one in the order they were measured (``_point_at``):
        the rounds' decisions — which side is still apart, whether a round reproduced the
        separation — are then made on the evidence each side had at that point of the
        rounds, as in a tune never killed, and only the rounds' missing points are
        measured. Nothing is taken out of the state file: a second kill loses nothing."""
        taken = {k: self.state.points(k)[n:] for k, n in rec["base"].items()}
        self._replay = []
        for k in rec["taken"]:  # in the order measured (a point and its entry: one save)
            if taken.get(k):
                self._replay.append((k, taken[k].pop(0)))
        for k in rec["base"]:
            self._evidence_now(k)

    def _point_at(self, k: str, rate: float) -> str:
        cfg = self.tc.space.parse_config(k, "--default")
        p = None
        for _ in range(2):  # an invalid point (the box was the limit) is tried once more
            if (
                self._replay
                and self._replay[0][0] == k
                and math.isclose(self._replay[0][1].rate_rps, rate)
            ):
                p = self._replay.pop(0)[1]  # measured before the kill: given back
                self._evidence_now(k)
                self.show(
                    f"      {k} at {rate:.1f} req/s (lifetime {p.lifetime}): {p.outcome}"
                    f" (from {STATE})"
                )
            else:
                self._give_back()
                pts = self.state.points(k)
                lifetime = max((p.lifetime or 1 for p in pts), default=0) + 1
                assert self.measure_at is not None
                p = replace(self.measure_at(cfg, self.tc.peak, rate, lifetime), lifetime=lifetime)
                self.state.data[_H2H_OPEN]["taken"].append(k)
                self._add_point(cfg, p)  # one save: the point and its place in the rounds
                self.show(f"      {k} at {rate:.1f} req/s (lifetime {lifetime}): {p.outcome}")
            if p.outcome != "invalid":
                break
        assert p is not None
        return p.outcome

    def _give_back(self) -> None:
        """Every point a resumed head to head still holds back joins its side's evidence
        (the rounds ended; or they took another turn than before the kill, which the same
        decisions on the same evidence cannot — kept all the same: nothing measured is
        dropped)."""
        held_back = {k for k, _ in self._replay}
        self._replay = []
        for k in held_back:
            self.state.finish(k, self._evidence_now(k))

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
            + (f", p99 {res['p99_at_peak_ms']:.1f} ms" if res.get("p99_at_peak_ms") else "")
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
        one whose peak came out higher by chance — two tunes of the same space otherwise
        explored different regions after a 5 % coin toss between tied configurations."""
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
        if _H2H_OPEN in self.state.data:  # rounds a resumed climb did not come back to
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
                "highest peak under the SLO (open-loop Poisson, p99 over all requests <= "
                f"{self.tc.peak.slo_p99_ms:g} ms, errors <= {self.tc.peak.max_error_rate:.1%}"
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


def unmeasured(summary: Mapping[str, Any]) -> list[str]:
    """Configurations the search set out to measure and could not: their searches were
    stopped by the load generator, the point budget or the search's ceiling."""
    return [r["key"] for r in summary.get("ranked") or [] if status(r) == NOT_MEASURED]


def failed(summary: Mapping[str, Any]) -> list[str]:
    """Configurations whose server died during a point, or would not start."""
    return [r["key"] for r in summary.get("ranked") or [] if status(r) == FAILED]


def measured_worse(top: Mapping[str, Any], r: Mapping[str, Any], tolerance: float) -> bool:
    """Whether ``top`` was measured better than ``r`` (``standing``'s rule: ``top`` held the
    SLO in every outcome up to a rate at least ``tolerance`` above the one from which ``r``
    missed it in every outcome) — what a configuration's points show even when its search
    did not end at its edge."""
    held, missed_from = evidence(top)[0], evidence(r)[1]
    return held is not None and missed_from is not None and held >= missed_from * (1 + tolerance)


def verdict_of(summary: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The tune's verdict and the configurations that leave its recommendation open.

    ``fail``: no configuration measured and some failed (their servers died or did not
    start), or none met the SLO at any rate measured, or the fastest configuration's quick
    checklist failed (then nothing is recommended: ``conclude``). ``invalid``: no
    configuration measured and none failed (nothing to rank), or the fastest one's
    checklist was invalid, or a configuration not measured was not measured worse than the
    fastest (its search stopped before showing it below: the recommendation is only the
    best of the rest — those are the keys returned). ``not_judged``: the fastest one's
    checklist judged nothing. ``pass``: the fastest configuration's checklist passed (or
    was not asked for: ``--no-checklist``) and every configuration not measured was
    measured worse than it. Failed configurations below a measured winner do not move it:
    they are ranked, never recommended."""
    from harness.results import combine_verdicts

    ranked = summary.get("ranked") or []
    if not any(status(r) == MEASURED for r in ranked):
        return ("fail" if failed(summary) else "invalid"), []
    fastest = summary.get("fastest", summary.get("recommended"))
    top = next((r for r in ranked if r["key"] == fastest), None)
    if top is None:
        return "fail", []
    tol = float((summary.get("peak_config") or {}).get("tolerance") or 0.0)
    open_ = [
        r["key"] for r in ranked if status(r) == NOT_MEASURED and not measured_worse(top, r, tol)
    ]
    verdicts = ["invalid"] if open_ else []
    chk = summary.get("checklist")
    if chk:
        verdicts.append(chk.get("verdict") or "not_judged")
    return combine_verdicts(verdicts) or "pass", open_


def conclude(summary: dict[str, Any]) -> ExitCode:
    """The tune's verdict into ``summary`` (``verdict``, ``left_open``); a fastest
    configuration whose quick checklist failed is not recommended. Its exit code."""
    verdict, open_ = verdict_of(summary)
    summary["verdict"] = verdict
    summary["left_open"] = open_
    if (summary.get("checklist") or {}).get("verdict") == "fail":
        summary.update(recommended=None, recommended_cmd=None, tied_with_recommended=[])
    return ExitCode.for_verdict(verdict)


def _hint(r: Mapping[str, Any], prev: float | None) -> float | None:
    """Where the next configuration's bracketing starts: 0.8 x the best peak seen (the
    search goes up by 1.5 x or down by 0.5 x from there)."""
    pk = float(r.get("peak_rps") or 0.0)
    if pk <= 0:
        return prev
    return 0.8 * pk


def _dirname(cfg: Config) -> str:
    return "_".join(f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '', v) or 'none'}" for k, v in cfg)


def exit_code(summary: Mapping[str, Any]) -> ExitCode:
    """The tune's verdict (``verdict_of``) as an exit code: 0 pass, 1 fail, 3 invalid,
    4 not judged."""
    return ExitCode.for_verdict(verdict_of(summary)[0])


# `harness acceptance`'s exit code → the checklist's verdict; any other code (2: it could
# not start, a signal) judged nothing
_CHECKLIST_VERDICT = {0: "pass", 1: "fail", 3: "invalid", 4: "not_judged"}


def run_checklist(cmd: str, out_dir: Path, sut_cores: str | None) -> dict[str, Any]:
    """``harness acceptance --quick`` on the recommended configuration, as a subprocess
    (its own exit code and reports in ``out_dir``)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "harness", "acceptance", "--quick", "--sut-cmd", cmd]
    argv += ["--out", str(out_dir)]
    if sut_cores:
        argv += ["--sut-cores", sut_cores]
    proc = subprocess.run(argv, capture_output=True, text=True)
    return checklist_result(proc.returncode, proc.stdout, proc.stderr, out_dir)


def checklist_result(code: int, stdout: str, stderr: str, out_dir: Path) -> dict[str, Any]:
    """The quick checklist's run as the tune keeps it: its verdict (from its exit code),
    the checks that failed (from its results.json, when it wrote one) and its line."""
    from harness.errors import HarnessError
    from harness.results import load_document

    failed_checks: list[str] = []
    with contextlib.suppress(HarnessError, OSError, ValueError):
        doc = load_document(out_dir / "results.json")
        failed_checks = list(
            dict.fromkeys(
                str(c.get("id"))
                for sc in doc.get("scenarios") or []
                for c in sc.get("checks") or []
                if c.get("passed") is False
            )
        )
    lines = [x for x in stdout.strip().splitlines() if x.strip()]
    verdict_line = next((x for x in lines if x.startswith(_VERDICT_WORDS)), None)
    said = verdict_line or (lines[-1] if lines else stderr.strip()[-300:])
    return {
        "exit_code": code,
        "verdict": _CHECKLIST_VERDICT.get(code, "not_judged"),
        "failed_checks": failed_checks,
        "out": str(out_dir),
        "line": f"`harness acceptance --quick` on it: {said} (exit {code}; {out_dir}/summary.md)",
    }


_VERDICT_WORDS = ("PASS", "FAIL", "INVALID", "NOT JUDGED")


def write_outputs(out_dir: Path, doc: dict[str, Any]) -> None:
    from harness.peak import report
    from harness.results import write_document

    write_document(out_dir / "results.json", doc)
    (out_dir / "summary.md").write_text(report.tune_markdown(doc))
    (out_dir / "report.html").write_text(report.tune_html(doc))


def _raise_interrupt(signum: int, frame: object) -> None:
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
    previous = signal.getsignal(signal.SIGTERM)
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        signal.signal(signal.SIGTERM, _raise_interrupt)
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
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, previous)
    doc = new_document(machine=machine_metadata(), sut={"cmd": tc.template}, loadgen={})
    doc["tune"] = summary
    if not checklist:
        summary["checklist_skipped"] = "--no-checklist"
    elif summary.get("recommended_cmd"):
        show(f"tune: quick checklist on {summary['recommended']} …")
        try:
            summary["checklist"] = run_checklist(
                summary["recommended_cmd"], out_dir / "checklist", tc.sut_cores
            )
        except KeyboardInterrupt:
            summary["checklist"] = {
                "exit_code": int(ExitCode.INTERRUPTED),
                "verdict": "not_judged",
                "failed_checks": [],
                "out": str(out_dir / "checklist"),
                "line": "`harness acceptance --quick` on it: interrupted",
            }
            conclude(summary)
            write_outputs(out_dir, doc)
            raise
    code = conclude(summary)
    write_outputs(out_dir, doc)
    return doc, code
