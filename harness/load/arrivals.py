"""Open-loop arrival schedules: when each request is *meant* to be sent.

Pure and deterministic for a seed — no gevent, no clock. A worker's scheduler iterates
the intended send offsets (seconds after the load started), sleeps until each one and
measures latency from it, so a stalled server cannot slow the schedule down
. The rate is piecewise constant over the scenario's stages.

Splitting across W workers keeps the total exact:
- constant: the global schedule ``start + i/R`` is dealt out round-robin, worker w taking
  i = w, w + W, w + 2W, … — the union over workers is the single-process schedule;
- poisson: each worker runs its own Poisson process at R/W with its own seeded stream;
  the superposition of independent Poisson processes is a Poisson process at R.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class Segment:
    """A span of the schedule at one rate (an open-loop stage, rate already resolved)."""

    start_s: float
    duration_s: float
    rate_rps: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def _check(segments: Sequence[Segment], worker_index: int, worker_count: int) -> None:
    if worker_count < 1 or not 0 <= worker_index < worker_count:
        raise ValueError(
            f"worker_index = {worker_index}, worker_count = {worker_count}: need "
            "worker_count ≥ 1 and 0 ≤ worker_index < worker_count"
        )
    for s in segments:
        if not (s.duration_s >= 0 and s.rate_rps >= 0 and math.isfinite(s.rate_rps)):
            raise ValueError(f"{s}: duration_s and rate_rps must be finite and ≥ 0")


def constant_offsets(
    segments: Iterable[Segment], *, worker_index: int = 0, worker_count: int = 1
) -> Iterator[float]:
    """``start + i/R`` in each segment, the i's dealt round-robin across workers."""
    segs = list(segments)
    _check(segs, worker_index, worker_count)
    for s in segs:
        if s.rate_rps <= 0 or s.duration_s <= 0:
            continue
        # i/R < D  ⇔  i < R·D; the epsilon keeps an exact product (e.g. 100 × 10) exact.
        n = math.ceil(s.rate_rps * s.duration_s - 1e-9)
        for i in range(worker_index, n, worker_count):
            yield s.start_s + i / s.rate_rps


def poisson_offsets(
    segments: Iterable[Segment],
    rng: random.Random,
    *,
    worker_index: int = 0,
    worker_count: int = 1,
) -> Iterator[float]:
    """Exponential gaps at rate R/W per worker; restarts at each segment boundary.

    Restarting at a boundary is exact for a piecewise-constant rate: the process is
    memoryless, so the time already waited in the previous segment carries no information.
    """
    segs = list(segments)
    _check(segs, worker_index, worker_count)
    for s in segs:
        rate = s.rate_rps / worker_count
        if rate <= 0 or s.duration_s <= 0:
            continue
        t = s.start_s + rng.expovariate(rate)
        while t < s.end_s:
            yield t
            t += rng.expovariate(rate)


def worker_rng(seed: int, worker_index: int) -> random.Random:
    """An independent, reproducible stream per worker (string seeds hash with SHA-512)."""
    return random.Random(f"harness-arrivals/{seed}/{worker_index}")


def schedule(
    segments: Iterable[Segment],
    arrival: str,
    *,
    seed: int = 1,
    worker_index: int = 0,
    worker_count: int = 1,
) -> Iterator[float]:
    """Intended send offsets for one worker: ``arrival`` is "constant" or "poisson"."""
    if arrival == "constant":
        return constant_offsets(segments, worker_index=worker_index, worker_count=worker_count)
    if arrival == "poisson":
        rng = worker_rng(seed, worker_index)
        return poisson_offsets(segments, rng, worker_index=worker_index, worker_count=worker_count)
    raise ValueError(f"arrival = {arrival!r} is not valid; use one of: constant, poisson")


def expected_count(segments: Iterable[Segment]) -> float:
    """Σ rate × duration: how many arrivals the whole schedule should hold (all workers)."""
    return sum(s.rate_rps * s.duration_s for s in segments)


def class_picker(shares: Sequence[float], rng: random.Random) -> Callable[[], int]:
    """Draw a traffic-class index per arrival with probabilities ``shares``.

    Random rather than round-robin so each class's own arrivals stay Poisson when the
    schedule is Poisson (a thinned Poisson process is Poisson).
    """
    if not shares or any(s < 0 for s in shares) or sum(shares) <= 0:
        raise ValueError(f"shares = {list(shares)} must be ≥ 0 with a positive sum")
    cum = list(accumulate(shares))
    total = cum[-1]
    last = len(cum) - 1

    def pick() -> int:
        return min(bisect.bisect_right(cum, rng.random() * total), last)

    return pick
