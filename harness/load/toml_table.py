"""Reading one TOML table (and a rate) with errors that name the file, the key, the value and what is
valid: the scenario parser's building block (an unknown key is an error, not a default).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable
from typing import Any

from harness.errors import ConfigError
from harness.load.scenario_model import Rate


def show(v: Any) -> str:
    try:
        return json.dumps(v, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(v)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class Table:
    """One TOML table being read; remembers its path so errors can name the key."""

    def __init__(self, data: Any, where: str, src: str, keys: Iterable[str] = ()) -> None:
        self.where, self.src = where, src
        if not isinstance(data, dict):
            self.fail("", data, "is not a table")
        self.data = dict(data)
        self.seen: set[str] = set()
        if keys:
            self.allow(keys)

    def allow(self, keys: Iterable[str]) -> None:
        """Declare the valid keys and reject unknown ones now, before a missing key is."""
        self.seen.update(keys)
        self.done()

    def key(self, k: str) -> str:
        return f"{self.where}.{k}" if self.where else k

    def fail(self, k: str, value: Any, problem: str) -> None:
        name = self.key(k) if k else self.where
        raise ConfigError(f"{self.src}: {name} = {show(value)} {problem}")

    def take(self, k: str, default: Any = None) -> Any:
        self.seen.add(k)
        return self.data.get(k, default)

    def number(
        self,
        k: str,
        default: Any,
        *,
        positive: bool = False,
        minimum: float | None = None,
        integer: bool = False,
    ) -> Any:
        v = self.take(k, default)
        if v is None:
            return None
        kind = "an integer" if integer else "a number"
        if not is_number(v) or (integer and not isinstance(v, int)) or not math.isfinite(v):
            self.fail(k, v, f"is not {kind}; use {kind}{' > 0' if positive else ''}")
        if positive and not v > 0:
            self.fail(k, v, f"must be > 0; use {kind} > 0")
        if minimum is not None and v < minimum:
            self.fail(k, v, f"must be ≥ {minimum:g}")
        return v

    def string(self, k: str, default: str | None, choices: Iterable[str] | None = None) -> Any:
        v = self.take(k, default)
        if v is None:
            return None
        if not isinstance(v, str):
            self.fail(k, v, "is not a string")
        if choices is not None and v not in choices:
            self.fail(k, v, f"is not valid; use one of: {', '.join(choices)}")
        return v

    def boolean(self, k: str, default: bool) -> bool:
        v = self.take(k, default)
        if not isinstance(v, bool):
            self.fail(k, v, "is not a boolean; use true or false")
        return v

    def done(self) -> None:
        for k in self.data:
            if k not in self.seen:
                hint = difflib.get_close_matches(k, sorted(self.seen), n=1)
                maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise ConfigError(
                    f"{self.src}: {self.key(k)} is not a known key{maybe}; valid keys here: "
                    f"{', '.join(sorted(self.seen))}"
                )


def missing(t: Table, k: str, what: str) -> Any:
    raise ConfigError(f"{t.src}: {t.key(k)} is missing; set it to {what}")


def parse_rate(value: Any, where: str, src: str) -> Rate:
    """``200`` (req/s) or ``"0.6x"`` (multiple of calibrated capacity)."""
    bad = (
        f"{src}: {where} = {show(value)} is not a rate; use a number of req/s (e.g. 200) "
        f'or a multiple of capacity (e.g. "0.6x")'
    )
    if is_number(value):
        rate = Rate(float(value))
    elif isinstance(value, str) and value.strip().lower().endswith("x"):
        try:
            rate = Rate(float(value.strip()[:-1]), relative=True)
        except ValueError:
            raise ConfigError(bad) from None
    else:
        raise ConfigError(bad)
    if not math.isfinite(rate.value) or rate.value < 0:
        raise ConfigError(f"{bad}; it must be ≥ 0")
    return rate
