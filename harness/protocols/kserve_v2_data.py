"""``--input-data FILE``: the user's own request data, in perf_analyzer's format.

- JSON: ``{"data": [ENTRY, ...]}``; JSONL (``.jsonl`` / ``.ndjson``): one ENTRY per line.
- ENTRY: ``{"INPUT0": [values...], "INPUT1": {"content": [values...], "shape": [dims]}}``,
  one key per model input, values in row-major order (flat, or nested and flattened).
- As in perf_analyzer, an entry is **one batch element**: for an input whose declared
  shape leads with -1 (the batch dimension), its ``shape`` leaves that dimension out, and
  a request of ``--batch-size N`` stacks N consecutive entries (cycled); entries stacked
  together must agree on their shapes. At batch size 1 an entry may instead give the
  whole shape, batch dimension included. An input without ``shape`` has the declared one
  with its variable dimensions 1.
- Every entry is checked against the model's inputs (names, element counts against the
  shape, values against the datatype) before any load starts: a ConfigError names the
  file, the entry and what is wrong. Base64 data (``b64``) is refused, as are
  perf_analyzer's sequence streams (``"data"`` as a list of lists); a ``validation_data``
  section is not read (the harness fetches its own golden outputs).
- The pool of requests is one per entry, in the file's order: request ``k`` starts at
  entry ``k``; the load cycles through them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.protocols.kserve_v2_inputs import InputSpec, int_bounds, sent_shape

JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class Tensor:
    """One input of one entry: its ``shape`` and flat ``data``; ``whole``: the shape
    includes the batch dimension (sent as is) rather than being one batch element's."""

    shape: tuple[int, ...]
    data: list[Any]
    whole: bool = False


Entry = dict[str, Tensor]


def flatten(data: Any) -> list[Any]:
    """Row-major flat list of a V2 ``data`` field, flat or nested."""
    if not isinstance(data, list):
        return [data]
    if not data or not isinstance(data[0], list):
        return data
    out: list[Any] = []
    stack = [data]
    # iterative depth-first walk keeps row-major order without recursion limits
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        else:
            out.append(node)
    return out


def _bad_value(spec: InputSpec, v: Any) -> str | None:
    """Why ``v`` is not a value of ``spec.datatype`` (None: it is)."""
    dt = spec.datatype
    if dt == "BOOL":
        return None if isinstance(v, bool) else "expected true/false"
    if dt == "BYTES":
        return None if isinstance(v, str) else "expected a string"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return "expected a number"
    bounds = int_bounds(dt)
    if bounds is not None:
        if not isinstance(v, int):
            return "expected an integer"
        if not bounds[0] <= v < bounds[1]:
            return f"outside {dt}'s range [{bounds[0]}, {bounds[1]})"
        return None
    return None if math.isfinite(v) else "not a finite number"


def _tensor(spec: InputSpec, raw: Any, batch_size: int, where: str) -> Tensor:
    where = f"{where}: input {spec.name!r}"
    declared = spec.declared or spec.shape
    item = declared[1:] if spec.batched else declared
    whole = False
    if isinstance(raw, dict):
        if "b64" in raw or isinstance(raw.get("content"), dict):
            raise ConfigError(
                f"{where} is base64 (b64); --input-data takes values as JSON lists: "
                f'write {{"content": [v, ...], "shape": [...]}} or a flat list'
            )
        if "content" not in raw:
            raise ConfigError(f'{where} is an object without "content"; expected a list')
        data = flatten(raw["content"])
        shape_raw = raw.get("shape")
        if shape_raw is None:
            shape = sent_shape(item)
        else:
            if not isinstance(shape_raw, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape_raw
            ):
                raise ConfigError(f"{where}: shape {shape_raw!r} is not a list of positive ints")
            shape = tuple(shape_raw)
            whole = spec.batched and len(shape) == len(declared)
            if whole and batch_size != 1:
                raise ConfigError(
                    f"{where}: shape {list(shape)} includes the batch dimension; with "
                    f"--batch-size {batch_size} an entry is one batch element: give its "
                    f"shape without the batch dimension, e.g. {list(sent_shape(item))}"
                )
            against = declared if whole else item
            fits = len(shape) == len(against) and all(
                d == -1 or d == s for d, s in zip(against, shape, strict=True)
            )
            if not fits:
                what = "the declared" if whole else "one batch element of the declared"
                raise ConfigError(
                    f"{where}: shape {list(shape)} does not fit {what} shape "
                    f"{list(declared)} (-1: any size)"
                )
    elif isinstance(raw, list):
        data = flatten(raw)
        shape = sent_shape(item)
    else:
        raise ConfigError(f'{where} is {raw!r}; expected a list or {{"content", "shape"}}')
    n = math.prod(shape)
    if len(data) != n:
        hint = (
            '; for a variable dimension give {"content": [...], "shape": [...]}'
            if -1 in item
            else ""
        )
        raise ConfigError(
            f"{where} has {len(data)} values; shape {list(shape)} takes {n}"
            f"{' (one batch element)' if spec.batched and not whole else ''}{hint}"
        )
    for i, v in enumerate(data):
        why = _bad_value(spec, v)
        if why is not None:
            raise ConfigError(f"{where}: value [{i}] = {v!r} is not {spec.datatype}: {why}")
    return Tensor(shape, data, whole)


def _raw_entries(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, entry object) for each entry of the file, in order."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--input-data has value {str(path)!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--input-data {str(path)!r} cannot be read: {exc}") from None
    if path.suffix.lower() in JSONL_SUFFIXES:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{n}", json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{n}: not a JSON object: {exc}") from None
        return
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"--input-data {str(path)!r} is not JSON ({exc}); expected "
            f'{{"data": [{{"INPUT": [...]}}, ...]}}, or name a one-entry-per-line file .jsonl'
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise ConfigError(
            f'--input-data {str(path)!r} has no "data" list; expected '
            f'{{"data": [{{"INPUT": [...]}}, ...]}} (perf_analyzer\'s format)'
        )
    for i, entry in enumerate(doc["data"]):
        yield f"{path}: data[{i}]", entry


def load_input_data(
    path: str | Path, specs: Sequence[InputSpec], batch_size: int = 1
) -> list[Entry]:
    """Every entry of the file, checked against ``specs`` (ConfigError: file, entry, why)."""
    p = Path(path)
    by_name = {s.name: s for s in specs}
    entries: list[Entry] = []
    for where, raw in _raw_entries(p):
        if isinstance(raw, list):
            raise ConfigError(
                f"{where} is a list: perf_analyzer's sequence streams are not supported; "
                f"give one object per request"
            )
        if not isinstance(raw, dict):
            raise ConfigError(f'{where} is {raw!r}; expected an object {{"INPUT": [...]}}')
        unknown = sorted(set(raw) - set(by_name))
        if unknown:
            raise ConfigError(
                f"{where} names {unknown}, which the model does not take; its inputs: "
                f"{sorted(by_name)}"
            )
        missing = [n for n in by_name if n not in raw]
        if missing:
            raise ConfigError(f"{where} lacks input(s) {missing}; every entry gives every input")
        entries.append({n: _tensor(s, raw[n], batch_size, where) for n, s in by_name.items()})
    if not entries:
        raise ConfigError(f"--input-data {str(p)!r} has no entries")
    return entries


def requests_from(
    entries: Sequence[Entry], specs: Sequence[InputSpec], batch_size: int = 1
) -> list[list[dict[str, Any]]]:
    """One V2 ``inputs`` list per entry: request ``k`` stacks entries ``k`` … ``k+N-1``
    (cycled) along the batch dimension of each batched input; an input without one takes
    entry ``k``'s data. Stacked entries must agree on shapes (ConfigError naming them)."""
    out = []
    n_entries = len(entries)
    for k in range(n_entries):
        inputs = []
        for s in specs:
            first = entries[k][s.name]
            if first.whole or not s.batched:
                shape, data = list(first.shape), list(first.data)
            else:
                data = []
                for j in range(batch_size):
                    t = entries[(k + j) % n_entries][s.name]
                    if t.shape != first.shape:
                        raise ConfigError(
                            f"--input-data entries {k} and {(k + j) % n_entries} (0-based) "
                            f"give input {s.name!r} shapes {list(first.shape)} and "
                            f"{list(t.shape)}; --batch-size {batch_size} stacks consecutive "
                            f"entries, which must agree"
                        )
                    data.extend(t.data)
                shape = [batch_size, *first.shape]
            inputs.append({"name": s.name, "shape": shape, "datatype": s.datatype, "data": data})
        out.append(inputs)
    return out
