"""Token-stream stall check: does any stream freeze mid-answer?

``llm.stall`` reads the scenario's ``tokens`` section (``harness.load.stream_recording``:
per stream, the longest gap between two consecutive token-bearing events, kept in the
``max_gap`` histogram; HDR-exact percentiles merged across workers) for one stage
(``stage``; empty: the whole run) and judges the 99th percentile over the streams of
that longest gap against ``threshold`` ms.

A stream's TPOT is the mean of its gaps, so one long pause hides in a long answer: a
stream of 200 tokens at 50 ms that freezes once for 1 s has a TPOT of 55 ms. The longest
gap is what a reader sees, whatever the answer's length.

Failures count as over the threshold, as in ``llm.ttft_p99``: when more than 1 % of the
requests failed (a stall timeout, an error, a truncated stream) or were dropped, the p99
is one of them and the check fails on that. A stream of one token has no gap and is not
counted; with fewer than ``min_requests`` streams of two or more tokens the check is
skipped, saying so. A run of a protocol that does not stream has no ``tokens`` section:
skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.checks.model import Check, Result
from harness.checks.registry import implements
from harness.checks.tokens import _advise, _latency_p99


@implements("llm.stall")
def stall(result: Mapping[str, Any], r: Result) -> Check:
    check = _latency_p99(result, r, "max_gap", "longest gap between tokens")
    if check.passed is False:
        check = _advise(
            check,
            " — running streams freeze mid-answer: a long prompt prefilled whole in a step "
            "without decodes (chunked prefill off), preemptions recomputing sequences (too "
            "little KV cache for the running batch), or a stream held by the server",
        )
    return check
