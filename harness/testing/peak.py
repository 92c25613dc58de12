"""Drive a peak search to its end with a synthetic judge, no server and no load."""

from __future__ import annotations

from collections.abc import Callable

from harness.peak.outcomes import Point
from harness.peak.search import PeakSearch


def drive(search: PeakSearch, judge: Callable[[float, bool], Point]) -> PeakSearch:
    """Feed ``search`` the judge's point for every rate it asks for until it stops."""
    for _ in range(100):
        step = search.next_step()
        if step.rate_rps is None:
            return search
        search.record(judge(step.rate_rps, step.longer))
    raise AssertionError("the search did not stop")
