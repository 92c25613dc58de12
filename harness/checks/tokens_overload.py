"""Overload of an OpenAI-compatible server: above capacity it sheds fast and keeps TTFT bounded.

``llm.overload`` reads the ``tokens`` section's cell of one stage (``stage``, the spike:
requests counted by the stage they were *sent* in) and judges one number, the share of
that stage's requests that were **handled well**:

- a whole answer (not failed) whose first token came within ``ttft_ms`` of the request's
  intended send time, or
- a shed: a 429 or 503 answered within ``reject_ms`` (the client can retry elsewhere or
  later at once: TGI's "Model is overloaded" 429, Triton's rejected queue entry).

Everything else is not: an admitted stream whose first token came later (it waited in a
queue longer than its user would), a timeout, a reset, another error, a 429/503 that
itself took longer than ``reject_ms``, and a request the client never sent because its
in-flight cap was full (the server had let in-flight requests pile up). The denominator
is every request of the stage, dropped ones included.

A server with an unbounded waiting queue admits the whole burst and serves it late: the
queue grows by the excess rate for as long as the spike lasts, so the first tokens of
most of the spike's requests come seconds late, and the share falls to about the part
of the spike before the queue's wait reached the bound.

Not judged when the spike did not exceed the server's capacity: not one request of the
stage was refused, failed or dropped, and every first token came within the bound —
there was no overload to handle. That cannot hide an unbounded queue: a queue that grew
enough to matter put first tokens past the bound, and then the check is judged. (A
scenario defined by this check is then "not judged" as a whole: raise the spike's rate.)

Figures: the stage cell's ``ttft`` and ``e2e_rejected`` histograms, kept whole in the
results (``harness.load.stream_recording``), counted up to each bound (HDR precision,
3 significant digits: ``count_at_most``). With client aborts in the run, an aborted stream's TTFT is in the
same histogram: the in-time count is the histogram's less every aborted stream, capped at
the whole answers (never more than the whole answers that were in time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hdrh.histogram import HdrHistogram

from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements
from harness.checks.tokens import INTEGRITY_PROBLEMS, _cell
from harness.results import hdr


def count_at_most(h: HdrHistogram, bound_us: float) -> int:
    """How many recorded values are at most ``bound_us``, to HDR precision: a value
    counts when the lowest value of its bucket is within the bound (a value at the bound
    is within it; one up to 0.1 % above it may be too)."""
    values, cum = hdr.cumulative(h)
    within = 0
    for value, n in zip(values, cum, strict=True):
        if h.get_lowest_equivalent_value(value) > bound_us:
            break
        within = n
    return within


def _hist(cell: Mapping[str, Any], name: str) -> HdrHistogram:
    return hdr.decode((cell.get("hdr") or {}).get(name))


@implements("llm.overload")
def overload(result: Mapping[str, Any], r: Result) -> Check:
    p = r.params
    cell, where = _cell(result, str(p["stage"]))
    if cell is None:
        return r.skipped(where)
    if "hdr" not in cell:
        return r.skipped(
            f"the token figures of {where} keep no whole TTFT histogram (a results file "
            "written before llm.overload existed): run the scenario again"
        )
    requests = int(cell.get("requests") or 0)
    dropped = int(cell.get("dropped") or 0)
    total = requests + dropped
    if total < int(p["min_requests"]):
        return r.skipped(f"{total} requests in {where} (< {p['min_requests']})", n=total)
    ok_n, failed = int(cell.get("ok") or 0), int(cell.get("failed") or 0)
    ttft_ms, reject_ms = float(p["ttft_ms"]), float(p["reject_ms"])
    ttft = _hist(cell, "ttft")
    shed = _hist(cell, "e2e_rejected")
    # the TTFT histogram holds the aborted streams' first tokens too: counted as if every
    # one of them were in time, so no late whole answer can hide behind an early hang-up
    aborted = int(cell.get("aborted") or 0)
    in_time = min(ok_n, max(0, count_at_most(ttft, ttft_ms * 1000.0) - aborted))
    late = ok_n - in_time
    shed_n = int(shed.get_total_count())
    shed_fast = count_at_most(shed, reject_ms * 1000.0)
    other_failed = failed - shed_n
    t = cell.get("ttft_ms") or {}
    ttft_seen = (
        f"TTFT p50 {fmt(t.get('p50_ms'))} ms, p99 {fmt(t.get('p99_ms'))} ms, "
        f"max {fmt(t.get('max_ms'))} ms"
    )
    if shed_n == 0 and failed == 0 and dropped == 0 and late == 0:
        return r.skipped(
            "not judged: the spike did not exceed capacity (none it could not serve "
            f"within the bound) — none of the {total} requests "
            f"in {where} was refused, failed or dropped, and every first token came within "
            f"{fmt(ttft_ms)} ms ({ttft_seen}); raise the spike's rate above the server's "
            "capacity to judge how it sheds",
            n=total,
        )
    handled = in_time + shed_fast
    share = handled / total
    ok = r.compare(share)
    by_problem = (cell.get("goodput") or {}).get("by_problem") or {}
    problems = {
        k: int(v)
        for k, v in by_problem.items()
        if v and k != "http_error" and k not in INTEGRITY_PROBLEMS
    }
    if (other_http := int(by_problem.get("http_error") or 0) - shed_n) > 0:
        problems["http_error (not 429/503)"] = other_http
    not_well = [
        f"{late} admitted but first token later than {fmt(ttft_ms)} ms",
        f"{shed_n - shed_fast} 429/503 slower than {fmt(reject_ms)} ms",
        f"{other_failed} other failures"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(problems.items()))})" if problems else ""),
        f"{dropped} dropped at the client's in-flight cap",
    ]
    detail = (
        f"{handled} of {total} requests sent in {where} handled well ({share:.2%} "
        f"{'≥' if ok else '<'} {r.threshold:.0%}): {in_time} whole answers with the first "
        f"token within {fmt(ttft_ms)} ms, {shed_fast} 429/503 answered within "
        f"{fmt(reject_ms)} ms; not: {'; '.join(not_well)} ({ttft_seen})"
    )
    if not ok:
        detail += (
            " — above capacity the server must refuse what it cannot serve in time (a "
            "bounded waiting queue answering 429 with Retry-After), not queue it: a queue "
            "that grows for as long as the overload lasts delays every admitted request"
            if late >= max(other_failed, dropped, shed_n - shed_fast)
            else " — overload must be refused at once, not left to time out, reset or "
            "fail: see the failures by kind"
        )
    return r.judged(round(share, 4), ok, detail, n=total)
