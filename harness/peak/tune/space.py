"""The configurations a tune searches: a ``--space`` of dimensions, each configuration
the ``--sut-cmd`` template filled with one value per dimension, and what the tune was
asked (``TuneConfig``)."""

from __future__ import annotations

import itertools
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.peak.config import PeakConfig
from harness.sut.command import FILLED, check_command, placeholders

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Config = tuple[tuple[str, str], ...]  # ((dimension, value), ...) in --space order


@dataclass(frozen=True)
class Space:
    dims: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def parse(cls, specs: Sequence[str], template: str) -> Space:
        """``name=v1,v2,...`` each; every name must be a placeholder of the template and
        every placeholder but {port}/{threads} a dimension (ConfigError naming the fix)."""
        if not specs:
            raise ConfigError("--space is required, e.g. --space max_batch=1,8,32")
        dims: list[tuple[str, tuple[str, ...]]] = []
        for spec in specs:
            name, sep, values = spec.partition("=")
            name = name.strip()
            vals = tuple(v.strip() for v in values.split(","))
            if not sep or not _NAME.match(name) or not values.strip():
                raise ConfigError(
                    f"--space has value {spec!r}; expected NAME=V1,V2,... such as max_batch=1,8,32"
                )
            if len(set(vals)) != len(vals):
                raise ConfigError(f"--space {name} lists a value twice: {values!r}")
            if any(n == name for n, _ in dims):
                raise ConfigError(f"--space {name} is given twice; give each dimension once")
            dims.append((name, vals))
        fields = placeholders(template)
        names = {n for n, _ in dims}
        missing = sorted(names - fields)
        if missing:
            raise ConfigError(
                f"--space {', '.join(missing)} is not a placeholder of --sut-cmd; write "
                + " ".join(f"{{{m}}}" for m in missing)
                + " where its value goes"
            )
        unknown = sorted(fields - names - set(FILLED))
        if unknown:
            raise ConfigError(
                f"--sut-cmd has placeholder(s) {', '.join('{' + u + '}' for u in unknown)} "
                "with no --space; add --space NAME=V1,V2 for each"
            )
        check_command(template, extra=names)
        return cls(tuple(dims))

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.dims)

    def all(self) -> list[Config]:
        names = [n for n, _ in self.dims]
        return [
            tuple(zip(names, combo, strict=True))
            for combo in itertools.product(*(v for _, v in self.dims))
        ]

    def parse_config(self, text: str, flag: str) -> Config:
        """``name=value,name=value`` (every dimension) → a Config of this space."""
        got: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, sep, val = part.partition("=")
            if not sep:
                raise ConfigError(f"{flag} has value {text!r}; expected NAME=VALUE,NAME=VALUE")
            got[k.strip()] = val.strip()
        out = []
        for name, values in self.dims:
            if name not in got:
                raise ConfigError(f"{flag} has no value for {name}; give every dimension")
            if got[name] not in values:
                raise ConfigError(
                    f"{flag} {name}={got[name]} is not in --space {name}={','.join(values)}"
                )
            out.append((name, got.pop(name)))
        if got:
            raise ConfigError(f"{flag} names {', '.join(got)}, not a --space dimension")
        return tuple(out)

    def partial(self, text: str, flag: str) -> dict[str, str]:
        """``name=value,...`` naming some dimensions (a selector)."""
        got: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, sep, val = part.partition("=")
            names = dict(self.dims)
            if not sep or k.strip() not in names or val.strip() not in names[k.strip()]:
                raise ConfigError(
                    f"{flag} has selector {text!r}; expected NAME=VALUE pairs of the --space "
                    "dimensions, e.g. max_batch=8,workers=1"
                )
            got[k.strip()] = val.strip()
        return got

    def neighbours(self, cfg: Config) -> list[tuple[Config, str, int]]:
        """Configs one step away in one dimension: (config, dimension, direction)."""
        out = []
        for i, (name, values) in enumerate(self.dims):
            j = values.index(cfg[i][1])
            for d in (-1, 1):
                if 0 <= j + d < len(values):
                    nxt = list(cfg)
                    nxt[i] = (name, values[j + d])
                    out.append((tuple(nxt), name, d))
        return out


def key(cfg: Config) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg)


def command(template: str, cfg: Config, append: Sequence[tuple[Mapping[str, str], str]]) -> str:
    """The template with the configuration's values ({port} and {threads} left for the
    harness), plus the arguments ``--append-for`` gives configurations it selects."""
    values = {k: shlex.quote(v) for k, v in cfg}
    cmd = template.format(**values, port="{port}", threads="{threads}")
    d = dict(cfg)
    for selector, extra in append:
        if all(d.get(k) == v for k, v in selector.items()):
            cmd += " " + extra
    return cmd


@dataclass(frozen=True)
class TuneConfig:
    template: str
    space: Space
    default: Config
    peak: PeakConfig
    mode: str = "quick"  # or "brute"
    prune_margin: float = 0.2
    append: tuple[tuple[tuple[tuple[str, str], ...], str], ...] = ()
    sut_cores: str | None = None
    model: str | None = None
    protocol: str | None = None
    extra_args: tuple[str, ...] = ()

    def identity(self) -> dict[str, Any]:
        """What a state file must match to be resumed."""
        return {
            "template": self.template,
            "space": [[n, list(v)] for n, v in self.space.dims],
            "default": key(self.default),
            "slo_p99_ms": self.peak.slo_p99_ms,
            "max_error_rate": self.peak.max_error_rate,
            "confidence": self.peak.confidence,
            "tolerance": self.peak.tolerance,
            "repeats": self.peak.repeats,
            "append": [[dict(s), a] for s, a in self.append],
        }


def dirname(cfg: Config) -> str:
    """A configuration as a directory name (configs/<this>/)."""
    return "_".join(f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '', v) or 'none'}" for k, v in cfg)
