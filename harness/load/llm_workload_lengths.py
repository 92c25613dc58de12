"""Seeded token-length distributions, written as one short spec string.

A spec is ``KIND:PARAMS``; a bare integer is a constant::

    128                                          constant 128
    constant:128
    uniform:min=64,max=1024                      integers in [64, 1024], each equally likely
    normal:mean=512,stdev=128,min=16,max=2048    rounded, then clipped to [min, max]
    lognormal:mean=256,stdev=200,min=1,max=4096  the length's own mean and stdev (not the log's)
    empirical:128,256,256,1024                   one of the values, each listed one equally likely

``min`` defaults to 1 and ``max`` to no bound; every length is at least 1. A draw is a
function of the ``random.Random`` it is given only, so the same seed gives the same
lengths on every process and platform (CPython's ``random`` is specified to reproduce
its sequences for a given seed). A bad spec raises ``ConfigError`` naming the spec, what
is wrong and an example to copy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.errors import ConfigError

KINDS = ("constant", "uniform", "normal", "lognormal", "empirical")
_EXAMPLE = "e.g. 'normal:mean=512,stdev=128,min=16,max=2048' (kinds: " + ", ".join(KINDS) + ")"
_Fail = Callable[[str], ConfigError]
_PARAMS = {
    "constant": ({"value"}, set()),
    "uniform": ({"min", "max"}, set()),
    "normal": ({"mean", "stdev"}, {"min", "max"}),
    "lognormal": ({"mean", "stdev"}, {"min", "max"}),
}


@dataclass(frozen=True)
class LengthSpec:
    """One parsed spec; ``text`` is what it was parsed from (it goes in plans and results)."""

    kind: str
    text: str
    mean: float = 0.0  # normal / lognormal: before clipping
    stdev: float = 0.0
    low: int = 1  # the smallest length a draw can give
    high: int | None = None  # the largest, None: unbounded
    values: tuple[int, ...] = field(default=())  # empirical

    def draw(self, rng: random.Random) -> int:
        """One length, from ``rng`` only."""
        if self.kind == "constant":
            return self.low
        if self.kind == "uniform":
            assert self.high is not None
            return rng.randint(self.low, self.high)
        if self.kind == "empirical":
            return self.values[rng.randrange(len(self.values))]
        if self.kind == "normal":
            x = rng.normalvariate(self.mean, self.stdev)
        else:
            sigma2 = math.log1p((self.stdev / self.mean) ** 2)
            x = rng.lognormvariate(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2))
        n = max(self.low, round(x))
        return n if self.high is None else min(self.high, n)

    def draws(self, rng: random.Random, count: int) -> list[int]:
        return [self.draw(rng) for _ in range(count)]


def parse_length(value: object, what: str = "length") -> LengthSpec:
    """The spec ``value`` (a spec string, or an integer for a constant) names; ``what``
    names the option in the error (e.g. ``llm.input``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} = {value!r} is not a length spec; write {_EXAMPLE}")
    text = value.strip()

    def fail(problem: str) -> ConfigError:
        return ConfigError(f"{what} = {text!r}: {problem}; write {_EXAMPLE}")

    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if not sep and kind.isdigit():
        kind, rest = "constant", kind
    if kind not in KINDS:
        raise fail(f"unknown kind {kind!r}")
    if kind == "empirical":
        values = tuple(_integer(v, "a value", fail) for v in rest.split(",") if v.strip())
        if not values:
            raise fail("no values; list them after the colon, comma-separated")
        return LengthSpec(kind, text, low=min(values), high=max(values), values=values)
    if kind == "constant" and rest.strip().isdigit():
        rest = f"value={rest.strip()}"
    params = _params(rest, kind, fail)
    if kind == "constant":
        n = _integer(params["value"], "value", fail)
        return LengthSpec(kind, text, mean=n, low=n, high=n)
    if kind == "uniform":
        lo, hi = _integer(params["min"], "min", fail), _integer(params["max"], "max", fail)
        if lo > hi:
            raise fail(f"min {lo} > max {hi}")
        return LengthSpec(kind, text, mean=(lo + hi) / 2, low=lo, high=hi)
    mean, stdev = _number(params["mean"], "mean", fail), _number(params["stdev"], "stdev", fail)
    if mean <= 0 or stdev < 0:
        raise fail("mean must be > 0 and stdev >= 0")
    if kind == "lognormal" and stdev == 0:
        raise fail("a lognormal needs stdev > 0 (use constant for a fixed length)")
    lo = _integer(params.get("min", "1"), "min", fail)
    hi = _integer(params["max"], "max", fail) if "max" in params else None
    if hi is not None and lo > hi:
        raise fail(f"min {lo} > max {hi}")
    return LengthSpec(kind, text, mean=mean, stdev=stdev, low=lo, high=hi)


def _params(rest: str, kind: str, fail: _Fail) -> dict[str, str]:
    required, optional = _PARAMS[kind]
    out: dict[str, str] = {}
    for item in (p for p in rest.split(",") if p.strip()):
        key, eq, val = item.partition("=")
        key = key.strip().lower()
        if not eq:
            raise fail(f"{item.strip()!r} is not NAME=VALUE")
        if key not in required | optional:
            raise fail(f"{kind} takes {', '.join(sorted(required | optional))}, not {key!r}")
        if key in out:
            raise fail(f"{key} is given twice")
        out[key] = val.strip()
    absent = sorted(required - out.keys())
    if absent:
        raise fail(f"{kind} needs {', '.join(absent)}")
    return out


def _integer(text: str, name: str, fail: _Fail) -> int:
    try:
        n = int(text.strip())
    except ValueError:
        raise fail(f"{name} {text.strip()!r} is not an integer") from None
    if n < 1:
        raise fail(f"{name} {n} is below 1 (a length is at least 1 token)")
    return n


def _number(text: str, name: str, fail: _Fail) -> float:
    try:
        x = float(text)
    except ValueError:
        raise fail(f"{name} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise fail(f"{name} {text!r} is not finite")
    return x
