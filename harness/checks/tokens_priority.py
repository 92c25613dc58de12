"""Token-stream priority check: above capacity, does the high class still get its first
token within the SLO while the low class absorbs the overload?

``llm.priority_ttft_p99`` reads the scenario's ``tokens`` section per stage and traffic
class (``by_stage_class``, recorded by ``harness.load.stream_exchange``; exact merged
HDR percentiles) for stage ``stage`` (empty: the whole run, ``by_class``), and judges
the high class's (``class_name``; default: "high" or the smallest positive priority)
TTFT p99 against ``threshold`` ms. Failures count as over it, as in ``llm.ttft_p99``:
when more than 1 % of the class's requests failed (a 429, a timeout, a stall) or were
dropped by the in-flight cap, the p99 is one of them and the check fails on that.

A pass needs evidence that the stage did overload the server: some other class paid for
the protection — its TTFT p99 above ``threshold``, or at least ``min_other_reject_rate``
of its requests failed or dropped (429s: shed). Without it the pass would be vacuous and
the check is skipped, saying so. A high class over its SLO fails whatever the other
classes got: a server that lets the high class wait while the low one is served is the
inversion this check exists for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.checks._data import fmt, high_class
from harness.checks.model import Check, Result
from harness.checks.registry import implements

# The high class's TTFT p99 over the worst other class's, read as "both classes waited
# alike" (priority not applied where the wait was) from ALIKE_LOW up to ALIKE_HIGH;
# above, inverted; below, ordered but not enough.
ALIKE_LOW, ALIKE_HIGH = 0.5, 2.0


def _class_cells(
    result: Mapping[str, Any], stage: str
) -> tuple[Mapping[str, Mapping[str, Any]] | None, str]:
    """{class: token figures} of ``stage`` (the whole run when empty), and where that is;
    (None, why) when there are none."""
    tokens = result.get("tokens")
    if not tokens:
        return None, (
            "no token streams were recorded: this check judges a streaming protocol's run "
            "(--protocol openai)"
        )
    if not stage:
        return (tokens.get("by_class") or {}).get("classes") or {}, "the whole run"
    by_stage_class = tokens.get("by_stage_class")
    if by_stage_class is None:
        return None, "the result has no per-stage class figures (tokens.by_stage_class)"
    cells = by_stage_class.get(stage)
    if cells is None:
        return None, f"no streams were sent in stage {stage!r}"
    return cells, f"stage {stage}"


def _bad_total(cell: Mapping[str, Any]) -> tuple[int, int]:
    """(failed + dropped, requests + dropped) of one class's figures."""
    failed, dropped = int(cell.get("failed") or 0), int(cell.get("dropped") or 0)
    total = int(cell.get("ok") or 0) + failed + dropped
    return failed + dropped, total


def _absorbed(
    cells: Mapping[str, Mapping[str, Any]], cls: str, bound_ms: float, min_reject: float
) -> str | None:
    """How the classes other than ``cls`` absorbed the overload (None: they did not)."""
    for name, cell in sorted(cells.items()):
        if name == cls:
            continue
        bad, total = _bad_total(cell)
        if total and bad / total >= min_reject:
            return f"class '{name}': {bad} of {total} failed or dropped ({bad / total:.1%})"
        p99 = (cell.get("ttft_ms") or {}).get("p99_ms")
        if p99 is not None and float(p99) > bound_ms:
            return f"class '{name}': TTFT p99 {fmt(p99)} ms"
    return None


def _slowest_other(
    cells: Mapping[str, Mapping[str, Any]], cls: str
) -> tuple[str, float, float] | None:
    """(name, TTFT p99 ms, failed-or-dropped share) of the other class that fared worst."""
    worst: tuple[str, float, float] | None = None
    for name, cell in sorted(cells.items()):
        if name == cls:
            continue
        bad, total = _bad_total(cell)
        p99 = float((cell.get("ttft_ms") or {}).get("p99_ms") or 0.0)
        figures = (name, p99, bad / total if total else 0.0)
        if worst is None or (figures[2], figures[1]) > (worst[2], worst[1]):
            worst = figures
    return worst


def _wait_cause(cells: Mapping[str, Mapping[str, Any]], cls: str, p99: float) -> str:
    """Where the high class's wait was, as the other classes' TTFT tells it: behind them
    (inverted), beside them (priority not applied where the wait was), or ahead of them
    but still too long (ordered, but not enough)."""
    other = _slowest_other(cells, cls)
    if other is None or other[1] <= 0:
        return " — nothing to compare it with: no other class's first tokens were recorded"
    name, low_p99, _ = other
    versus = f"class '{name}' p99 {fmt(low_p99)} ms"
    if p99 > ALIKE_HIGH * low_p99:
        return (
            f" — the high class waited longer than {versus}: the server does not order its "
            "queue by priority, or reads the priority's sign the other way"
        )
    if p99 >= ALIKE_LOW * low_p99:
        return (
            f" — both classes waited alike ({versus}): priority was not applied where the "
            "wait was — the server does not order its queue by priority, or the wait is in "
            "front of the queue it orders (an API front end or tokenizer sharing the "
            "engine's CPU)"
        )
    return (
        f" — the high class waited less than {versus}, but past its SLO: priority orders "
        "the queue, yet a high request still waits for slots held by running "
        "lower-priority streams (no preemption), or the high class's own rate is more "
        "than the server serves within the SLO"
    )


def _refusal_cause(cells: Mapping[str, Mapping[str, Any]], cls: str, share: float) -> str:
    """Why the high class was refused, as the other classes' refusals tell it."""
    other = _slowest_other(cells, cls)
    if other is None:
        return ""
    name, _, low_share = other
    if share >= low_share:
        return (
            f" — refused or timed out at least as often as class '{name}' "
            f"({low_share:.1%}): the server sheds load without regard to priority, or "
            "refuses the high class when its queue is full of lower-priority requests"
        )
    return (
        f" — fewer than class '{name}' ({low_share:.1%}), but more than the 1 %: the "
        "server sheds lower-priority requests first, yet not enough of them to admit the "
        "high class"
    )


@implements("llm.priority_ttft_p99")
def priority_ttft_p99(result: Mapping[str, Any], r: Result) -> Check:
    cells, where = _class_cells(result, str(r.params["stage"]))
    if cells is None:
        return r.skipped(where)
    cls = str(r.params["class_name"]) or high_class(result)
    if cls is None:
        return r.skipped("the traffic mix has no high-priority class (priority >= 1)")
    cell = cells.get(cls)
    if cell is None:
        return r.skipped(f"no streams of class '{cls}' in {where}")
    bound = float(r.threshold)
    bad, total = _bad_total(cell)
    h = cell.get("ttft_ms") or {}
    n = int(h.get("count") or 0)
    p99 = float(h.get("p99_ms") or 0.0)
    least = int(r.params["min_requests"])
    if total >= least and bad / total > 0.01:
        return r.judged(
            float("inf"),
            False,
            f"class '{cls}' TTFT p99 in {where} is a failure: {bad} of {total} requests "
            f"failed or were dropped ({bad / total:.2%}), more than the 1 % a p99 leaves "
            f"(the successes' p99 {fmt(p99)} ms)" + _refusal_cause(cells, cls, bad / total),
            n=total,
        )
    if n < least:
        return r.skipped(
            f"{n} TTFT values of class '{cls}' in {where} (< {least}): too few for a p99; "
            "raise its share or the stage's length",
            n=n,
        )
    ok = r.compare(p99)
    detail = (
        f"class '{cls}' TTFT p99 {fmt(p99)} ms over {n} requests in {where} (p50 "
        f"{fmt(h.get('p50_ms'))} ms, max {fmt(h.get('max_ms'))} ms), "
        f"{'≤' if ok else '>'} {fmt(bound)} ms"
    )
    if not ok:
        return r.judged(round(p99, 3), False, detail + _wait_cause(cells, cls, p99), n=n)
    why = _absorbed(cells, cls, bound, float(r.params["min_other_reject_rate"]))
    if why is None:
        return r.skipped(
            f"{detail}, but the other classes neither waited past {fmt(bound)} ms (TTFT "
            f"p99) nor lost >= {float(r.params['min_other_reject_rate']):.0%} of their "
            "requests: the stage did not overload the server, so priority was not "
            "exercised; raise the overload rate",
            n=n,
        )
    return r.judged(round(p99, 3), True, f"{detail}; the overload was absorbed by {why}", n=n)
