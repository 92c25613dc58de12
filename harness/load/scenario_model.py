"""The scenario model: frozen dataclasses a scenario file is parsed into.

Parsing and validation live in ``harness.load.scenario`` (``load_scenario``); this module
holds only the shapes and the pure methods the load side uses (stages, rates, timelines).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

# The valid [checks] ids, declared with their checks in harness.catalog (re-exported).
from harness.catalog import CHECK_IDS as CHECK_IDS
from harness.errors import ConfigError
from harness.load.arrivals import Segment

LOAD_MODES = ("open", "closed")
ARRIVALS = ("constant", "poisson")
CHAOS_ACTIONS = ("cpu_hog", "pause", "kill", "terminate", "network")
LINEARITY_VARY = ("threads", "users")
MODES = ("quick", "full")

Mode = Literal["quick", "full"]


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Rate:
    """An open-loop arrival rate: absolute req/s, or a multiple of calibrated capacity."""

    value: float
    relative: bool = False  # True: ``value`` multiplies the calibrated capacity ("0.6x")

    def resolve(self, capacity_rps: float | None) -> float:
        """Requests per second; a relative rate needs the calibrated capacity."""
        if not self.relative:
            return self.value
        if capacity_rps is None or not capacity_rps > 0:
            raise ConfigError(
                f'rate "{self}" is relative to capacity but no capacity is known '
                f"(capacity_rps = {capacity_rps!r}); enable load.calibrate, set "
                "load.capacity_rps, or write an absolute rate in req/s"
            )
        return self.value * capacity_rps

    def __str__(self) -> str:
        return f"{self.value:g}x" if self.relative else f"{self.value:g}"


@dataclass(frozen=True)
class LoadConfig:
    """How load is generated; the ``[load]`` table."""

    mode: Literal["open", "closed"] = "open"
    arrival: Literal["constant", "poisson"] = "poisson"
    request_timeout_s: float = 5.0
    calibrate: bool = False  # resolved: "auto" in TOML → True iff a stage rate is relative
    capacity_rps: float | None = None  # known capacity; skips the calibration probe
    calibration_s: float = 10.0
    calibration_users: int | None = None  # closed-loop users of the probe; None = plugin picks
    seed: int = 1
    max_in_flight: int = 256  # bounded pool, total over all workers; full pool → dropped
    window_s: float = 1.0
    first_requests: int = 100  # the first N requests sent, recorded apart (cold start)
    verify: bool = True  # integrity-check every response against golden outputs
    pool_size: int | None = None  # distinct inputs; None = plugin picks (≥ 4 × max batch)
    fresh_sut: bool = False  # needs a SUT started by the harness just before the load
    # the wire protocol the scenario is written for ("openai": token streams); None: the
    # run's --protocol (default kserve-v2)
    protocol: str | None = None


@dataclass(frozen=True)
class TrafficClass:
    """One priority class of the traffic mix; sent as Triton ``priority``/``timeout``."""

    name: str
    priority: int = 0  # 0 = server default, 1 = highest (Triton)
    share: float = 1.0
    timeout_us: int | None = None


@dataclass(frozen=True)
class Stage:
    """One step of the load: ``rate`` (open loop) xor ``users`` (closed loop)."""

    name: str
    duration_s: float
    rate: Rate | None = None
    users: int | None = None
    start_s: float = 0.0
    threads: int | None = None  # SUT --workers for this stage ({threads}); None = unchanged
    warmup_s: float = 0.0  # first seconds of the stage that checks discard

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def kind(self) -> Literal["open", "closed"]:
        return "open" if self.rate is not None else "closed"

    def rate_rps(self, capacity_rps: float | None) -> float | None:
        return None if self.rate is None else self.rate.resolve(capacity_rps)


@dataclass(frozen=True)
class ChaosEvent:
    """A fault on the timeline, ``at_s`` seconds after the load starts."""

    at_s: float
    action: Literal["cpu_hog", "pause", "kill"]
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    duration_s: float = 0.0  # cpu_hog/pause: how long; kill: wait before the restart

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s


@dataclass(frozen=True)
class LinearitySpec:
    """A closed-loop sweep over N (server threads or client users), for X(N)/(N·X(1))."""

    vary: Literal["threads", "users"] = "threads"
    points: tuple[int, ...] = ()  # () = "auto": 1, 2, 4, … up to the SUT's cores, and cores
    replicates: int = 3
    stage_s: float = 10.0
    warmup_s: float = 2.0
    users_per_thread: int = 16  # vary = "threads": closed-loop users per server thread

    def resolve_points(self, cores: int) -> tuple[int, ...]:
        if self.points:
            return self.points
        if cores < 1:
            raise ConfigError(f"linearity: cores = {cores} must be ≥ 1")
        pts = [1]
        while pts[-1] * 2 <= cores:
            pts.append(pts[-1] * 2)
        if pts[-1] != cores:
            pts.append(cores)
        return tuple(pts)

    def stages(self, cores: int) -> tuple[Stage, ...]:
        out: list[Stage] = []
        t = 0.0
        for n in self.resolve_points(cores):
            for r in range(1, self.replicates + 1):
                threaded = self.vary == "threads"
                out.append(
                    Stage(
                        name=f"n{n}_r{r}",
                        duration_s=self.stage_s,
                        users=n * self.users_per_thread if threaded else n,
                        start_s=t,
                        threads=n if threaded else None,
                        warmup_s=self.warmup_s,
                    )
                )
                t += self.stage_s
        return tuple(out)


@dataclass(frozen=True)
class ContentionBlock:
    kind: Literal["baseline", "hog", "after"]
    stage: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class ContentionSpec:
    """Alternating blocks without/with CPU hogs on the SUT's cores, then an after block."""

    rate: Rate
    block_s: float = 20.0
    cycles: int = 2
    after_s: float = 20.0
    warmup_s: float = 3.0
    hog_cores: int | Literal["sut"] = "sut"  # "sut" = one hog per core the SUT runs on
    blocks: tuple[ContentionBlock, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str  # the file it came from (or the source name given to parse_scenario)
    mode: Mode
    load: LoadConfig
    classes: tuple[TrafficClass, ...]
    stages: tuple[Stage, ...]  # empty only for linearity with points = "auto": see with_cores
    chaos: tuple[ChaosEvent, ...] = ()
    checks: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )  # check id → threshold/parameter overrides ({} = the check's defaults)
    linearity: LinearitySpec | None = None
    contention: ContentionSpec | None = None
    # the checks that answer the scenario's question: each must be judged for a pass
    # (harness.checks.engine.verdict); None = every check in ``checks``
    defined_by: tuple[str, ...] | None = None
    # --duration for a timeline that does not exist yet (linearity points = "auto"):
    # applied by with_cores once the stages are known
    duration_target_s: float | None = None
    # the [llm] table: the token workload a streaming protocol sends
    # (harness.load.llm_workload.config_from_table; checked when the run starts)
    llm: Mapping[str, Any] | None = None

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s if self.stages else 0.0

    @property
    def needs_capacity(self) -> bool:
        return any(s.rate is not None and s.rate.relative for s in self.stages)

    def with_cores(self, cores: int) -> Scenario:
        """Expand what depends on the SUT's core count (linearity ``points = "auto"``)."""
        if self.linearity is None or self.linearity.points:
            return self
        expanded = replace(self, stages=self.linearity.stages(cores), duration_target_s=None)
        if self.duration_target_s is not None:
            return expanded.with_duration(self.duration_target_s)
        return expanded

    def scaled(self, factor: float) -> Scenario:
        """Every duration × ``factor`` (stages, warm-ups, chaos timeline, sweep, blocks)."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ConfigError(f"duration scale = {factor!r} is not valid; use a number > 0")
        f = factor
        lin, con = self.linearity, self.contention
        if lin is not None:
            lin = replace(lin, stage_s=lin.stage_s * f, warmup_s=lin.warmup_s * f)
        if con is not None:
            blocks = tuple(replace(b, start_s=b.start_s * f, end_s=b.end_s * f) for b in con.blocks)
            con = replace(
                con,
                block_s=con.block_s * f,
                after_s=con.after_s * f,
                warmup_s=con.warmup_s * f,
                blocks=blocks,
            )
        return replace(
            self,
            stages=tuple(
                replace(
                    s, duration_s=s.duration_s * f, start_s=s.start_s * f, warmup_s=s.warmup_s * f
                )
                for s in self.stages
            ),
            chaos=tuple(
                replace(e, at_s=e.at_s * f, duration_s=e.duration_s * f) for e in self.chaos
            ),
            linearity=lin,
            contention=con,
        )

    def with_duration(self, total_s: float) -> Scenario:
        """Stretch or shrink the whole timeline to ``total_s`` seconds (``--duration``)."""
        if not (total_s > 0 and math.isfinite(total_s)):
            raise ConfigError(f"--duration = {total_s!r} is not valid; use seconds > 0")
        if not self.stages:
            # the stages depend on the server's cores: with_cores() applies this later
            return replace(self, duration_target_s=total_s)
        return self.scaled(total_s / self.duration_s)

    def stage_at(self, t_s: float) -> Stage | None:
        """The stage running ``t_s`` seconds after the load started; None once finished."""
        for s in self.stages:
            if s.start_s <= t_s < s.end_s:
                return s
        return None

    def segments(self, capacity_rps: float | None) -> tuple[Segment, ...]:
        """Open-loop stages as piecewise-constant rates for ``harness.load.arrivals``."""
        return tuple(
            Segment(s.start_s, s.duration_s, s.rate.resolve(capacity_rps))
            for s in self.stages
            if s.rate is not None
        )

    def defining_checks(self) -> tuple[str, ...]:
        """The check ids a pass of this scenario needs judged (``defined_by``, else every
        check the scenario lists)."""
        return self.defined_by if self.defined_by is not None else tuple(self.checks)

    def check_config(self) -> dict[str, dict[str, Any]]:
        """The ``check_config`` of a scenario result: check id → overrides (plain dicts)."""
        return {cid: copy.deepcopy(dict(over)) for cid, over in self.checks.items()}
