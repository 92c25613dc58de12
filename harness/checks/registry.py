"""The check registry, parameter layering, the checklist TOML and ``evaluate``.

Parameters flow one way: a check's documented defaults ← the scenario's ``[checks]``
table (copied into the result as ``check_config``) ← the checklist TOML. Unknown check
ids or parameter names are a ConfigError naming what is valid.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.checks.model import Check, CheckFn, CheckSpec, Op, Result
from harness.errors import ConfigError

# Filled by the @register decorators of the check modules, imported in __init__.
REGISTRY: dict[str, CheckSpec] = {}

# Every check understands these, besides its own defaults.
COMMON_PARAMS: Mapping[str, Any] = {"enabled": True}


def register(
    check_id: str, *, unit: str, op: Op, defaults: Mapping[str, Any], summary: str
) -> Callable[[Callable[[Mapping[str, Any], Result], Check]], CheckFn]:
    """Register ``fn(scenario_result, result_builder) -> Check`` under ``check_id``."""

    def wrap(fn: Callable[[Mapping[str, Any], Result], Check]) -> CheckFn:
        if check_id in REGISTRY:
            raise RuntimeError(f"check {check_id!r} registered twice")

        def run(scenario: Mapping[str, Any], params: Mapping[str, Any]) -> Check:
            return fn(scenario, Result(REGISTRY[check_id], params))

        REGISTRY[check_id] = CheckSpec(check_id, run, unit, op, dict(defaults), summary)
        return run

    return wrap


def _check_value(check_id: str, key: str, value: Any, default: Any, where: str) -> Any:
    """Validate one override against the default's type (ints and floats mix)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(
                f"{where}: check '{check_id}' parameter '{key}' has value {value!r}. "
                "Not a valid boolean (true or false)."
            )
        return value
    if isinstance(default, (int, float)) or default is None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(
                f"{where}: check '{check_id}' parameter '{key}' has value {value!r}. "
                "Not a valid number."
            )
        return value
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(
            f"{where}: check '{check_id}' parameter '{key}' has value {value!r}. "
            "Not a valid string."
        )
    return value


def validate_overrides(check_id: str, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    if check_id not in REGISTRY:
        raise ConfigError(
            f"{where}: unknown check id '{check_id}'. Valid ids: {', '.join(sorted(REGISTRY))}."
        )
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"{where}: check '{check_id}' has value {params!r}. Expected a table of "
            "parameters (e.g. {threshold = 10})."
        )
    allowed = {**COMMON_PARAMS, **REGISTRY[check_id].defaults}
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in allowed:
            raise ConfigError(
                f"{where}: check '{check_id}' has no parameter '{key}'. Valid parameters: "
                f"{', '.join(sorted(allowed))}."
            )
        out[key] = _check_value(check_id, key, value, allowed[key], where)
    return out


def resolve_params(check_id: str, *layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults ← each layer in order (later wins), validated."""
    params: dict[str, Any] = {**COMMON_PARAMS, **REGISTRY[check_id].defaults}
    for i, layer in enumerate(layers):
        if layer:
            params.update(validate_overrides(check_id, layer, f"override layer {i + 1}"))
    return params


def load_checklist(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a checklist TOML: ``{check_id: {param: value}}``, validated.

    Either top-level tables named by check id (``["steady.p99_ms"]``) or the same under a
    ``[checks]`` table (``[checks."steady.p99_ms"]``).
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"checklist '{p}' does not exist. Pass an existing TOML file.") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"checklist '{p}' is not valid TOML: {e}.") from None
    table = doc.get("checks", doc) if isinstance(doc.get("checks"), Mapping) else doc
    extra = set(doc) - {"checks"} if table is not doc else set()
    if extra:
        raise ConfigError(
            f"checklist '{p}': unexpected top-level keys {sorted(extra)} next to [checks]. "
            "Put every check table under [checks]."
        )
    out: dict[str, dict[str, Any]] = {}
    for cid, params in table.items():
        if cid == "validity":
            # the run-validity limits live next to the checks (see docs/checks.md)
            from harness.checks.engine import ValidityParams

            ValidityParams.from_mapping(params)
            out[cid] = dict(params)
        else:
            out[cid] = validate_overrides(cid, params, f"checklist '{p}'")
    return out


def run_check(check_id: str, scenario: Mapping[str, Any], params: Mapping[str, Any]) -> Check:
    spec = REGISTRY[check_id]
    if not params.get("enabled", True):
        return Result(spec, params).skipped("disabled in the checklist (enabled = false)")
    return spec.fn(scenario, params)
