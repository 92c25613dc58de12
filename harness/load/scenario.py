"""Scenario files (``scenarios/*.toml``) parsed into frozen, validated dataclasses.

The format is documented in ``docs/scenarios.md`` and in each packaged file's comments.
This module loads a file and builds the ``Scenario``; ``scenario_quick`` applies the
``[quick]`` table, ``scenario_experiments`` parses chaos, linearity and contention, and
``toml_table`` reads values with errors that name the key.
Every mistake is a ``ConfigError`` whose message names the file, the key, the value and
what is valid, because a typo in a load test must never pass silently: an unknown key
or check id is an error, not a default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError
from harness.load.scenario_experiments import (
    expand_contention,
    parse_chaos,
    parse_contention,
    parse_linearity,
)
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
from harness.load.scenario_quick import TOP_KEYS, apply_quick
from harness.load.toml_table import Table, missing, parse_rate, show
from harness.packaged import packaged_dir

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
    """Names of the scenario files shipped with the harness (``harness.packaged``)."""
    root = packaged_dir("scenarios")
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
    packaged = packaged_dir("scenarios") / f"{text}.toml"
    if packaged.is_file():
        return packaged
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
        merged = apply_quick(data, source)
        return _build(merged, source, "quick", default_name)
    except ConfigError as e:
        # The full file parsed, so this came from the [quick] table: say so.
        raise ConfigError(f"{e} (after applying the [quick] table)") from None


# --------------------------------------------------------------------------- validation


def _build(data: Mapping[str, Any], src: str, mode: Mode, default_name: str | None) -> Scenario:
    top = Table(data, "", src, TOP_KEYS)
    name = top.string("name", default_name or Path(src).stem)
    description = top.string("description", "")
    top.take("quick")  # read by _apply_quick
    load = _parse_load(top.take("load", {}), src)
    classes = _parse_classes(top.take("classes"), src)
    linearity = parse_linearity(top.take("linearity"), src)
    contention = parse_contention(top.take("contention"), src)
    raw_stages = top.take("stages")
    raw_chaos = top.take("chaos", [])
    checks = _parse_checks(top.take("checks"), src)
    defined_by = _parse_defined_by(top.take("defined_by"), checks, src)
    llm = top.take("llm")
    if llm is not None:
        from harness.load.llm_workload import config_from_table

        config_from_table(llm, src)  # a bad key or length: a ConfigError now, naming it
    top.done()

    chaos = parse_chaos(raw_chaos, src)
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
            contention, stages, hogs = expand_contention(contention)
            chaos = chaos + hogs
    else:
        stages = _parse_stages(raw_stages, load.mode, src)

    unknown = [
        n for n in (llm or {}).get("abort_stages") or [] if n not in {s.name for s in stages}
    ]
    if unknown and stages:
        raise ConfigError(
            f"{src}: llm.abort_stages names {unknown[0]!r}, which is not a stage; stages are: "
            f"{', '.join(s.name for s in stages)}"
        )
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
        defined_by=defined_by,
        linearity=linearity,
        contention=contention,
        llm=MappingProxyType(dict(llm)) if llm is not None else None,
    )


def _parse_load(raw: Any, src: str) -> LoadConfig:
    t = Table(raw, "load", src, (f.name for f in dataclasses.fields(LoadConfig)))
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
        protocol=t.string("protocol", None),
    )
    t.done()
    return cfg


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _parse_classes(raw: Any, src: str) -> tuple[TrafficClass, ...]:
    if raw is None:
        return (TrafficClass("default"),)
    top = Table(raw, "classes", src)
    if not top.data:
        top.fail("", raw, "is empty; define at least one class, e.g. [classes.default] share = 1")
    out = []
    for cname in top.data:
        t = Table(top.take(cname), f"classes.{cname}", src, ("priority", "share", "timeout_us"))
        share = t.number("share", None, minimum=0)
        if share is None:
            if len(top.data) > 1:
                missing(t, "share", "a fraction in [0, 1] (shares of all classes sum to 1)")
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


_STAGE_KEYS = ("name", "duration_s", "rate", "users", "warmup_s", "threads")


def _parse_stages(raw: Any, load_mode: str, src: str) -> tuple[Stage, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"{src}: stages = {show(raw)} is not a list of stages; add at least one "
            "[[stages]] with name, duration_s and rate (open loop) or users (closed loop)"
        )
    out: list[Stage] = []
    t0 = 0.0
    names: set[str] = set()
    for i, item in enumerate(raw):
        t = Table(item, f"stages[{i}]", src, _STAGE_KEYS)
        name = t.string("name", f"stage{i}")
        if name in names:
            t.fail("name", name, "is used by an earlier stage; stage names must be unique")
        names.add(name)
        dur = t.number("duration_s", None, positive=True)
        if dur is None:
            missing(t, "duration_s", "a number of seconds > 0")
        raw_rate, users = t.take("rate"), t.number("users", None, integer=True, positive=True)
        if load_mode == "open":
            if users is not None:
                t.fail("users", users, 'is for closed loop but load.mode = "open"; use rate')
            if raw_rate is None:
                missing(t, "rate", 'a rate in req/s (e.g. 200) or of capacity (e.g. "0.6x")')
            rate = parse_rate(raw_rate, t.key("rate"), src)
        else:
            if raw_rate is not None:
                t.fail("rate", raw_rate, 'is for open loop but load.mode = "closed"; use users')
            if users is None:
                missing(t, "users", "a number of closed-loop users ≥ 1")
            rate = None
        warm = float(t.number("warmup_s", 0.0, minimum=0))
        if warm >= dur:
            t.fail("warmup_s", warm, f"must be shorter than the stage (duration_s = {dur:g})")
        threads = t.number("threads", None, integer=True, positive=True)
        t.done()
        out.append(Stage(name, float(dur), rate, users, t0, threads, warm))
        t0 += float(dur)
    return tuple(out)


def _parse_defined_by(
    raw: Any, checks: Mapping[str, Mapping[str, Any]], src: str
) -> tuple[str, ...] | None:
    """``defined_by = ["soak.rss_trend", …]``: the listed checks that answer the scenario's
    question, so a pass needs each of them judged. Absent: every listed check."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ConfigError(
            f"{src}: defined_by = {show(raw)} is not a list of check ids; write e.g. "
            'defined_by = ["steady.p99_ms", "steady.error_rate"]'
        )
    for cid in raw:
        if cid not in checks:
            raise ConfigError(
                f'{src}: defined_by names "{cid}", which is not in the scenario\'s [checks] '
                f"table ({', '.join(checks) or 'empty'}); list it under [checks] or remove it"
            )
    return tuple(dict.fromkeys(raw))


def _parse_checks(raw: Any, src: str) -> Mapping[str, Mapping[str, Any]]:
    if raw is None:
        return MappingProxyType({})
    t = Table(raw, "checks", src)
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
                f'{src}: checks."{cid}" = {show(over)} is not a table of overrides; write '
                f'"{cid}" = {{}} for the defaults or e.g. "{cid}" = {{ threshold = 10 }}'
            )
        out[cid] = MappingProxyType(copy.deepcopy(over))
    return MappingProxyType(out)
