"""``python -m harness.catalog [--write]``: are README.md's check table and
docs/checks.md's index current? ``--write`` regenerates them from the declarations.
Exit 1 while something is stale or undocumented (named, one line each)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.catalog.docs import COMMAND, problems, regenerate

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.catalog", description=__doc__)
    ap.add_argument("--write", action="store_true", help="regenerate the check tables")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    if args.write:
        for rel in regenerate(args.root, write=True):
            print(f"wrote {rel}")
    left = problems(args.root)
    for line in left:
        print(line, file=sys.stderr)
    if not left and not args.write:
        print(f"the check tables are current (regenerate with `{COMMAND}`)")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
