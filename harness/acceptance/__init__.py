"""``harness acceptance`` / ``harness run``: the plan, then its scenarios in order.

- ``plan``: what will run, checked before any load (``PlanRequest`` → ``make_plan`` →
  ``Plan``; the checklist's order; preflight);
- ``session``: the scenarios in order (each one headless Locust run of
  ``harness.locust_run``), the capacity pinned after the first calibration, merge, judge;
- ``retries``: a scenario invalid only because the machine was disturbed, run again;
- ``no_results``: the failed result of a scenario whose run wrote none.
"""

from __future__ import annotations

from harness.acceptance.no_results import failed_scenario
from harness.acceptance.plan import (
    CHECKLIST,
    FULL_ONLY,
    Plan,
    PlanRequest,
    acceptance_scenarios,
    checklist,
    make_plan,
    preflight,
    resolve_scenarios,
)
from harness.acceptance.retries import retry_reasons, set_aside
from harness.acceptance.session import Outcome, calibrated_capacity, run_plan, scenario_summary

__all__ = [
    "CHECKLIST",
    "FULL_ONLY",
    "Outcome",
    "Plan",
    "PlanRequest",
    "acceptance_scenarios",
    "calibrated_capacity",
    "checklist",
    "failed_scenario",
    "make_plan",
    "preflight",
    "resolve_scenarios",
    "retry_reasons",
    "run_plan",
    "scenario_summary",
    "set_aside",
]
