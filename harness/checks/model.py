"""The check object and the registry entry that produces it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Op = Literal["<=", ">=", "==", "<", ">"]


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
    """A registered check: its function, documented defaults, unit and comparison."""

    id: str
    fn: CheckFn
    unit: str
    op: Op
    defaults: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""


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
