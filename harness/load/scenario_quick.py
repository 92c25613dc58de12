"""Quick mode: a scenario file's ``[quick]`` table (CI variant) applied to the full one.

``scale`` multiplies every duration (``*_s`` key) of the stages, chaos, linearity and
contention tables; the other keys of ``[quick]`` override the full file's, tables merged
key by key and ``[quick.stages.NAME]`` merged into the stage of that name.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from harness.errors import ConfigError
from harness.load.toml_table import Table, is_number, show

TOP_KEYS = (
    "name",
    "description",
    "defined_by",
    "load",
    "classes",
    "stages",
    "chaos",
    "checks",
    "linearity",
    "contention",
    "llm",
    "quick",
)
_SCALED_TABLES = ("stages", "chaos", "linearity", "contention")


def apply_quick(data: Mapping[str, Any], src: str) -> dict[str, Any]:
    quick = data.get("quick", {})
    out = {k: copy.deepcopy(v) for k, v in data.items() if k != "quick"}
    if not quick:
        return out
    t = Table(quick, "quick", src, ("scale", *(k for k in TOP_KEYS if k != "quick")))
    scale = t.number("scale", 1.0, positive=True)
    taken = {k: t.take(k) for k in TOP_KEYS if k != "quick"}
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
            k: (v * factor if k.endswith("_s") and is_number(v) else _scale(v, factor))
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
                f"{src}: quick.stages.{name} = {show(fields)} is not a table; "
                f"write e.g. [quick.stages.{name}] duration_s = 10"
            )
        i = names.index(name)
        out[i] = _deep_merge(out[i], fields)
    return out
