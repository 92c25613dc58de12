"""What the resilience checks read of a chaos event: the scenario's first record of an
action, whether it applied (else the check is a skip: the validity rule,
harness.analysis.chaos_evidence, already makes such a run invalid, never a pass), and the
baseline span before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.analysis.resilience import (
    EDGE,
)
from harness.checks import _data as d
from harness.checks.model import Check, Result


def first_event(result: Mapping[str, Any], action: str) -> Mapping[str, Any] | None:
    return next((c for c in result.get("chaos") or [] if c.get("action") == action), None)


def finite_number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def skip_unless_applied(rec: Mapping[str, Any] | None, r: Result, action: str) -> Check | None:
    """A skip when there is no applied ``action`` event to judge, else None."""
    if rec is None:
        return r.skipped(
            f"no {action} event in this run's chaos timeline: add a [[chaos]] action = "
            f'"{action}" (scenarios/{SCENARIO_OF_ACTION[action]}.toml)'
        )
    if (
        rec.get("ok") is not True
        or finite_number(rec.get("start_s")) is None
        or finite_number(rec.get("end_s")) is None
    ):
        return r.skipped(
            f"the {action} event did not apply ({rec.get('error') or 'no start or end'}): "
            "nothing to judge (the run is invalid)"
        )
    return None


# Requests sent this long before an event may still be in flight when it strikes (the
# healthy p99 at 0.5x is ~100 ms): their windows are not baseline.
IN_FLIGHT_S = 0.5

SCENARIO_OF_ACTION = {"pause": "freeze", "kill": "crash_restart", "terminate": "rolling_shutdown"}


def baseline_start(result: Mapping[str, Any], discard_s: float) -> float:
    """Where the baseline may start: after ``discard_s`` and the first stage's warm-up."""
    stages = d.stages(result)
    warm = float(stages[0].get("warmup_s") or 0.0) if stages else 0.0
    return max(discard_s, warm)


def baseline_end(result: Mapping[str, Any], start: float) -> float:
    """The end of the baseline for an event starting at ``start``: the last window that
    ends ``IN_FLIGHT_S`` before it (a window the event began in — even 1 ms before its
    end — is not baseline, nor one whose requests were still in flight when it struck: a
    kill cuts them off; ``EDGE`` forgives the timeline's jitter)."""
    _, width = d.readers.window_rows(result)
    return start - IN_FLIGHT_S - width * (1.0 - EDGE)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"
