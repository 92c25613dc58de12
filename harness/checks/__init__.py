"""Checks: pure functions from a scenario result to verdicts.

``evaluate(result, overrides)`` runs the checks a scenario lists in ``check_config``
(plus ``accounting.balanced``); ``validity(result)`` lists why a run judges nothing;
``verdict(checks, validity)`` reduces them to "pass" | "fail" | "invalid";
``judge_scenario(result, overrides)`` does all three and writes them into the result.
Each check is declared in ``harness.catalog`` and implemented by one function in a module
below (``@implements(id)``); defaults and their reasoning: docs/checks.md.

Adding a check: its declaration in harness/catalog/__init__.py, its function here, its
section in docs/checks.md, ``python -m harness.catalog --write`` for the generated tables
(tests/test_catalog.py names what is missing), and a defect case that fails it in
harness/testing/detection_cases.py (tests/test_detection.py asks for one).
"""

from __future__ import annotations

from harness.catalog import CHECK_IDS

# Importing the check modules attaches their functions to the declarations.
from harness.checks import (  # noqa: F401
    correctness,
    crash,
    freeze,
    latency,
    network,
    overload,
    shutdown,
    soak,
    soak_requests,
    tokens,
    tokens_abort,
    tokens_overload,
    tokens_priority,
    tokens_stall,
)
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

# A declared check without its function stops here, with its id.
REGISTRY.verify()

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
