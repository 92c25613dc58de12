"""The repository is lint-clean and formatted: ``ruff check`` and ``ruff format --check``
over the whole tree, with the settings of pyproject.toml (ruff is a test extra)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]' brings it")
    return [found]


@pytest.mark.parametrize(
    "args", [("check",), ("format", "--check")], ids=["ruff check", "ruff format --check"]
)
def test_the_tree_is_clean(args: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [*_ruff(), *args, str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"ruff {' '.join(args)} found problems (ruff check --fix / ruff format fixes most):\n"
        + (proc.stdout + proc.stderr)[-6000:]
    )
