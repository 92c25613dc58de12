"""Token-stream checks: an OpenAI-compatible server judged in tokens.

Each reads the scenario's ``tokens`` section (``harness.load.stream_exchange`` records it:
per stage and per traffic class, HDR-exact percentiles merged across workers), one stage
(``stage``; empty: the whole run). A run of a protocol that does not stream has no such
section: the checks are skipped, saying so.

Definitions (docs/llm-metrics.md): TTFT from the request's intended send time to its
first token-bearing event (a role chunk or an empty delta is not a token); TPOT per
request = (last token event − first) / (output tokens − 1); both over the requests that
got a whole answer. A request that failed has no TTFT: like ``steady.p99_ms``, when more
than 1 % of the requests failed, the 99th percentile is one of them and the check fails
on that, whatever the successes' p99.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from harness.checks._data import fmt
from harness.checks.model import Check, Result
from harness.checks.registry import implements

# the problem codes that make a stream untrue or malformed, judged by llm.stream_integrity
# (a timeout, a stall, an HTTP error or a refused connection is a load outcome, judged
# by the latency and goodput checks)
INTEGRITY_PROBLEMS = (
    "wrong_text",
    "wrong_finish_reason",
    "usage_mismatch",
    "no_usage",
    "no_done",
    "data_after_done",
    "error_in_stream",
    "no_finish_reason",
    "truncated_at_close",
    "malformed_event",
)


def _cell(result: Mapping[str, Any], stage: str) -> tuple[Mapping[str, Any] | None, str]:
    """The token figures of ``stage`` (all classes), or of the whole run when empty;
    (None, why) when there are none."""
    tokens = result.get("tokens")
    if not tokens:
        return None, (
            "no token streams were recorded: this check judges a streaming protocol's run "
            "(--protocol openai)"
        )
    if stage:
        found = (tokens.get("by_stage") or {}).get("classes", {}).get(stage)
        if found is None:
            return None, f"no streams were sent in stage {stage!r}"
        return found, f"stage {stage}"
    return (tokens.get("by_class") or {}).get("total"), "the whole run"


def _latency_p99(result: Mapping[str, Any], r: Result, hist: str, what: str) -> Check:
    cell, where = _cell(result, str(r.params["stage"]))
    if cell is None:
        return r.skipped(where)
    ok_n, failed = int(cell.get("ok") or 0), int(cell.get("failed") or 0)
    dropped = int(cell.get("dropped") or 0)
    h = cell.get(f"{hist}_ms") or {}
    n = int(h.get("count") or 0)
    total = ok_n + failed + dropped
    bad = failed + dropped
    p99 = float(h.get("p99_ms") or 0.0)
    # enough requests for a p99 but too few successes: the failures are the p99 (a
    # server that fails nearly every stream must not have its p99 skipped for want of
    # successes)
    if total >= int(r.params["min_requests"]) and bad / total > 0.01:
        return r.judged(
            float("inf"),
            False,
            f"{what} p99 in {where} is a failure: {bad} of {total} requests failed or were "
            f"dropped ({bad / total:.2%}), more than the 1 % a p99 leaves (the successes' "
            f"p99 {fmt(p99)} ms) — see the failures by kind and llm.goodput",
            n=total,
        )
    if n < int(r.params["min_requests"]):
        return r.skipped(
            f"{n} {what} values in {where} (< {r.params['min_requests']}): too few for a p99",
            n=n,
        )
    ok = r.compare(p99)
    detail = (
        f"{what} p99 {fmt(p99)} ms over {n} requests in {where} (p50 {fmt(h.get('p50_ms'))} ms, "
        f"max {fmt(h.get('max_ms'))} ms), {'≤' if ok else '>'} {fmt(r.threshold)} ms"
    )
    return r.judged(round(p99, 3), ok, detail, n=n)


def _advise(check: Check, advice: str) -> Check:
    return dataclasses.replace(check, detail=check.detail + advice)


@implements("llm.ttft_p99")
def ttft_p99(result: Mapping[str, Any], r: Result) -> Check:
    check = _latency_p99(result, r, "ttft", "time to first token")
    if check.passed is False:
        check = _advise(
            check,
            " — the first token waits behind something: a queue that is not admitted into "
            "the running batch (static batching), long prefills not chunked, or too little "
            "KV cache for the load",
        )
    return check


@implements("llm.tpot_p99")
def tpot_p99(result: Mapping[str, Any], r: Result) -> Check:
    check = _latency_p99(result, r, "tpot", "time per output token")
    if check.passed is False:
        check = _advise(
            check,
            " — decoding steps slow down or pause mid-stream: prefills not chunked stall "
            "every decode, preemption recomputes, or a stream is held (see the longest gap)",
        )
    return check


def _first_words(cell: Mapping[str, Any], found: Mapping[str, int]) -> str:
    """What the commonest problem of ``found`` said the first time (an error body, the
    event that broke the stream), as a clause for a failed check's detail; "" when no
    stream of it was kept."""
    if not found:
        return ""
    code = max(sorted(found), key=lambda k: found[k])
    said = ((cell.get("goodput") or {}).get("examples") or {}).get(code) or []
    return f"; the first {code} said: {said[0]}" if said else ""


@implements("llm.stream_integrity")
def stream_integrity(result: Mapping[str, Any], r: Result) -> Check:
    cell, where = _cell(result, str(r.params["stage"]))
    if cell is None:
        return r.skipped(where)
    requests = int(cell.get("requests") or 0)
    if requests < int(r.params["min_requests"]):
        return r.skipped(
            f"{requests} streams in {where} (< {r.params['min_requests']})", n=requests
        )
    problems = (cell.get("goodput") or {}).get("by_problem") or {}
    found = {k: int(v) for k, v in problems.items() if k in INTEGRITY_PROBLEMS and v}
    bad = sum(found.values())  # one count per stream and problem code
    verified = int(cell.get("verified") or 0)
    ok = r.compare(bad)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(found.items())) or "none"
    detail = (
        f"{bad} stream problem(s) in {requests} streams of {where} ({kinds}); "
        f"{verified} checked token by token against the reference server's oracle"
        if verified
        else f"{bad} stream problem(s) in {requests} streams of {where} ({kinds}); the "
        "text was not checked (not the reference server: form, usage and [DONE] only)"
    )
    if not ok:
        detail += _first_words(cell, found)
        detail += (
            " — a stream that lies about its usage, ends without its finish reason or "
            "[DONE], sends an error under a 200 or carries another request's tokens breaks "
            "every client that trusts it: find the code path named by the problem"
        )
    return r.judged(bad, ok, detail, n=requests)


@implements("llm.goodput")
def goodput(result: Mapping[str, Any], r: Result) -> Check:
    cell, where = _cell(result, str(r.params["stage"]))
    if cell is None:
        return r.skipped(where)
    requests = int(cell.get("requests") or 0)
    dropped = int(cell.get("dropped") or 0)
    total = requests + dropped
    if total < int(r.params["min_requests"]):
        return r.skipped(f"{total} requests in {where} (< {r.params['min_requests']})", n=total)
    conforming = int(cell.get("conforming") or 0)
    share = conforming / total
    ok = r.compare(share)
    failures = {
        k: int(v)
        for k, v in ((cell.get("goodput") or {}).get("by_problem") or {}).items()
        if k not in INTEGRITY_PROBLEMS or k in ("error_in_stream", "no_finish_reason")
    }
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(failures.items()) if v)
    detail = (
        f"{conforming} of {total} requests in {where} got a whole answer ({share:.2%}), "
        f"{'≥' if ok else '<'} {r.threshold:.0%}"
        + (f"; dropped {dropped}" if dropped else "")
        + (f"; {kinds}" if kinds else "")
    )
    if not ok:
        detail += _first_words(cell, {k: v for k, v in failures.items() if v})
        detail += (
            " — requests that fail, time out, stall or end without tokens at the rated load: "
            "the server is past its capacity or breaks streams; see the failures by kind"
        )
    return r.judged(round(share, 5), ok, detail, n=total)
