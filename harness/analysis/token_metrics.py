"""Token metrics of LLM streams: TTFT, TPOT, inter-token latency, gaps, tokens/s, goodput.

Pure functions over recorded streams (``harness.protocols.openai_stream.StreamRecord``,
or anything with the fields of ``TokenStream``). Every definition is chosen on purpose
and compared with vLLM ``bench serve``, SGLang ``bench_serving``, GuideLLM, AIPerf and
MLPerf LoadGen in docs/llm-metrics.md; in short:

- **TTFT**: from the intended send time to the first token-bearing event (the record's).
- **TPOT** per request = (t_last − t_first) / (tokens − 1): the time between the first
  and the last token-bearing events over the tokens after the first, with tokens from
  ``usage`` when the server sent it. Undefined (None) below 2 tokens.
- **Inter-token latency**, two ways: ``event_gaps_s`` pools the gaps between
  consecutive token-bearing events (one value per event, as vLLM and SGLang pool their
  chunks); ``token_gaps_s`` spreads each gap over the tokens of the later event (one
  value per token, as SGLang's native client does), so N tokens per event do not read as
  an N-times longer inter-token latency.
- **Longest gap** between consecutive token-bearing events, per request (stalls).
- **Tokens per second**: output and input tokens over a span, mean and peak over fixed
  1-s windows; an event's tokens count at its arrival, a request's prompt tokens at its
  first token (when the prefill they cost was done).
- **SLO attainment and goodput**: a request conforms when it did not fail (no error, not
  truncated, at least one token) and meets every bound given (inclusive); attainment is
  the conforming fraction of all requests, goodput the conforming requests per second.
  Latency distributions (``ttfts_s``, ``tpots_s``, ...) hold the requests that did not
  fail; the failures are counted by ``slo_attainment``.

Times are seconds. numpy-free: the inputs are small per-request tuples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class TokenStream(Protocol):
    """What these functions read of a recorded stream (``StreamRecord`` has it all)."""

    @property
    def intended_at(self) -> float: ...  # the stream's intended send time (caller's clock)
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def end_s(self) -> float: ...
    @property
    def token_times_s(self) -> tuple[float, ...]: ...
    @property
    def token_counts(self) -> tuple[int, ...]: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def failed(self) -> bool: ...


# -- per request -----------------------------------------------------------------------


def tpot_s(stream: TokenStream) -> float | None:
    """(t_last − t_first) / (tokens − 1) over the token-bearing events; None below 2
    tokens or without a token event."""
    times, n = stream.token_times_s, stream.output_tokens
    if n < 2 or not times:
        return None
    return (times[-1] - times[0]) / (n - 1)


def event_gaps_s(stream: TokenStream) -> list[float]:
    """The gaps between consecutive token-bearing events: one value per event after the
    first, whatever each carried."""
    t = stream.token_times_s
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def token_gaps_s(stream: TokenStream) -> list[float]:
    """One value per token after the first event: each gap divided by the later event's
    token count, repeated that many times (their sum is t_last − t_first)."""
    t, counts = stream.token_times_s, stream.token_counts
    out: list[float] = []
    for i in range(1, len(t)):
        k = max(1, counts[i])
        out.extend([(t[i] - t[i - 1]) / k] * k)
    return out


def max_gap_s(stream: TokenStream) -> float | None:
    """The longest gap between consecutive token-bearing events (None: fewer than 2)."""
    return max(event_gaps_s(stream), default=None)


# -- over requests ---------------------------------------------------------------------


def _ok(streams: Iterable[TokenStream]) -> list[TokenStream]:
    return [s for s in streams if not s.failed]


def ttfts_s(streams: Iterable[TokenStream]) -> list[float]:
    """The TTFT of every request that did not fail."""
    return [s.ttft_s for s in _ok(streams) if s.ttft_s is not None]


def tpots_s(streams: Iterable[TokenStream]) -> list[float]:
    """The TPOT of every request that did not fail and has one (≥ 2 tokens)."""
    return [v for s in _ok(streams) if (v := tpot_s(s)) is not None]


def pooled_event_gaps_s(streams: Iterable[TokenStream]) -> list[float]:
    """Inter-token latency pooled per event over the requests that did not fail."""
    return [g for s in _ok(streams) for g in event_gaps_s(s)]


def pooled_token_gaps_s(streams: Iterable[TokenStream]) -> list[float]:
    """Inter-token latency pooled per token over the requests that did not fail."""
    return [g for s in _ok(streams) for g in token_gaps_s(s)]


def max_gaps_s(streams: Iterable[TokenStream]) -> list[float]:
    """Each request's longest gap (requests that did not fail, with ≥ 2 token events)."""
    return [g for s in _ok(streams) if (g := max_gap_s(s)) is not None]


@dataclass(frozen=True)
class Throughput:
    """Tokens per second over ``[start, start + duration_s]`` (the caller's clock)."""

    start: float
    duration_s: float
    output_tokens: float
    input_tokens: int
    output_mean: float
    output_peak: float  # the busiest window of window_s, per second
    input_mean: float
    input_peak: float
    window_s: float


def token_throughput(
    streams: Sequence[TokenStream],
    start: float | None = None,
    end: float | None = None,
    window_s: float = 1.0,
) -> Throughput:
    """Output and input tokens per second, mean over the span and peak over fixed
    windows of ``window_s`` from ``start`` (default: the span from the first intended
    send to the last end). Every stream counts, failed or not: what the server delivered.
    An event's tokens are its count scaled so the request's events sum to its
    ``output_tokens`` (usage, when the server sent it); they land in the window of the
    event's arrival. Tokens outside ``[start, end]`` are left out; the last window may be
    shorter than ``window_s`` (it holds ``end``)."""
    if window_s <= 0:
        raise ValueError(f"window_s has value {window_s!r}; expected a duration > 0")
    if start is None:
        start = min((s.intended_at for s in streams), default=0.0)
    if end is None:
        end = max((s.intended_at + s.end_s for s in streams), default=start)
    duration = max(0.0, end - start)
    windows = max(1, math.ceil(duration / window_s)) if duration else 1
    out_w, in_w = [0.0] * windows, [0.0] * windows
    out_total, in_total = 0.0, 0

    def window(at: float) -> int | None:
        if not start <= at <= end:
            return None
        return min(math.floor((at - start) / window_s), windows - 1)

    for s in streams:
        counted = sum(s.token_counts)
        scale = s.output_tokens / counted if counted else 0.0
        for t, k in zip(s.token_times_s, s.token_counts, strict=False):
            i = window(s.intended_at + t)
            if i is not None:
                out_w[i] += k * scale
                out_total += k * scale
        prefill_at = s.intended_at + (s.ttft_s if s.ttft_s is not None else s.end_s)
        i = window(prefill_at)
        if s.prompt_tokens and i is not None:
            in_w[i] += s.prompt_tokens
            in_total += s.prompt_tokens
    per_s = 1.0 / window_s
    return Throughput(
        start=start,
        duration_s=duration,
        output_tokens=out_total,
        input_tokens=in_total,
        output_mean=out_total / duration if duration else 0.0,
        output_peak=max(out_w) * per_s,
        input_mean=in_total / duration if duration else 0.0,
        input_peak=max(in_w) * per_s,
        window_s=window_s,
    )


@dataclass(frozen=True)
class SLO:
    """Per-request bounds (seconds); None: not bounded. A bound is met at equality."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    max_gap_s: float | None = None
    e2e_s: float | None = None


def conforms(stream: TokenStream, slo: SLO) -> bool:
    """The request did not fail and meets every bound of ``slo``. A request of one token
    has no TPOT and no gap: it meets those bounds (there was nothing to be late)."""
    if stream.failed or stream.ttft_s is None:
        return False
    checks = (
        (slo.ttft_s, stream.ttft_s),
        (slo.tpot_s, tpot_s(stream)),
        (slo.max_gap_s, max_gap_s(stream)),
        (slo.e2e_s, stream.end_s),
    )
    return all(bound is None or value is None or value <= bound for bound, value in checks)


@dataclass(frozen=True)
class Attainment:
    requests: int
    conforming: int
    failed: int
    attainment: float | None  # conforming / requests; None without requests
    goodput_rps: float | None  # conforming / duration_s; None without a duration


def slo_attainment(
    streams: Iterable[TokenStream], slo: SLO, duration_s: float | None = None
) -> Attainment:
    """The share of all requests that conform to ``slo`` (failures count against it),
    and the conforming requests per second over ``duration_s`` (request goodput)."""
    streams = list(streams)
    good = sum(1 for s in streams if conforms(s, slo))
    failed = sum(1 for s in streams if s.failed or s.ttft_s is None)
    return Attainment(
        requests=len(streams),
        conforming=good,
        failed=failed,
        attainment=good / len(streams) if streams else None,
        goodput_rps=good / duration_s if duration_s else None,
    )
