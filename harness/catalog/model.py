"""What a check declaration is: ``CheckDecl`` (one check as the user sees it) and
``Catalog`` (the ordered, validated set of them). The declarations themselves are in
``harness/catalog/__init__.py``. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

Op = Literal["<=", ">=", "==", "<", ">"]
OPS: tuple[str, ...] = ("<=", ">=", "==", "<", ">")


@dataclass(frozen=True)
class CheckDecl:
    """One check, as the user sees it. ``passes_when`` is the README cell: a
    ``str.format`` template over the defaults (``{threshold}`` prints 30.0 as ``30``,
    ``{threshold:%}`` prints 0.01 as ``1 %``), so a changed default changes the README."""

    id: str
    unit: str
    op: Op
    defaults: Mapping[str, Any]
    summary: str  # one line: what is measured (docs/checks.md's index)
    passes_when: str  # README: what passes, with the default limit
    scenarios: tuple[str, ...] = ()  # the packaged scenarios that evaluate it
    always: bool = False  # evaluated in every scenario, listed or not
    # judged from the server process's samples (a pid on this host, or --agent): a
    # scenario defined by it cannot be judged where nothing samples the server
    reads_server_samples: bool = False

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    def readme_cell(self) -> str:
        return self.passes_when.format(**{k: Shown(v) for k, v in self.defaults.items()})


class Shown:
    """A default as prose shows it: ``g`` format by default, ``%`` as ``1 %``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        if spec == "%":
            return f"{self.value * 100:g} %"
        if isinstance(self.value, (int, float)) and not isinstance(self.value, bool):
            return format(self.value, spec or "g")
        return format(self.value, spec)


class Catalog:
    """Declarations in checklist order (reports list checks in it): by group, in
    ``groups`` order, then as declared."""

    def __init__(self, groups: Iterable[str], checks: Iterable[CheckDecl]) -> None:
        self.groups: tuple[str, ...] = tuple(groups)
        self._by_id: dict[str, CheckDecl] = {}
        last = 0
        for c in checks:
            where = f"check {c.id!r} (harness/catalog/__init__.py)"
            if c.id in self._by_id:
                raise ValueError(f"{where} is declared twice")
            if c.group not in self.groups:
                raise ValueError(f"{where}: group {c.group!r} is not one of {self.groups}")
            if self.groups.index(c.group) < last:
                raise ValueError(f"{where} is declared after a later group; keep groups together")
            if c.op not in OPS or "threshold" not in c.defaults or not (c.unit and c.summary):
                raise ValueError(f"{where} needs an op in {OPS}, a unit, a summary and a threshold")
            if c.always == bool(c.scenarios):
                raise ValueError(f"{where}: name its scenarios, or mark it always = True")
            try:
                c.readme_cell()  # a placeholder naming no default fails here, not in the docs
            except (KeyError, ValueError) as e:
                raise ValueError(f"{where}: passes_when names no default: {e}") from None
            last = self.groups.index(c.group)
            self._by_id[c.id] = c

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._by_id)

    @property
    def always(self) -> tuple[str, ...]:
        return tuple(c.id for c in self if c.always)

    @property
    def server_sampled(self) -> frozenset[str]:
        """The checks judged from the server process's samples."""
        return frozenset(c.id for c in self if c.reads_server_samples)

    def __getitem__(self, check_id: str) -> CheckDecl:
        return self._by_id[check_id]

    def __contains__(self, check_id: object) -> bool:
        return check_id in self._by_id

    def __iter__(self) -> Iterator[CheckDecl]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def with_check(self, decl: CheckDecl) -> Catalog:
        """A new catalog with ``decl`` added at the end of its group (a new group last)."""
        groups = self.groups if decl.group in self.groups else (*self.groups, decl.group)
        rank = {g: i for i, g in enumerate(groups)}
        return Catalog(groups, sorted([*self, decl], key=lambda c: rank[c.group]))


def _defaults(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(kw)
