"""The check registry: one function per declared check, and parameter layering.

What a check *is* (id, unit, op, defaults, summary) is declared once in
``harness.catalog``; a check module attaches the function that computes it with
``@implements(check_id)``. ``harness.checks`` imports every check module and then
``REGISTRY.verify()``: a declaration without a function, a function without a
declaration, or two functions for one check stop the import with the id named.

Parameters flow one way: a check's documented defaults ← the scenario's ``[checks]``
table (copied into the result as ``check_config``) ← the checklist TOML
(``load_checklist``). Unknown check ids or parameter names are a ConfigError naming what
is valid. Running the checks of a scenario is ``harness.checks.engine``'s job.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.catalog import CATALOG, Catalog, CheckDecl
from harness.checks.model import Check, CheckFn, CheckSpec, Result, ValidityParams
from harness.errors import ConfigError

Impl = Callable[[Mapping[str, Any], Result], Check]

# The checklist's list of check ids and scenario names whose skip or absence the user
# accepts (also ``--allow-skip``, recorded in the results document under the same key).
ALLOW_SKIP = "allow_skip"

# Every check understands these, besides its own defaults.
COMMON_PARAMS: Mapping[str, Any] = {"enabled": True}


class Registry(Mapping[str, CheckSpec]):
    """The implemented checks of one catalog, by id, in the catalog's order."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._specs: dict[str, CheckSpec] = {}

    def implements(self, check_id: str) -> Callable[[Impl], CheckFn]:
        """Attach ``fn(scenario_result, result_builder) -> Check`` to the declaration of
        ``check_id``; returns ``run(scenario_result, params) -> Check``."""
        if check_id not in self.catalog:
            raise RuntimeError(
                f"check {check_id!r} is implemented but not declared: add its declaration "
                "to harness/catalog/__init__.py"
            )

        def attach(fn: Impl) -> CheckFn:
            if check_id in self._specs:
                raise RuntimeError(f"check {check_id!r} is implemented twice")
            self._specs[check_id] = _spec(self.catalog[check_id], fn)
            return self._specs[check_id].fn

        return attach

    def verify(self) -> None:
        """Every declared check has its function (each function's declaration and
        uniqueness are checked when it is attached)."""
        missing = [cid for cid in self.catalog.ids if cid not in self._specs]
        if missing:
            raise RuntimeError(
                f"checks declared in harness/catalog but not implemented: {missing}; write "
                "each one's function with @implements(id) in a module harness.checks imports"
            )

    def extended(self, decl: CheckDecl) -> Registry:
        """A new registry over this catalog plus ``decl``, with this one's functions
        (for trying a check without touching the global registry)."""
        other = Registry(self.catalog.with_check(decl))
        for cid, spec in self._specs.items():
            other._specs[cid] = _spec(other.catalog[cid], spec.impl)
        return other

    def __getitem__(self, check_id: str) -> CheckSpec:
        return self._specs[check_id]

    def __iter__(self) -> Iterator[str]:
        return (cid for cid in self.catalog.ids if cid in self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def _spec(decl: CheckDecl, fn: Impl) -> CheckSpec:
    def run(scenario: Mapping[str, Any], params: Mapping[str, Any]) -> Check:
        return fn(scenario, Result(spec, params))

    spec = CheckSpec(decl.id, run, decl.unit, decl.op, dict(decl.defaults), decl.summary, fn)
    return spec


# The checks of harness.catalog; filled by the @implements of the check modules.
REGISTRY = Registry(CATALOG)


def implements(check_id: str) -> Callable[[Impl], CheckFn]:
    """``@implements("steady.p99_ms")``: this function computes that declared check."""
    return REGISTRY.implements(check_id)


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


def load_checklist(path: str | Path) -> dict[str, Any]:
    """Read a checklist TOML: ``{check_id: {param: value}}``, validated, plus ``validity``
    (the run-validity limits) and ``allow_skip`` (accepted skips) when present.

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
    extra = set(doc) - {"checks", "validity", ALLOW_SKIP} if table is not doc else set()
    if extra:
        raise ConfigError(
            f"checklist '{p}': unexpected top-level keys {sorted(extra)} next to [checks]. "
            "Put every check table under [checks]."
        )
    out: dict[str, Any] = {}
    if table is not doc:
        table = {**table, **{k: doc[k] for k in ("validity", ALLOW_SKIP) if k in doc}}
    for cid, params in table.items():
        if cid == ALLOW_SKIP:
            out[cid] = validate_allow_skip(params, f"checklist '{p}'")
        elif cid == "validity":
            # the run-validity limits live next to the checks (see docs/checks.md)
            ValidityParams.from_mapping(params)
            out[cid] = dict(params)
        else:
            out[cid] = validate_overrides(cid, params, f"checklist '{p}'")
    return out


def validate_allow_skip(names: Any, where: str) -> list[str]:
    """``allow_skip``: check ids (a skip accepted) and scenario names (a scenario not run
    accepted). A name with a dot must be a known check id, so a typo is not a silent no-op."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            f"{where}: allow_skip has value {names!r}. Expected a list of check ids or "
            'scenario names, e.g. allow_skip = ["soak.latency_drift", "linearity"].'
        )
    for n in names:
        if "." in n and n not in REGISTRY:
            hint = difflib.get_close_matches(n, list(REGISTRY), n=1)
            maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(
                f"{where}: allow_skip names unknown check id '{n}'{maybe}. Valid ids: "
                f"{', '.join(sorted(REGISTRY))}."
            )
    return list(dict.fromkeys(names))


def run_check(check_id: str, scenario: Mapping[str, Any], params: Mapping[str, Any]) -> Check:
    spec = REGISTRY[check_id]
    if not params.get("enabled", True):
        return Result(spec, params).skipped("disabled in the checklist (enabled = false)")
    return spec.fn(scenario, params)
