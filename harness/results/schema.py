"""``schemas/results.v<N>.json``: the JSON Schema of a results document, derived from the
record types in ``harness.results.records`` (so the two cannot drift apart).

Every key of a record is a property; keys not marked ``NotRequired`` are required. Records
accept extra keys (an additive field does not need a new version), and a ``dict[str, Any]``
is an open object. Regenerate after changing a record:
``python -m harness.results.schema`` (a test fails while the file is stale).
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, Union, get_args, get_origin, get_type_hints

from harness.results import records
from harness.results.document import SCHEMA, SCHEMA_NAME, SCHEMA_VERSION

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
SCHEMA_FILE = SCHEMA_DIR / f"results.v{SCHEMA_VERSION}.json"


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


def _schema_of(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema_of(a, defs) for a in get_args(tp)]}
    if origin is list:
        (item,) = get_args(tp)
        return {"type": "array", "items": _schema_of(item, defs)}
    if origin is dict:
        key, value = get_args(tp)
        if key is not str:
            raise TypeError(f"record dict keys must be str, not {key!r}")
        return {"type": "object", "additionalProperties": _schema_of(value, defs)}
    if _is_typeddict(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # placeholder: a record may (indirectly) refer to itself
            hints = get_type_hints(tp, include_extras=True)
            props, required = {}, []
            for key, hint in hints.items():
                if get_origin(hint) is NotRequired:
                    (hint,) = get_args(hint)
                else:
                    required.append(key)
                props[key] = _schema_of(hint, defs)
            body: dict[str, Any] = {"type": "object", "properties": props, "required": required}
            doc = (tp.__doc__ or "").strip().split("\n\n")[0]
            if doc and not doc.startswith(f"{name}("):
                body = {"description": " ".join(doc.split()), **body}
            defs[name] = body
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for record type {tp!r}")


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a ``harness.results/<SCHEMA_VERSION>`` document."""
    defs: dict[str, Any] = {}
    root = _schema_of(records.Document, defs)
    document = dict(defs.pop("Document"))
    document["properties"] = {
        **document["properties"],
        "schema": {"const": SCHEMA},
    }
    if root != {"$ref": "#/$defs/Document"}:
        raise TypeError(f"records.Document did not become a record: {root!r}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{SCHEMA_NAME}/{SCHEMA_VERSION} results document",
        "description": (
            "results.json of the inference harness; generated from harness/results/records.py "
            "by `python -m harness.results.schema` — the meaning of each field is in "
            "docs/outputs.md"
        ),
        **{k: v for k, v in document.items() if k != "description"},
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    """The schema file's text (stable: sorted definitions, two-space indent)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else SCHEMA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
