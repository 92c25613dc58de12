"""Which cores the server under test and the load generator get."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import ConfigError


def available_cores() -> tuple[int, ...]:
    """Cores this process may run on (its affinity), not ``os.cpu_count()``."""
    return tuple(sorted(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class CoreSplit:
    """Which cores the SUT and the load generator get. ``shared`` when they overlap."""

    sut: tuple[int, ...]
    loadgen: tuple[int, ...]

    @property
    def shared(self) -> bool:
        return bool(set(self.sut) & set(self.loadgen))

    def as_dict(self) -> dict:
        return {"sut": list(self.sut), "loadgen": list(self.loadgen), "shared": self.shared}


def choose_cores(available: Sequence[int] | None = None, sut_count: int | None = None) -> CoreSplit:
    """Give the SUT the highest-numbered ``sut_count`` cores and the load generator the rest.

    Default ``sut_count`` is half the cores rounded up (2 cores: SUT on 1, load on 0). With a
    single core, or ``sut_count`` equal to every core, both share all of them.
    """
    cores = tuple(sorted(available if available is not None else available_cores()))
    if not cores:
        raise ConfigError("cores: no CPU cores available to split; valid: at least one core")
    n = len(cores)
    if sut_count is None:
        sut_count = (n + 1) // 2 if n > 1 else 1
    if not 1 <= sut_count <= n:
        raise ConfigError(f"sut_cores has value {sut_count}. Valid: 1..{n} (cores {list(cores)})")
    if sut_count == n:
        return CoreSplit(sut=cores, loadgen=cores)
    return CoreSplit(sut=cores[n - sut_count :], loadgen=cores[: n - sut_count])


def split_cores(given: str | None, available: Sequence[int] | None = None) -> CoreSplit:
    """The server's and the load generator's cores for ``--sut-cores`` as given (the
    generator gets the rest of ``available``), or the default split (``choose_cores``)
    when None. A server given every available core shares them (``shared``)."""
    cores = tuple(sorted(available if available is not None else available_cores()))
    if not given:
        return choose_cores(cores)
    sut_cores = parse_cores(given)
    rest = tuple(c for c in cores if c not in sut_cores)
    return CoreSplit(sut=sut_cores, loadgen=rest or cores)


def attached_split(sut_pid: int, available: Sequence[int] | None = None) -> CoreSplit | None:
    """A running server's cores on this host (its affinity) and the generator's: the
    ``available`` cores its affinity leaves free, or every available core when it leaves
    none (``shared``). None when its affinity cannot be read (no such process here)."""
    try:
        server = tuple(sorted(os.sched_getaffinity(sut_pid)))
    except OSError:
        return None
    cores = tuple(sorted(available if available is not None else available_cores()))
    rest = tuple(c for c in cores if c not in server)
    return CoreSplit(sut=server, loadgen=rest or cores)


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` → ``(0, 2, 3)`` (taskset -c syntax)."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.update(range(int(lo), int(hi) + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise ConfigError(f"cores has value {text!r}. Valid: a list like '1' or '0,2-3'") from None
    if not out:
        raise ConfigError(f"cores has value {text!r}. Valid: a list like '1' or '0,2-3'")
    return tuple(sorted(out))
