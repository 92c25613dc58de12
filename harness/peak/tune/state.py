"""``DIR/tune_state.json``: a tune's identity and every configuration's points, rewritten
after every point so that the same command resumes a killed tune."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.peak.outcomes import Point
from harness.primitives import atomic_write

STATE = "tune_state.json"
H2H_OPEN = "head_to_head_open"  # the rounds under way, in the state file


class State:
    """``DIR/tune_state.json``: the tune's identity and every configuration's points."""

    def __init__(self, path: Path, identity: Mapping[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"identity": dict(identity), "configs": {}, "order": []}
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                raise ConfigError(
                    f"{path} is not a tune state file (bad JSON); remove it or use another --out"
                ) from None
            if old.get("identity") != self.data["identity"]:
                raise ConfigError(
                    f"{path} holds a different tune (other --sut-cmd/--space/--default/SLO); "
                    "use another --out, or --fresh to start this one over"
                )
            self.data = old
        self.resumed = bool(self.data["configs"])

    def points(self, k: str) -> list[Point]:
        entry = self.data["configs"].get(k) or {}
        return [Point.from_dict(p) for p in entry.get("points") or []]

    def done(self, k: str) -> dict[str, Any] | None:
        entry = self.data["configs"].get(k) or {}
        return entry.get("result") if entry.get("done") else None

    def add_point(self, k: str, p: Point) -> None:
        entry = self.data["configs"].setdefault(k, {"points": [], "done": False})
        entry["points"].append(p.as_dict())
        if k not in self.data["order"]:
            self.data["order"].append(k)
        self.save()

    def finish(self, k: str, result: Mapping[str, Any]) -> None:
        entry = self.data["configs"].setdefault(k, {"points": [], "done": False})
        entry["done"] = True
        entry["result"] = dict(result)
        if k not in self.data["order"]:
            self.data["order"].append(k)
        self.save()

    def note(self, **kw: Any) -> None:
        self.data.update(kw)
        self.save()

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.data, indent=1, default=str))
