"""Scenario files (``scenarios/*.toml``) parsed into frozen, validated dataclasses.

The format is documented in ``docs/scenarios.md`` and in each packaged file's comments.
Every mistake is a ``ConfigError`` whose message names the file, the key, the value and
what is valid, because a typo in a load test must never pass silently: an unknown key
or check id is an error, not a default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from harness.load.scenario_model import (  # re-exported: the public names live here
    ARRIVALS,
    CHAOS_ACTIONS,
    CHECK_IDS,
    LINEARITY_VARY,
    LOAD_MODES,
    MODES,
    ChaosEvent,
    ContentionBlock,
    ContentionSpec,
    LinearitySpec,
    LoadConfig,
    Mode,
    Rate,
    Scenario,
    Stage,
    TrafficClass,
)

__all__ = [
    "ARRIVALS",
    "CHAOS_ACTIONS",
    "CHECK_IDS",
    "LINEARITY_VARY",
    "LOAD_MODES",
    "MODES",
    "ChaosEvent",
    "ContentionBlock",
    "ContentionSpec",
    "LinearitySpec",
    "LoadConfig",
    "Mode",
    "Rate",
    "Scenario",
    "Stage",
    "TrafficClass",
    "load_scenario",
    "packaged_scenarios",
    "parse_rate",
    "parse_scenario",
    "resolve_scenario",
]

# --------------------------------------------------------------------------- loading


def packaged_scenarios() -> tuple[str, ...]:
    """Names of the scenario files shipped in the ``scenarios`` package."""
    root = resources.files("scenarios")
    return tuple(
        sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))
    )


def resolve_scenario(name_or_path: str | Path) -> Path:
    """A bare name (``"spike"``) → the packaged file; anything else is a path."""
    text = str(name_or_path)
    path = Path(text)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or text.endswith(".toml")
    if looks_like_path:
        if path.is_file():
            return path
        raise ConfigError(
            f"scenario file {text} does not exist; give a path to a .toml file or one of "
            f"the packaged names: {', '.join(packaged_scenarios())}"
        )
    packaged = resources.files("scenarios").joinpath(f"{text}.toml")
    if packaged.is_file():
        return Path(str(packaged))
    if path.is_file():
        return path
    known = packaged_scenarios()
    hint = difflib.get_close_matches(text, known, n=1)
    maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ConfigError(
        f"scenario {text!r} is not a packaged scenario{maybe}; known scenarios: "
        f"{', '.join(known)}; or give a path to a .toml file"
    )


def load_scenario(name_or_path: str | Path, mode: Mode = "full") -> Scenario:
    """Read and validate a scenario file by packaged name or path."""
    path = resolve_scenario(name_or_path)
    is_packaged = not (isinstance(name_or_path, Path) or "/" in str(name_or_path))
    shown = path.name if is_packaged and not str(name_or_path).endswith(".toml") else str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{shown}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{shown}: cannot read scenario file: {e}") from None
    return parse_scenario(raw, shown, mode=mode, default_name=path.stem)


def parse_scenario(
    data: Mapping[str, Any],
    source: str,
    mode: Mode = "full",
    default_name: str | None = None,
) -> Scenario:
    """Validate a scenario document (already parsed TOML) in quick or full mode."""
    if mode not in MODES:
        raise ConfigError(f"scenario mode = {mode!r} is not valid; use one of: quick, full")
    full = _build(data, source, "full", default_name)
    if mode == "full":
        return full
    try:
        merged = _apply_quick(data, source)
        return _build(merged, source, "quick", default_name)
    except ConfigError as e:
        # The full file parsed, so this came from the [quick] table: say so.
        raise ConfigError(f"{e} (after applying the [quick] table)") from None


# --------------------------------------------------------------------------- quick mode

_TOP_KEYS = (
    "name",
    "description",
    "load",
    "classes",
    "stages",
    "chaos",
    "checks",
    "linearity",
    "contention",
    "quick",
)
_SCALED_TABLES = ("stages", "chaos", "linearity", "contention")


def _apply_quick(data: Mapping[str, Any], src: str) -> dict[str, Any]:
    quick = data.get("quick", {})
    out = {k: copy.deepcopy(v) for k, v in data.items() if k != "quick"}
    if not quick:
        return out
    t = _Table(quick, "quick", src, ("scale", *(k for k in _TOP_KEYS if k != "quick")))
    scale = t.number("scale", 1.0, positive=True)
    taken = {k: t.take(k) for k in _TOP_KEYS if k != "quick"}
    overrides = {k: v for k, v in taken.items() if v is not None}
    t.done()
    if scale != 1.0:
        for key in _SCALED_TABLES:
            if key in out:
                out[key] = _scale(out[key], scale)
    for key, over in overrides.items():
        if key == "stages" and isinstance(over, dict):
            out["stages"] = _merge_stages(out.get("stages", []), over, src)
        elif isinstance(over, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], over)
        else:
            out[key] = copy.deepcopy(over)
    return out


def _scale(node: Any, factor: float) -> Any:
    """Multiply every duration (``*_s`` key) in a table or array of tables."""
    if isinstance(node, list):
        return [_scale(x, factor) for x in node]
    if isinstance(node, dict):
        return {
            k: (v * factor if k.endswith("_s") and _is_number(v) else _scale(v, factor))
            for k, v in node.items()
        }
    return node


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merge_stages(stages: Any, over: Mapping[str, Any], src: str) -> list[Any]:
    if not isinstance(stages, list):
        return stages
    names = [s.get("name") if isinstance(s, dict) else None for s in stages]
    out = list(stages)
    for name, fields in over.items():
        if name not in names:
            raise ConfigError(
                f"{src}: quick.stages.{name} names no stage; stages are: "
                f"{', '.join(str(n) for n in names)}"
            )
        if not isinstance(fields, dict):
            raise ConfigError(
                f"{src}: quick.stages.{name} = {_show(fields)} is not a table; "
                f"write e.g. [quick.stages.{name}] duration_s = 10"
            )
        i = names.index(name)
        out[i] = _deep_merge(out[i], fields)
    return out


# --------------------------------------------------------------------------- validation


def _show(v: Any) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class _Table:
    """One TOML table being read; remembers its path so errors can name the key."""

    def __init__(self, data: Any, where: str, src: str, keys: Iterable[str] = ()) -> None:
        self.where, self.src = where, src
        if not isinstance(data, dict):
            self.fail("", data, "is not a table")
        self.data = dict(data)
        self.seen: set[str] = set()
        if keys:
            self.allow(keys)

    def allow(self, keys: Iterable[str]) -> None:
        """Declare the valid keys and reject unknown ones now, before a missing key is."""
        self.seen.update(keys)
        self.done()

    def key(self, k: str) -> str:
        return f"{self.where}.{k}" if self.where else k

    def fail(self, k: str, value: Any, problem: str) -> None:
        name = self.key(k) if k else self.where
        raise ConfigError(f"{self.src}: {name} = {_show(value)} {problem}")

    def take(self, k: str, default: Any = None) -> Any:
        self.seen.add(k)
        return self.data.get(k, default)

    def number(
        self,
        k: str,
        default: Any,
        *,
        positive: bool = False,
        minimum: float | None = None,
        integer: bool = False,
    ) -> Any:
        v = self.take(k, default)
        if v is None:
            return None
        kind = "an integer" if integer else "a number"
        if not _is_number(v) or (integer and not isinstance(v, int)) or not math.isfinite(v):
            self.fail(k, v, f"is not {kind}; use {kind}{' > 0' if positive else ''}")
        if positive and not v > 0:
            self.fail(k, v, f"must be > 0; use {kind} > 0")
        if minimum is not None and v < minimum:
            self.fail(k, v, f"must be ≥ {minimum:g}")
        return v

    def string(self, k: str, default: str | None, choices: Iterable[str] | None = None) -> Any:
        v = self.take(k, default)
        if v is None:
            return None
        if not isinstance(v, str):
            self.fail(k, v, "is not a string")
        if choices is not None and v not in choices:
            self.fail(k, v, f"is not valid; use one of: {', '.join(choices)}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        v = self.take(k, default)
        if not isinstance(v, bool):
            self.fail(k, v, "is not a boolean; use true or false")
        return v

    def done(self) -> None:
        for k in self.data:
            if k not in self.seen:
                hint = difflib.get_close_matches(k, sorted(self.seen), n=1)
                maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ConfigError(
                    f"{self.src}: {self.key(k)} is not a known key{maybe}; valid keys here: "
                    f"{', '.join(sorted(self.seen))}"
                )


def parse_rate(value: Any, where: str, src: str) -> Rate:
    """``200`` (req/s) or ``"0.6x"`` (multiple of calibrated capacity)."""
    bad = (
        f"{src}: {where} = {_show(value)} is not a rate; use a number of req/s (e.g. 200) "
        f'or a multiple of capacity (e.g. "0.6x")'
    )
    if _is_number(value):
        rate = Rate(float(value))
    elif isinstance(value, str) and value.strip().lower().endswith("x"):
        try:
            rate = Rate(float(value.strip()[:-1]), relative=True)
        except ValueError:
            raise ConfigError(bad) from None
    else:
        raise ConfigError(bad)
    if not math.isfinite(rate.value) or rate.value < 0:
        raise ConfigError(f"{bad}; it must be ≥ 0")
    return rate


def _build(data: Mapping[str, Any], src: str, mode: Mode, default_name: str | None) -> Scenario:
    top = _Table(data, "", src, _TOP_KEYS)
    name = top.string("name", default_name or Path(src).stem)
    description = top.string("description", "")
    top.take("quick")  # read by _apply_quick
    load = _parse_load(top.take("load", {}), src)
    classes = _parse_classes(top.take("classes"), src)
    linearity = _parse_linearity(top.take("linearity"), src)
    contention = _parse_contention(top.take("contention"), src)
    raw_stages = top.take("stages")
    raw_chaos = top.take("chaos", [])
    checks = _parse_checks(top.take("checks"), src)
    top.done()

    chaos = _parse_chaos(raw_chaos, src)
    if linearity is not None or contention is not None:
        which = "linearity" if linearity is not None else "contention"
        if linearity is not None and contention is not None:
            raise ConfigError(f"{src}: [linearity] and [contention] cannot be in one scenario")
        if raw_stages is not None:
            raise ConfigError(
                f"{src}: stages cannot be written when [{which}] is present: "
                f"[{which}] generates the stages; remove [[stages]]"
            )
        if linearity is not None:
            if load.mode != "closed":
                raise ConfigError(
                    f'{src}: load.mode = "{load.mode}" but [linearity] is a closed-loop sweep; '
                    'set load.mode = "closed"'
                )
            stages = linearity.stages(cores=0) if linearity.points else ()
        else:
            assert contention is not None
            contention, stages, hogs = _expand_contention(contention)
            chaos = chaos + hogs
    else:
        stages = _parse_stages(raw_stages, load.mode, src)

    relative = next(
        (i for i, s in enumerate(stages) if s.rate is not None and s.rate.relative), None
    )
    calibrate = load.calibrate
    if data.get("load", {}).get("calibrate", "auto") == "auto":
        calibrate = relative is not None and load.capacity_rps is None
    elif relative is not None and not calibrate and load.capacity_rps is None:
        key = "contention.rate" if contention is not None else f"stages[{relative}].rate"
        raise ConfigError(
            f'{src}: {key} = "{stages[relative].rate}" is relative to '
            "capacity but load.calibrate = false and no load.capacity_rps is set; enable "
            "calibration, set load.capacity_rps, or use an absolute rate"
        )
    load = replace(load, calibrate=calibrate)

    total = stages[-1].end_s if stages else math.inf
    for i, ev in enumerate(chaos):
        if ev.end_s > total + 1e-9:
            raise ConfigError(
                f"{src}: chaos[{i}] ({ev.action} at_s = {ev.at_s:g}, duration_s = "
                f"{ev.duration_s:g}) ends after the last stage ({total:g} s); move it earlier "
                "or lengthen the stages"
            )
    chaos = tuple(sorted(chaos, key=lambda e: e.at_s))
    return Scenario(
        name=name,
        description=description,
        source=src,
        mode=mode,
        load=load,
        classes=classes,
        stages=stages,
        chaos=chaos,
        checks=checks,
        linearity=linearity,
        contention=contention,
    )


def _parse_load(raw: Any, src: str) -> LoadConfig:
    t = _Table(raw, "load", src, (f.name for f in dataclasses.fields(LoadConfig)))
    cal = t.take("calibrate", "auto")
    if cal != "auto" and not isinstance(cal, bool):
        t.fail("calibrate", cal, 'is not valid; use true, false or "auto"')
    d = LoadConfig()
    cfg = LoadConfig(
        mode=t.string("mode", d.mode, LOAD_MODES),
        arrival=t.string("arrival", d.arrival, ARRIVALS),
        request_timeout_s=float(t.number("request_timeout_s", d.request_timeout_s, positive=True)),
        calibrate=bool(cal) if cal != "auto" else False,
        capacity_rps=_opt_float(t.number("capacity_rps", None, positive=True)),
        calibration_s=float(t.number("calibration_s", d.calibration_s, positive=True)),
        calibration_users=t.number("calibration_users", None, integer=True, positive=True),
        seed=t.number("seed", d.seed, integer=True),
        max_in_flight=t.number("max_in_flight", d.max_in_flight, integer=True, positive=True),
        window_s=float(t.number("window_s", d.window_s, positive=True)),
        first_requests=t.number("first_requests", d.first_requests, integer=True, positive=True),
        verify=t.boolean("verify", d.verify),
        pool_size=t.number("pool_size", None, integer=True, positive=True),
        fresh_sut=t.boolean("fresh_sut", d.fresh_sut),
    )
    t.done()
    return cfg


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _parse_classes(raw: Any, src: str) -> tuple[TrafficClass, ...]:
    if raw is None:
        return (TrafficClass("default"),)
    top = _Table(raw, "classes", src)
    if not top.data:
        top.fail("", raw, "is empty; define at least one class, e.g. [classes.default] share = 1")
    out = []
    for cname in top.data:
        t = _Table(top.take(cname), f"classes.{cname}", src, ("priority", "share", "timeout_us"))
        share = t.number("share", None, minimum=0)
        if share is None:
            if len(top.data) > 1:
                _missing(t, "share", "a fraction in [0, 1] (shares of all classes sum to 1)")
            share = 1.0
        tc = TrafficClass(
            name=cname,
            priority=t.number("priority", 0, integer=True, minimum=0),
            share=float(share),
            timeout_us=t.number("timeout_us", None, integer=True, positive=True),
        )
        if tc.share > 1:
            t.fail("share", tc.share, "must be a fraction in [0, 1]")
        t.done()
        out.append(tc)
    total = sum(c.share for c in out)
    if abs(total - 1.0) > 1e-6:
        parts = ", ".join(f"{c.name} = {c.share:g}" for c in out)
        raise ConfigError(f"{src}: classes shares sum to {total:g} ({parts}); they must sum to 1")
    return tuple(out)


def _missing(t: _Table, k: str, what: str) -> Any:
    raise ConfigError(f"{t.src}: {t.key(k)} is missing; set it to {what}")


_STAGE_KEYS = ("name", "duration_s", "rate", "users", "warmup_s", "threads")


def _parse_stages(raw: Any, load_mode: str, src: str) -> tuple[Stage, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"{src}: stages = {_show(raw)} is not a list of stages; add at least one "
            "[[stages]] with name, duration_s and rate (open loop) or users (closed loop)"
        )
    out: list[Stage] = []
    t0 = 0.0
    names: set[str] = set()
    for i, item in enumerate(raw):
        t = _Table(item, f"stages[{i}]", src, _STAGE_KEYS)
        name = t.string("name", f"stage{i}")
        if name in names:
            t.fail("name", name, "is used by an earlier stage; stage names must be unique")
        names.add(name)
        dur = t.number("duration_s", None, positive=True)
        if dur is None:
            _missing(t, "duration_s", "a number of seconds > 0")
        raw_rate, users = t.take("rate"), t.number("users", None, integer=True, positive=True)
        if load_mode == "open":
            if users is not None:
                t.fail("users", users, 'is for closed loop but load.mode = "open"; use rate')
            if raw_rate is None:
                _missing(t, "rate", 'a rate in req/s (e.g. 200) or of capacity (e.g. "0.6x")')
            rate = parse_rate(raw_rate, t.key("rate"), src)
        else:
            if raw_rate is not None:
                t.fail("rate", raw_rate, 'is for open loop but load.mode = "closed"; use users')
            if users is None:
                _missing(t, "users", "a number of closed-loop users ≥ 1")
            rate = None
        warm = float(t.number("warmup_s", 0.0, minimum=0))
        if warm >= dur:
            t.fail("warmup_s", warm, f"must be shorter than the stage (duration_s = {dur:g})")
        threads = t.number("threads", None, integer=True, positive=True)
        t.done()
        out.append(Stage(name, float(dur), rate, users, t0, threads, warm))
        t0 += float(dur)
    return tuple(out)


_CHAOS_PARAMS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "cpu_hog": {
        "cores": lambda v: (
            v == "sut" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
        ),
        "pin": lambda v: (
            v in ("sut", "none")
            or (isinstance(v, list) and all(isinstance(c, int) and c >= 0 for c in v))
        ),
    },
    "pause": {},
    "kill": {
        "restart": lambda v: isinstance(v, bool),
        "signal": lambda v: v in ("SIGKILL", "SIGTERM"),
    },
}
_CHAOS_VALID = {
    "cores": 'an integer ≥ 1 or "sut" (one hog per SUT core)',
    "pin": '"sut" (the SUT\'s cores), "none", or a list of core numbers',
    "restart": "true or false",
    "signal": '"SIGKILL" or "SIGTERM"',
}
_CHAOS_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu_hog": {"cores": "sut", "pin": "sut"},
    "pause": {},
    "kill": {"restart": True, "signal": "SIGKILL"},
}


def _parse_chaos(raw: Any, src: str) -> tuple[ChaosEvent, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{src}: chaos = {_show(raw)} is not a list; write [[chaos]] tables")
    out = []
    for i, item in enumerate(raw):
        t = _Table(item, f"chaos[{i}]", src)
        action = t.string("action", None, CHAOS_ACTIONS)
        if action is None:
            _missing(t, "action", f"one of: {', '.join(CHAOS_ACTIONS)}")
        t.allow(("at_s", "duration_s", *_CHAOS_PARAMS[action]))
        at = t.number("at_s", None, minimum=0)
        if at is None:
            _missing(t, "at_s", "seconds after the load starts, ≥ 0")
        if action == "kill":
            dur = t.number("duration_s", 0.0, minimum=0)
        else:
            dur = t.number("duration_s", None, positive=True)
            if dur is None:
                _missing(t, "duration_s", "a number of seconds > 0")
        params = dict(_CHAOS_DEFAULTS[action])
        for k, check in _CHAOS_PARAMS[action].items():
            v = t.take(k, params[k])
            if not check(v):
                t.fail(k, v, f"is not valid for {action}; use {_CHAOS_VALID[k]}")
            params[k] = v
        t.done()
        out.append(ChaosEvent(float(at), action, MappingProxyType(params), float(dur)))
    return tuple(out)  # file order, so errors can name chaos[i]; sorted once validated


def _parse_checks(raw: Any, src: str) -> Mapping[str, Mapping[str, Any]]:
    if raw is None:
        return MappingProxyType({})
    t = _Table(raw, "checks", src)
    flat: dict[str, Any] = {}

    def visit(prefix: str, node: Mapping[str, Any]) -> None:
        for k, v in node.items():
            cid = f"{prefix}.{k}" if prefix else k
            if cid in CHECK_IDS:
                flat[cid] = v
            elif isinstance(v, dict) and any(c.startswith(cid + ".") for c in CHECK_IDS):
                visit(cid, v)  # [checks] spike.recovery_s = {...} nests as spike → recovery_s
            else:
                hint = difflib.get_close_matches(cid, CHECK_IDS, n=1)
                maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ConfigError(
                    f'{src}: checks."{cid}" is not a check id{maybe}; valid ids: '
                    f"{', '.join(CHECK_IDS)}"
                )

    visit("", t.data)
    out: dict[str, Mapping[str, Any]] = {}
    for cid, over in flat.items():
        if over is True:
            over = {}
        if not isinstance(over, dict):
            raise ConfigError(
                f'{src}: checks."{cid}" = {_show(over)} is not a table of overrides; write '
                f'"{cid}" = {{}} for the defaults or e.g. "{cid}" = {{ threshold = 10 }}'
            )
        out[cid] = MappingProxyType(copy.deepcopy(over))
    return MappingProxyType(out)


def _parse_linearity(raw: Any, src: str) -> LinearitySpec | None:
    if raw is None:
        return None
    t = _Table(raw, "linearity", src, (f.name for f in dataclasses.fields(LinearitySpec)))
    d = LinearitySpec()
    pts = t.take("points", "auto")
    if pts == "auto":
        points: tuple[int, ...] = ()
    elif (
        isinstance(pts, list)
        and pts
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in pts)
        and len(set(pts)) == len(pts)
    ):
        points = tuple(sorted(pts))
        if points[0] != 1:
            t.fail("points", pts, "must include 1: efficiency is X(N)/(N·X(1))")
    else:
        t.fail(
            "points",
            pts,
            'is not valid; use "auto" or a list of distinct integers ≥ 1, e.g. [1, 2, 4]',
        )
    spec = LinearitySpec(
        vary=t.string("vary", d.vary, LINEARITY_VARY),
        points=points,
        replicates=t.number("replicates", d.replicates, integer=True, positive=True),
        stage_s=float(t.number("stage_s", d.stage_s, positive=True)),
        warmup_s=float(t.number("warmup_s", d.warmup_s, minimum=0)),
        users_per_thread=t.number(
            "users_per_thread", d.users_per_thread, integer=True, positive=True
        ),
    )
    if spec.warmup_s >= spec.stage_s:
        t.fail("warmup_s", spec.warmup_s, f"must be shorter than stage_s = {spec.stage_s:g}")
    t.done()
    return spec


def _parse_contention(raw: Any, src: str) -> ContentionSpec | None:
    if raw is None:
        return None
    keys = ("rate", "block_s", "cycles", "after_s", "warmup_s", "hog_cores")
    t = _Table(raw, "contention", src, keys)
    d = ContentionSpec(Rate(0.6, True))
    raw_rate = t.take("rate", "0.6x")
    cores = t.take("hog_cores", d.hog_cores)
    if not (
        cores == "sut" or (isinstance(cores, int) and not isinstance(cores, bool) and cores >= 1)
    ):
        t.fail("hog_cores", cores, f"is not valid; use {_CHAOS_VALID['cores']}")
    spec = ContentionSpec(
        rate=parse_rate(raw_rate, t.key("rate"), src),
        block_s=float(t.number("block_s", d.block_s, positive=True)),
        cycles=t.number("cycles", d.cycles, integer=True, positive=True),
        after_s=float(t.number("after_s", d.after_s, positive=True)),
        warmup_s=float(t.number("warmup_s", d.warmup_s, minimum=0)),
        hog_cores=cores,
    )
    if spec.warmup_s >= min(spec.block_s, spec.after_s):
        t.fail("warmup_s", spec.warmup_s, "must be shorter than block_s and after_s")
    t.done()
    return spec


def _expand_contention(
    spec: ContentionSpec,
) -> tuple[ContentionSpec, tuple[Stage, ...], tuple[ChaosEvent, ...]]:
    """baseline_1, hog_1, …, baseline_k, hog_k, after — with one cpu_hog per hog block."""
    stages: list[Stage] = []
    hogs: list[ChaosEvent] = []
    blocks: list[ContentionBlock] = []
    t = 0.0
    plan = [(kind, c) for c in range(1, spec.cycles + 1) for kind in ("baseline", "hog")]
    for kind, c in [*plan, ("after", 0)]:
        dur = spec.after_s if kind == "after" else spec.block_s
        name = kind if kind == "after" else f"{kind}_{c}"
        stages.append(Stage(name, dur, spec.rate, None, t, None, spec.warmup_s))
        blocks.append(ContentionBlock(kind, name, t, t + dur))  # type: ignore[arg-type]
        if kind == "hog":
            params = MappingProxyType({"cores": spec.hog_cores, "pin": "sut"})
            hogs.append(ChaosEvent(t, "cpu_hog", params, dur))
        t += dur
    return replace(spec, blocks=tuple(blocks)), tuple(stages), tuple(hogs)
