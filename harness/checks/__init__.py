"""Checks: pure functions from a scenario result to verdicts.

``evaluate(result, overrides)`` runs the checks a scenario lists in ``check_config``
(plus ``accounting.balanced``); ``validity(result)`` lists why a run judges nothing;
``verdict(checks, validity)`` reduces them to "pass" | "fail" | "invalid";
``judge_scenario(result, overrides)`` does all three and writes them into the result.
Defaults and their reasoning: docs/checks.md.
"""

from __future__ import annotations

# Importing the check modules registers their checks.
from harness.checks import correctness, latency, overload, soak  # noqa: F401
from harness.checks.engine import (
    RUN_COMPLETED,
    ValidityParams,
    evaluate,
    judge_scenario,
    validity,
    verdict,
)
from harness.checks.model import Check, CheckSpec
from harness.checks.registry import REGISTRY, load_checklist, resolve_params

# The checklist's order (README's table): the order reports list them in.
_GROUPS = ("cold_start", "steady", "spike", "priority", "soak", "linearity", "integrity")
_GROUPS += ("contention", "accounting")
CHECK_IDS: tuple[str, ...] = tuple(
    sorted(REGISTRY, key=lambda cid: (_GROUPS.index(cid.split(".")[0]), list(REGISTRY).index(cid)))
)

__all__ = [
    "CHECK_IDS",
    "REGISTRY",
    "RUN_COMPLETED",
    "Check",
    "CheckSpec",
    "ValidityParams",
    "evaluate",
    "judge_scenario",
    "load_checklist",
    "resolve_params",
    "validity",
    "verdict",
]
