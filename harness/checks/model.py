"""The check object, the registry entry that produces it, and the run-validity limits.

What a check is (id, unit, op, defaults) is declared in ``harness.catalog``; a
``CheckSpec`` joins a declaration to the function that computes it (``registry.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from harness.catalog import Op
from harness.errors import ConfigError


@dataclass(frozen=True)
class Check:
    """One verdict. ``passed`` is None when the check could not be evaluated."""

    id: str
    passed: bool | None
    value: float | int | None
    threshold: float | int | None
    op: Op
    unit: str
    n: int | None  # sample size behind ``value``
    detail: str
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON check object; non-finite numbers become null (JSON has no inf)."""
        return {
            "id": self.id,
            "passed": self.passed,
            "value": _json_number(self.value),
            "threshold": _json_number(self.threshold),
            "op": self.op,
            "unit": self.unit,
            "n": self.n,
            "detail": self.detail,
            "skipped": self.skipped,
        }


def _json_number(x: float | int | None) -> float | int | None:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


Params = Mapping[str, Any]
CheckFn = Callable[[Mapping[str, Any], Params], Check]


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its function, documented defaults, unit and comparison.
    ``fn(scenario, params)`` runs ``impl(scenario, Result(spec, params))``."""

    id: str
    fn: CheckFn
    unit: str
    op: Op
    defaults: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
    impl: Callable[[Mapping[str, Any], Result], Check] | None = None


class Result:
    """Builds Check objects for one spec, so each check function states only numbers."""

    def __init__(self, spec: CheckSpec, params: Params) -> None:
        self.spec = spec
        self.params = params

    @property
    def threshold(self) -> Any:
        return self.params.get("threshold")

    def compare(self, value: float) -> bool:
        t = self.threshold
        return {
            "<=": value <= t,
            ">=": value >= t,
            "==": value == t,
            "<": value < t,
            ">": value > t,
        }[self.spec.op]

    def judged(
        self,
        value: float | int | None,
        passed: bool,
        detail: str,
        n: int | None,
        threshold: float | int | None = None,
    ) -> Check:
        return Check(
            id=self.spec.id,
            passed=bool(passed),
            value=value,
            threshold=self.threshold if threshold is None else threshold,
            op=self.spec.op,
            unit=self.spec.unit,
            n=n,
            detail=detail,
        )

    def skipped(
        self, reason: str, *, value: float | int | None = None, n: int | None = None
    ) -> Check:
        return Check(
            id=self.spec.id,
            passed=None,
            value=value,
            threshold=self.threshold,
            op=self.spec.op,
            unit=self.spec.unit,
            n=n,
            detail=reason,
            skipped=reason,
        )


@dataclass(frozen=True)
class ValidityParams:
    """The limits of a valid run: the checklist's ``[validity]`` table (docs/checks.md)."""

    loadgen_max_pct: float = 90.0  # Locust's own warning level
    loadgen_sustain_s: float = 5.0  # a single hot tick is not saturation
    lag_max_fraction: float = 0.1  # dispatch lag p99 vs the SLO
    default_slo_ms: float = 200.0  # when the scenario judges no latency bound (engine.SLO_PARAMS)
    max_missed_frac: float = 0.05
    max_gap_intervals: float = 5.0
    min_coverage: float = 0.9  # the sampler's first..last sample against the run
    # CPU on the server's cores not the run's, per core-s those cores had: over the run,
    # each stage a check reads and every foreign_window_s (docs/checks.md "Invalid runs")
    foreign_budget: float = 0.05
    foreign_window_s: float = 10.0
    # ... but never less than this many core-s: a span of a few seconds holds a few
    # tenths of a core-s of the run's own start-up and kill bookkeeping (docs/checks.md)
    foreign_event_core_s: float = 1.25

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | None) -> ValidityParams:
        m = m or {}
        names = {f.name for f in fields(cls)}
        unknown = set(m) - names
        if unknown:
            raise ConfigError(
                f"checklist [validity] has unknown parameter(s) {sorted(unknown)}. "
                f"Valid parameters: {', '.join(sorted(names))}."
            )
        for k, val in m.items():
            if isinstance(val, bool) or not isinstance(val, (int, float)):
                raise ConfigError(
                    f"checklist [validity] parameter '{k}' has value {val!r}. Not a valid number."
                )
        return cls(**{k: float(val) for k, val in m.items()})
