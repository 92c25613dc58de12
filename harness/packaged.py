"""Where the packaged scenarios and locustfiles are.

Installed, they are package data of harness (``harness.scenarios``,
``harness.locustfiles``: pyproject.toml maps the repository's top-level ``scenarios/`` and
``locustfiles/`` there). Run from a source checkout that was not installed, they are
those top-level folders. Either way the answer is a real directory on disk (Locust loads
a locustfile by its path).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

__all__ = ["locustfile", "packaged_dir"]

Packaged = Literal["scenarios", "locustfiles"]


def packaged_dir(name: Packaged) -> Path:
    """The directory of the packaged ``scenarios`` or ``locustfiles``."""
    try:
        return Path(str(resources.files(f"harness.{name}")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / name


def locustfile(kind: Literal["inference", "llm"] = "inference") -> Path:
    """The shipped locustfile: ``inference`` (every protocol's users, the harness's
    options) or ``llm`` (the streaming LLM user alone)."""
    return packaged_dir("locustfiles") / f"{kind}.py"
