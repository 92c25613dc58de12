"""The latency histograms of the whole project: one shape, one codec, one percentile rule.

* Shape: ``HdrHistogram(1 µs, 60 s, 3 significant digits)`` holding microseconds.
* Codec: ``encode`` gives the base64 text a results document stores, and ``None`` for a
  missing or empty histogram; ``decode`` reads that text back, and reads ``None`` (or
  ``""``) as an empty histogram — in a results document "no histogram" and "nothing
  recorded" are the same thing. A damaged string raises ``HdrFormatError`` (a
  ``ValueError``); the report catches it and leaves the table out, the checks let it
  surface.
* Percentile rule: nearest rank over the recorded counts. The p-th percentile of n values
  is the value at rank ⌈p/100 · n⌉ (at least 1), reported as the highest value of its HDR
  bucket — so a p99 always names a latency some request really had, to HDR precision.
  Window rows, checks and reports all use it. (hdrh's own ``get_value_at_percentile``
  rounds p/100 · n to the nearest rank instead: for n = 160 its p99 is the 158th value,
  ours the 159th. Nothing in the harness calls it.)

hdrh and numpy only, so the load side can summarise windows with it (through
``harness.results``) without importing the statistics that judge them.
"""

from __future__ import annotations

import binascii
import math
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
from hdrh.codec import HdrCookieException, HdrHistogramSettingsException, HdrLengthException
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 60_000_000
SIGNIFICANT_DIGITS = 3

# The percentiles a summary reports by default (window rows: p50, p90, p99 and max).
SUMMARY_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)

# What hdrh raises on a damaged string (base64, zlib, its own header checks).
_DECODE_ERRORS = (
    ValueError,
    TypeError,
    IndexError,
    binascii.Error,
    zlib.error,
    HdrCookieException,
    HdrLengthException,
    HdrHistogramSettingsException,
)


class HdrFormatError(ValueError):
    """A stored histogram string that is not an HDR histogram."""


def new_histogram() -> HdrHistogram:
    """An empty histogram of the project's one shape (µs, 1 µs – 60 s, 3 digits)."""
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)


def clamp_us(value_us: float) -> int:
    """Histogram value for a duration in µs: at least 1, at most the top of the range."""
    return min(max(int(value_us), LOWEST_US), HIGHEST_US)


def encode(h: HdrHistogram | None) -> str | None:
    """base64 text of a non-empty histogram (hdrh returns bytes), else None."""
    if h is None or not h.get_total_count():
        return None
    blob = h.encode()
    return blob.decode("ascii") if isinstance(blob, bytes) else blob


def decode(encoded: str | bytes | None) -> HdrHistogram:
    """The histogram of an ``encode()`` string; an empty one for None or ``""``."""
    if not encoded:
        return new_histogram()
    try:
        return HdrHistogram.decode(
            encoded if isinstance(encoded, bytes) else str(encoded).encode("ascii")
        )
    except _DECODE_ERRORS as exc:
        text = repr(encoded)
        short = text if len(text) <= 40 else text[:37] + "..."
        raise HdrFormatError(
            f"histogram {short} is not an HDR histogram string ({type(exc).__name__}: {exc})"
        ) from None


def merge(items: Iterable[str | bytes | HdrHistogram | None]) -> HdrHistogram:
    """Merge histograms exactly (percentiles are never averaged across histograms).

    Encoded strings and histograms may be mixed; ``None`` (nothing recorded) adds nothing.
    """
    total = new_histogram()
    for item in items:
        if item is None:
            continue
        total.add(item if isinstance(item, HdrHistogram) else decode(item))
    return total


def cumulative(h: HdrHistogram) -> tuple[list[int], list[int]]:
    """Distinct recorded values (µs, highest equivalent of each bucket) and the count of
    values at or below each."""
    values: list[int] = []
    cum: list[int] = []
    for item in h.get_recorded_iterator():
        values.append(int(item.value_iterated_to))
        cum.append(int(item.total_count_to_this_value))
    return values, cum


def nearest_rank(n: int, q: float) -> int:
    """Nearest-rank index (1-based) of quantile ``q`` (0 < q ≤ 1) among ``n`` samples."""
    # the small epsilon keeps 0.99 * 1000 from becoming 991 through float error
    return min(n, max(1, math.ceil(q * n - 1e-9)))


def values_at_ranks_us(h: HdrHistogram, ranks: Sequence[int]) -> list[int]:
    """The ``ranks``-th smallest recorded values (1-based), in µs.

    A cumulative sum over the counts between the lowest and the highest value recorded
    (numpy) and a binary search per rank: the master summarises every window of every
    class with this while the load runs, so it must not hold the gevent loop (hdrh's
    recorded-value iterator takes ~25 ms a histogram in pure Python; a sum over the whole
    counts array, 23,552 of them, ~75 µs; over the recorded range, a few µs for a window's
    latencies).
    """
    n = h.get_total_count()
    for rank in ranks:
        if not 1 <= rank <= n:
            raise ValueError(f"rank {rank} outside 1..{n}")
    # a decoded histogram may carry a shorter counts payload: the rest counts zero
    stored = min(h.counts_len, h.encoder.payload.counts_len)
    lo = min(h._counts_index_for(h.get_min_value()), stored)
    hi = min(h._counts_index_for(h.get_max_value()) + 1, stored)
    counts = np.ctypeslib.as_array(h.counts)[lo:hi]
    cum = np.cumsum(counts, dtype=np.int64)
    if not len(cum) or cum[-1] != n:  # the min/max bounds disagree with the counts
        lo, cum = 0, np.cumsum(np.ctypeslib.as_array(h.counts)[:stored], dtype=np.int64)
    out = []
    for index in np.searchsorted(cum, np.asarray(ranks, dtype=np.int64), side="left"):
        if index >= len(cum):  # unreachable for a consistent histogram
            raise ValueError(f"a rank among {list(ranks)} not found among {n} recorded values")
        value = h.get_value_from_index(lo + int(index))
        out.append(int(h.get_highest_equivalent_value(value)))
    return out


def value_at_rank_us(h: HdrHistogram, rank: int) -> int:
    """The ``rank``-th smallest recorded value (1-based), in µs."""
    return values_at_ranks_us(h, [rank])[0]


def percentile_ms(h: HdrHistogram, percentile: float) -> float | None:
    """The ``percentile`` (0–100] in milliseconds by nearest rank; None when empty."""
    n = h.get_total_count()
    if n == 0:
        return None
    return value_at_rank_us(h, nearest_rank(n, percentile / 100.0)) / 1000.0


def percentile_key(percentile: float) -> str:
    """Field name of a percentile in a summary: 50 → ``p50_ms``, 99.9 → ``p999_ms``."""
    return f"p{f'{percentile:g}'.replace('.', '')}_ms"


def summary_ms(
    h: HdrHistogram, percentiles: Sequence[float] = SUMMARY_PERCENTILES
) -> dict[str, float | None]:
    """``pNN_ms`` for each percentile plus ``max_ms``, by the nearest-rank rule; every
    value None for an empty histogram."""
    keys = [percentile_key(p) for p in percentiles]
    n = h.get_total_count()
    if not n:
        return {**dict.fromkeys(keys), "max_ms": None}
    values = values_at_ranks_us(h, [nearest_rank(n, p / 100.0) for p in percentiles])
    out: dict[str, float | None] = {k: v / 1000.0 for k, v in zip(keys, values, strict=True)}
    out["max_ms"] = h.get_max_value() / 1000.0
    return out
