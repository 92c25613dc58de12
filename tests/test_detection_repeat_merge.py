"""``bench/detection_repeat.py --merge``: rows measured again replace a case's current row
(where it first appears) and leave the dated record of earlier measurements as written."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAD = "| case | intended checks | caught | defect values | control clean | control values | other failures |"
RULE = "|---|---|---|---|---|---|---|"


def _bench():
    spec = importlib.util.spec_from_file_location(
        "detection_repeat", ROOT / "bench" / "detection_repeat.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _row(case: str, caught: str, value: str, clean: str) -> str:
    return f"| {case} | `c.x` | {caught} | c.x: {value} | {clean} | c.x: 0 | — |"


EXISTING = "\n".join(
    [
        "# Detection and false-positive rates (repeated)",
        "",
        "2026-12-01 · commit `aaaaaaa` · vm · 2 CPUs · Python 3.11.7 · K=3",
        "",
        HEAD,
        RULE,
        _row("leak-fds", "3/3", "10", "3/3"),
        _row("stall", "3/3", "never", "3/3"),
        "",
        "**Totals:** caught 6/6 defect runs; controls clean 6/6.",
        "",
        "## CI time: shorter soaks (2026-12-02)",
        "",
        HEAD,
        RULE,
        _row("leak-fds", "1/1", "9.5", "1/1"),
        _row("leak-memory (40 s, not adopted)", "3/3", "6.0", "2/3"),
        "",
        "**Totals:** caught 4/4 defect runs; controls clean 3/4. Words kept.",
        "",
    ]
)
FRESH = "\n".join(
    [
        "# Detection and false-positive rates (repeated)",
        "",
        "2026-12-06 · commit `bbbbbbb` · vm · 2 CPUs · Python 3.11.7",
        "",
        HEAD,
        RULE,
        _row("leak-fds", "2/3", "7.5", "3/3"),
        _row("new-case", "3/3", "5", "3/3"),
        "",
        "**Totals:** caught 5/6 defect runs; controls clean 6/6.",
    ]
)


def test_merge_replaces_the_current_row_and_keeps_the_dated_record() -> None:
    merged = _bench().merge(EXISTING, FRESH).splitlines()
    main = merged[: merged.index("## CI time: shorter soaks (2026-12-02)")]
    record = merged[merged.index("## CI time: shorter soaks (2026-12-02)") :]
    # the main table: the fresh row, its totals counted again
    assert _row("leak-fds", "2/3", "7.5", "3/3") in main
    assert _row("leak-fds", "3/3", "10", "3/3") not in merged
    assert "**Totals:** caught 5/6 defect runs; controls clean 6/6." in main
    assert any(ln.startswith("Rows leak-fds, new-case measured again: 2026-12-06") for ln in main)
    # the dated section: its rows and totals as they were written
    assert _row("leak-fds", "1/1", "9.5", "1/1") in record
    assert "**Totals:** caught 4/4 defect runs; controls clean 3/4. Words kept." in record
    # a case in no table yet: a section of its own at the end
    assert merged[-4:-2] == [RULE, _row("new-case", "3/3", "5", "3/3")]


def test_merging_the_same_rows_again_replaces_the_note_not_adds_one() -> None:
    merge = _bench().merge
    once = merge(EXISTING, FRESH)
    assert merge(once, FRESH).count("Rows leak-fds, new-case measured again") == 1
