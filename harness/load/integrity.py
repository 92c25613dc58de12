"""Does each answer belong to its own request?

Before load, every input of the payload pool is sent once, sequentially (batch size 1),
and its output kept as the *golden* output. Under load each answer is compared with the
golden output of the input it was sent with: within the tolerance τ → ``ok``; nearest to
*another* input's golden output (within τ) → ``cross_wired``; anything else → ``drift``
(its own output, only further than τ: batching changed the numbers). Inputs whose golden
outputs are within 2τ of each other cannot be told apart; a match between such twins
counts as ok, and the number of distinguishable inputs is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# how an answer is read is its protocol's (harness.protocols.WireProtocol.parse_answer);
# one that cannot be read is judged here as what it is (bad_response)
from harness.protocols import BadResponse  # noqa: F401

# Float32 models batched differently give ~1e-6 relative differences; 1e-4 leaves room
# for BLAS kernel changes while staying far below the distance between distinct inputs.
DEFAULT_RELATIVE_TOLERANCE = 1e-4
ABSOLUTE_FLOOR = 1e-6


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok" | "drift" | "cross_wired"
    matched: int | None = None  # the input whose golden output the answer matched
    distance: float | None = None


@dataclass
class Golden:
    """Golden outputs of the input pool and the tolerance used to compare against them."""

    outputs: list[tuple[Any, ...]]
    tolerance: float
    numeric: bool = True
    twins: list[frozenset[int]] = field(default_factory=list)
    _matrix: Any = None
    _exact: dict[tuple[Any, ...], list[int]] = field(default_factory=dict)
    # the rows of _matrix as Python floats: an answer that matches its own input is
    # judged on these without numpy, whose per-call cost dwarfs a few values
    _rows: list[tuple[float, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.outputs)
        lengths = {len(o) for o in self.outputs}
        if self.numeric and len(lengths) == 1:
            self._matrix = np.asarray(self.outputs, dtype=np.float64)
            self._rows = [tuple(row) for row in self._matrix.tolist()]
        else:
            self.numeric = False
            for i, o in enumerate(self.outputs):
                self._exact.setdefault(o, []).append(i)
        if not self.twins:
            self.twins = [frozenset([i]) for i in range(n)]
            if self._matrix is not None and n > 1:
                for i in range(n):
                    d = np.abs(self._matrix - self._matrix[i]).max(axis=1)
                    self.twins[i] = frozenset(np.nonzero(d <= 2 * self.tolerance)[0].tolist())
            else:
                for same in self._exact.values():
                    for i in same:
                        self.twins[i] = frozenset(same)

    @property
    def distinct(self) -> int:
        """Inputs whose golden output no other input shares (within 2τ)."""
        return sum(1 for t in self.twins if len(t) == 1)

    def holds_own(self, index: int, values: Sequence[Any]) -> bool:
        """Whether ``values`` is pool input ``index``'s golden output: within τ, or for
        outputs that are not numbers, equal."""
        if self._rows:
            return self.own_distance(index, values) is not None
        return tuple(values) == self.outputs[index]

    def own_distance(self, index: int, values: Sequence[Any]) -> float | None:
        """max |value − golden| of an answer within τ of pool input ``index``'s golden
        output; None when it is not (or is not numeric, or has another length): then only
        ``classify`` says what it is. The common case, decided without numpy."""
        rows = self._rows
        if not rows:
            return None
        own = rows[index]
        if len(values) != len(own):
            return None
        tol = self.tolerance
        worst = 0.0
        for v, g in zip(values, own, strict=True):
            # JSON gives exactly int or float; bool (an int) and anything else is not a number
            kind = type(v)
            if kind is not float and kind is not int:
                return None
            try:
                d = abs(v - g)
            except OverflowError:  # an int beyond float range
                return None
            # written so that NaN (every comparison false) is never within τ
            if not d <= tol:
                return None
            if d > worst:
                worst = d
        return worst

    def classify(self, index: int, values: Sequence[Any]) -> Verdict:
        """Judge the answer ``values`` received for pool input ``index``."""
        own_d = self.own_distance(index, values)
        if own_d is not None:
            return Verdict("ok", index, own_d)
        if not self.numeric or self._matrix is None:
            own = self.outputs[index]
            if tuple(values) == own:
                return Verdict("ok", index, 0.0)
            matches = self._exact.get(tuple(values))
            if matches:
                return Verdict("cross_wired", matches[0], 0.0)
            return Verdict("drift", None, None)
        if len(values) != self._matrix.shape[1] or not _numeric(values):
            return Verdict("drift", None, None)
        try:
            v = np.asarray(values, dtype=np.float64)
        except OverflowError:  # an integer no float holds: not anyone's output
            return Verdict("drift", None, None)
        own = float(np.abs(v - self._matrix[index]).max())
        if own <= self.tolerance:
            return Verdict("ok", index, own)
        dists = np.abs(self._matrix - v).max(axis=1)
        j = int(dists.argmin())
        dj = float(dists[j])
        if j != index and dj <= self.tolerance:
            if j in self.twins[index]:
                return Verdict("ok", j, dj)
            return Verdict("cross_wired", j, dj)
        return Verdict("drift", index, own)

    def summary(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "pool": len(self.outputs), "distinct": self.distinct}


def estimate_tolerance(
    outputs: Sequence[Sequence[Any]],
    repeats: Sequence[tuple[int, Sequence[Any]]] = (),
    relative: float = DEFAULT_RELATIVE_TOLERANCE,
) -> float:
    """τ = max(relative × the outputs' scale, 10 × what repeating an input changed, floor).

    ``repeats`` are (pool index, output) pairs fetched a second time: a server that is not
    deterministic even at batch 1 widens τ instead of flooding the run with drift.
    """
    flat = [abs(float(x)) for o in outputs for x in o if _numeric([x])]
    scale = max(flat) if flat else 1.0
    tau = max(ABSOLUTE_FLOOR, relative * max(scale, 1e-12))
    for i, again in repeats:
        if len(again) == len(outputs[i]) and _numeric(again) and _numeric(outputs[i]):
            diff = max(
                (abs(float(a) - float(b)) for a, b in zip(again, outputs[i], strict=True)),
                default=0.0,
            )
            if math.isfinite(diff):
                tau = max(tau, 10 * diff)
    return tau


def build_golden(
    outputs: Sequence[Sequence[Any]],
    repeats: Sequence[tuple[int, Sequence[Any]]] = (),
    relative: float = DEFAULT_RELATIVE_TOLERANCE,
) -> Golden:
    """Golden outputs for a pool from its batch-1 answers (and a few repeated ones)."""
    outs = [tuple(o) for o in outputs]
    numeric = all(_numeric(o) for o in outs)
    tau = estimate_tolerance(outs, repeats, relative) if numeric else 0.0
    return Golden(outs, tau, numeric)


def golden_to_wire(g: Golden) -> dict[str, Any]:
    """JSON-able form, so the master fetches once and every worker judges alike."""
    return {"outputs": [list(o) for o in g.outputs], "tolerance": g.tolerance, "numeric": g.numeric}


def golden_from_wire(data: Mapping[str, Any]) -> Golden:
    return Golden(
        [tuple(o) for o in data["outputs"]], float(data["tolerance"]), bool(data["numeric"])
    )
