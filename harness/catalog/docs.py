"""The docs the check catalog generates, and whether they are current.

README.md's check table and the index at the top of docs/checks.md's "The checks" are
generated from the declarations, between ``<!-- checks:begin -->`` and
``<!-- checks:end -->``; ``python -m harness.catalog --write`` rewrites them. Each
check's own section of docs/checks.md (the reasoning behind its defaults) is written by
hand; ``problems`` names a check without one, or a default its parameter table omits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from harness.catalog import CATALOG, Catalog, CheckDecl

COMMAND = "python -m harness.catalog --write"
BEGIN, END = "<!-- checks:begin -->", "<!-- checks:end -->"
_NOTE = f"<!-- generated from harness/catalog by `{COMMAND}`: edit the declarations -->"


def _scenarios(c: CheckDecl) -> str:
    return "every run" if c.always else ", ".join(c.scenarios)


def readme_table(catalog: Catalog) -> str:
    rows = ["| check | passes when (default) | scenario |", "|---|---|---|"]
    rows += [f"| `{c.id}` | {c.readme_cell()} | {_scenarios(c)} |" for c in catalog]
    return "\n".join(rows)


def anchor(check_id: str) -> str:
    """The GitHub anchor of docs/checks.md's ``### `id``` heading."""
    return "#" + re.sub(r"[^\w\- ]", "", check_id.lower()).replace(" ", "-")


def checks_index(catalog: Catalog) -> str:
    """id (linked to its section), unit, comparison, summary, scenario; the defaults are in
    each section's parameter table, the limits in prose in README's table."""
    rows = ["| check | unit | op | what it measures | scenario |", "|---|---|---|---|---|"]
    rows += [
        f"| [`{c.id}`]({anchor(c.id)}) | {c.unit} | `{c.op}` | {c.summary} | {_scenarios(c)} |"
        for c in catalog
    ]
    return "\n".join(rows)


# file (relative to the repository) → its generated block
GENERATED: dict[str, Callable[[Catalog], str]] = {
    "README.md": readme_table,
    "docs/checks.md": checks_index,
}


def _spliced(text: str, block: str, path: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {BEGIN} … {END} block for the generated check table")
    return f"{text[: start + len(BEGIN)]}\n{_NOTE}\n{block}\n{text[end:]}"


def regenerate(root: Path, catalog: Catalog = CATALOG, *, write: bool = False) -> list[str]:
    """The files (relative paths) whose generated block differs from ``catalog``;
    with ``write``, rewritten."""
    stale = []
    for rel, render in GENERATED.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        new = _spliced(text, render(catalog), rel)
        if new != text:
            stale.append(rel)
            if write:
                path.write_text(new, encoding="utf-8")
    return stale


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value!r}".strip("'")


def undocumented(root: Path, catalog: Catalog = CATALOG) -> list[str]:
    """What docs/checks.md's hand-written sections lack: a ``### `id``` section per check,
    and in it a parameter-table row ``| `key` | `default` |`` per default."""
    doc = (root / "docs" / "checks.md").read_text(encoding="utf-8")
    out = []
    for c in catalog:
        head = f"### `{c.id}`"
        if head not in doc:
            out.append(
                f"docs/checks.md has no section '{head}': write what {c.id} judges and a "
                "parameter table (| parameter | default | why |) with every default"
            )
            continue
        section = doc.split(head, 1)[1].split("\n### ", 1)[0]
        for key, value in c.defaults.items():
            shown = _shown(value)
            want = re.escape(shown) if shown else '""'
            if not re.search(rf"`{re.escape(key)}`\s*\|\s*`{want}`\s*\|", section):
                out.append(
                    f"docs/checks.md, {c.id}: default {key} = {shown or '(empty)'} is not "
                    "in its parameter table"
                )
    return out


def problems(root: Path, catalog: Catalog = CATALOG) -> list[str]:
    """Everything the docs lack for ``catalog``, each naming what to do about it."""
    out = [
        f"{rel}: the generated check table is stale — run `{COMMAND}`"
        for rel in regenerate(root, catalog)
    ]
    return out + undocumented(root, catalog)
