"""The experiment sections of a scenario file: ``[[chaos]]`` events, the ``[linearity]``
sweep and the ``[contention]`` blocks (expanded into stages plus one CPU hog per block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from harness.chaos.proxy import NETWORK_PARAMS, toxic_spec
from harness.errors import ConfigError
from harness.load.scenario_model import (
    CHAOS_ACTIONS,
    LINEARITY_VARY,
    ChaosEvent,
    ContentionBlock,
    ContentionSpec,
    LinearitySpec,
    Rate,
    Stage,
)
from harness.load.toml_table import Table, missing, parse_rate, show

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
    "terminate": {
        "restart": lambda v: isinstance(v, bool),
        "drain_timeout_s": lambda v: (
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 600
        ),
    },
    # the toxic's own parameters are checked by harness.chaos.proxy.toxic_spec below
    "network": {
        k: (lambda v: v is None or isinstance(v, str | int | float)) for k in NETWORK_PARAMS
    },
}
_CHAOS_VALID = {
    "cores": 'an integer ≥ 1 or "sut" (one hog per SUT core)',
    "pin": '"sut" (the SUT\'s cores), "none", or a list of core numbers',
    "restart": "true or false",
    "signal": '"SIGKILL" or "SIGTERM"',
    "drain_timeout_s": "seconds, 0 < s ≤ 600",
    **{k: "see docs/scenarios.md (network)" for k in NETWORK_PARAMS},
}
_CHAOS_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu_hog": {"cores": "sut", "pin": "sut"},
    "pause": {},
    "kill": {"restart": True, "signal": "SIGKILL"},
    "terminate": {"restart": True, "drain_timeout_s": 30.0},
    "network": dict.fromkeys(NETWORK_PARAMS),
}


def parse_chaos(raw: Any, src: str) -> tuple[ChaosEvent, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{src}: chaos = {show(raw)} is not a list; write [[chaos]] tables")
    out = []
    for i, item in enumerate(raw):
        t = Table(item, f"chaos[{i}]", src)
        action = t.string("action", None, CHAOS_ACTIONS)
        if action is None:
            missing(t, "action", f"one of: {', '.join(CHAOS_ACTIONS)}")
        t.allow(("at_s", "duration_s", *_CHAOS_PARAMS[action]))
        at = t.number("at_s", None, minimum=0)
        if at is None:
            missing(t, "at_s", "seconds after the load starts, ≥ 0")
        if action in ("kill", "terminate"):
            dur = t.number("duration_s", 0.0, minimum=0)
        else:
            dur = t.number("duration_s", None, positive=True)
            if dur is None:
                missing(t, "duration_s", "a number of seconds > 0")
        params = dict(_CHAOS_DEFAULTS[action])
        for k, check in _CHAOS_PARAMS[action].items():
            v = t.take(k, params[k])
            if not check(v):
                t.fail(k, v, f"is not valid for {action}; use {_CHAOS_VALID[k]}")
            params[k] = v
        if action == "network":
            try:
                toxic_spec(params)
            except ConfigError as exc:
                raise ConfigError(f"{src}: chaos[{i}]: {exc}") from None
            params = {k: v for k, v in params.items() if v is not None}
        t.done()
        out.append(ChaosEvent(float(at), action, MappingProxyType(params), float(dur)))
    return tuple(out)  # file order, so errors can name chaos[i]; sorted once validated


def parse_linearity(raw: Any, src: str) -> LinearitySpec | None:
    if raw is None:
        return None
    t = Table(raw, "linearity", src, (f.name for f in dataclasses.fields(LinearitySpec)))
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


def parse_contention(raw: Any, src: str) -> ContentionSpec | None:
    if raw is None:
        return None
    keys = ("rate", "block_s", "cycles", "after_s", "warmup_s", "hog_cores")
    t = Table(raw, "contention", src, keys)
    d = ContentionSpec(Rate(0.7, True))
    raw_rate = t.take("rate", "0.7x")
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


def expand_contention(
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
