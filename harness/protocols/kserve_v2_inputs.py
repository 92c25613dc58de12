"""KServe V2 request inputs: what they look like (the model's metadata, ``--input``, a
``--sample-request``), the batch size, the value ranges, and the generated pool.

- A shape's **leading** ``-1`` is the batch dimension: it becomes ``--batch-size`` (1 by
  default); any other ``-1`` (a variable dimension) becomes 1.
- Generated integers are drawn from ``[0, 100)`` (ids, class indices: non-negative),
  floats from ``[-1, 1)``, unless ``--input NAME:DTYPE:SHAPE:LOW..HIGH`` declares the
  input's half-open range.
- ``--input-data FILE`` (``harness.protocols.kserve_v2_data``) replaces the generated
  values by the user's own.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)
# the default range of generated values, half-open
DEFAULT_INT_RANGE = (0, 100)
DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
FLOAT_MAX = {"FP16": 65504.0, "BF16": 3.38e38, "FP32": 3.4e38, "FP64": 1.79e308}


def int_bounds(datatype: str) -> tuple[int, int] | None:
    """The half-open range an integer datatype holds (None: not an integer type)."""
    if datatype.startswith("UINT"):
        return 0, 2 ** int(datatype[4:])
    if datatype.startswith("INT"):
        bits = int(datatype[3:])
        return -(2 ** (bits - 1)), 2 ** (bits - 1)
    return None


@dataclass(frozen=True)
class InputSpec:
    """One model input as it is sent: ``shape`` with the batch size and variable
    dimensions filled in; ``low``/``high`` its declared value range (None: the default)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    low: float | None = None
    high: float | None = None
    # the shape as declared (-1 kept): a leading -1 is the batch dimension
    declared: tuple[int, ...] = field(default=(), compare=False)

    @property
    def batched(self) -> bool:
        return bool(self.declared) and self.declared[0] == -1


# -- shapes, datatypes, ranges --------------------------------------------------------------


def _dims(raw: Sequence[Any], where: str) -> tuple[int, ...]:
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or d == 0 or d < -1:
            raise ConfigError(
                f"{where}: shape {list(raw)} has dimension {d!r}; expected positive integers "
                f"or -1 (variable)"
            )
    return tuple(raw)


def sent_shape(declared: Sequence[int], batch_size: int = 1) -> tuple[int, ...]:
    """The shape sent for a declared one: leading -1 → ``batch_size``, other -1 → 1."""
    return tuple((batch_size if i == 0 else 1) if d == -1 else d for i, d in enumerate(declared))


def _shape(raw: Sequence[Any], where: str) -> tuple[int, ...]:
    """The shape sent at batch size 1 (validated)."""
    return sent_shape(_dims(raw, where))


def _datatype(value: Any, where: str) -> str:
    dt = str(value).upper()
    if dt not in DATATYPES:
        raise ConfigError(
            f"{where}: datatype {value!r} is not a V2 datatype; use one of {', '.join(DATATYPES)}"
        )
    return dt


def _range(text: str, name: str, dtype: str, shape_text: str) -> tuple[float, float]:
    """``LOW..HIGH`` (half-open) for an input of ``dtype``, validated."""
    example = (
        f"--input {name}:{dtype}:{shape_text}:0..30522"
        if int_bounds(dtype)
        else f"--input {name}:{dtype}:{shape_text}:-1.5..1.5"
    )
    where = f"--input {name}:{dtype}:{shape_text}:{text}"
    if dtype in ("BOOL", "BYTES"):
        raise ConfigError(f"{where}: a value range applies to numeric inputs, not {dtype}")
    low_text, sep, high_text = text.partition("..")
    bounds = int_bounds(dtype)
    try:
        if not sep:
            raise ValueError
        kind = int if bounds else float
        low, high = kind(low_text), kind(high_text)
    except ValueError:
        what = "integers" if bounds else "numbers"
        raise ConfigError(
            f"{where}: the range is not LOW..HIGH with {what} (half-open: HIGH is never "
            f"sent), e.g. {example}"
        ) from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ConfigError(f"{where}: LOW and HIGH must be finite numbers, e.g. {example}")
    if not low < high:
        raise ConfigError(f"{where}: LOW must be below HIGH (half-open range), e.g. {example}")
    if bounds and not (bounds[0] <= low and high <= bounds[1]):
        raise ConfigError(
            f"{where}: {dtype} holds [{bounds[0]}, {bounds[1]}); give a range inside it"
        )
    limit = FLOAT_MAX.get(dtype)
    if limit is not None and not (-limit <= low and high <= limit):
        raise ConfigError(f"{where}: {dtype} holds ±{limit:g}; give a range inside it")
    return low, high


def parse_input_option(text: str, batch_size: int = 1) -> InputSpec:
    """``NAME:DTYPE:SHAPE[:LOW..HIGH]`` (shape as ``1,64`` or ``1x64``; -1 = variable, a
    leading -1 the batch) → InputSpec."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ConfigError(
            f"--input has value {text!r}; expected NAME:DTYPE:SHAPE[:LOW..HIGH], e.g. "
            f"--input input:FP32:1,64 or --input ids:INT64:1,128:0..30522"
        )
    name, dtype, shape_text = parts[:3]
    try:
        dims = [int(d) for d in shape_text.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise ConfigError(
            f"--input has value {text!r}: shape {shape_text!r} is not a list of integers; "
            f"write e.g. 1,64"
        ) from None
    if not dims:
        raise ConfigError(f"--input has value {text!r}: the shape is empty; write e.g. 1,64")
    dt = _datatype(dtype, f"--input {text!r}")
    declared = _dims(dims, f"--input {text!r}")
    low = high = None
    if len(parts) == 4:
        low, high = _range(parts[3], name, dt, shape_text)
    return InputSpec(name, dt, sent_shape(declared, batch_size), low, high, declared)


def specs_from_metadata(
    meta: Mapping[str, Any], model: str, batch_size: int = 1
) -> list[InputSpec]:
    """Input specs from a ``GET /v2/models/{m}`` answer ([] when the server lists none)."""
    inputs = meta.get("inputs") or []
    out = []
    for i, item in enumerate(inputs):
        where = f"GET /v2/models/{model}: inputs[{i}]"
        try:
            declared = _dims(item["shape"], where)
            out.append(
                InputSpec(
                    str(item["name"]),
                    _datatype(item["datatype"], where),
                    sent_shape(declared, batch_size),
                    declared=declared,
                )
            )
        except (KeyError, TypeError):
            raise ConfigError(
                f"{where} = {item!r} lacks name/datatype/shape; state the inputs with "
                f"--input NAME:DTYPE:SHAPE or --sample-request FILE"
            ) from None
    return out


def load_sample_request(path: str | Path) -> tuple[list[InputSpec], list[dict[str, Any]]]:
    """Specs and the literal inputs of a sample V2 request file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        inputs = doc["inputs"]
        specs = []
        for x in inputs:
            declared = _dims(x["shape"], f"{p}")
            specs.append(
                InputSpec(str(x["name"]), _datatype(x["datatype"], f"{p}"), sent_shape(declared))
            )
    except FileNotFoundError:
        raise ConfigError(f"--sample-request has value {str(p)!r}: no such file") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"--sample-request {str(p)!r} is not a V2 inference request "
            f'({{"inputs": [{{"name", "datatype", "shape", "data"}}]}}): {exc}'
        ) from None
    if not specs:
        raise ConfigError(f"--sample-request {str(p)!r} has an empty 'inputs' list")
    return specs, [dict(x) for x in inputs]


def check_batch(specs: Sequence[InputSpec], batch_size: int, meta: Mapping[str, Any]) -> None:
    """``--batch-size N`` > 1 needs an input with a leading -1 (the batch dimension) and,
    when the metadata states one, N ≤ the model's ``max_batch_size``."""
    if batch_size == 1:
        return
    if not any(s.batched for s in specs):
        shapes = ", ".join(f"{s.name} {list(s.declared or s.shape)}" for s in specs)
        raise ConfigError(
            f"--batch-size {batch_size}: no input has a leading -1 (batch) dimension "
            f"({shapes}), so there is no dimension to batch; drop --batch-size, or declare "
            f"the batch with --input NAME:DTYPE:-1,..."
        )
    limit = (meta.get("parameters") or {}).get("max_batch_size")
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < batch_size:
        raise ConfigError(
            f"--batch-size {batch_size} exceeds the model's max_batch_size {limit} "
            f"(its metadata's parameters); the server would refuse every request"
        )


def resolve_specs(
    meta: Mapping[str, Any],
    model: str,
    input_options: Sequence[str] = (),
    sample_request: str | None = None,
    batch_size: int = 1,
    input_data: str | None = None,
) -> tuple[list[InputSpec], list[dict[str, Any]] | None]:
    """Inputs from the options (they win: the user knows best), else from the metadata,
    at ``batch_size`` (validated: ``check_batch``)."""
    if sample_request and input_data:
        raise ConfigError(
            "--sample-request and --input-data are both set; give one: a sample request is "
            "one template, an input-data file every request's data"
        )
    if sample_request:
        if batch_size != 1:
            raise ConfigError(
                f"--batch-size {batch_size} with --sample-request: the sample's shapes are "
                f"sent as written; write the batch into its shapes, or give the data with "
                f"--input-data FILE"
            )
        return load_sample_request(sample_request)
    if input_options:
        specs = [parse_input_option(t, batch_size) for t in input_options]
    else:
        specs = specs_from_metadata(meta, model, batch_size)
    if not specs:
        also = " (--input-data needs their datatypes and shapes too)" if input_data else ""
        raise ConfigError(
            f'model {model!r} reports no inputs (GET /v2/models/{model} has "inputs": []); '
            f"state them with --input NAME:DTYPE:SHAPE (e.g. --input input:FP32:1,64) "
            f"or --sample-request FILE{also}"
        )
    check_batch(specs, batch_size, meta)
    return specs, None


# -- generated values -----------------------------------------------------------------------


def _values(spec: InputSpec, rng: random.Random) -> list[Any]:
    n = math.prod(spec.shape)
    dt = spec.datatype
    if dt == "BOOL":
        return [rng.random() < 0.5 for _ in range(n)]
    if dt == "BYTES":
        return [f"s{rng.getrandbits(32):08x}" for _ in range(n)]
    if int_bounds(dt) is not None:
        low, high = DEFAULT_INT_RANGE if spec.low is None else (spec.low, spec.high)
        return [rng.randrange(int(low), int(high)) for _ in range(n)]
    low, high = DEFAULT_FLOAT_RANGE if spec.low is None else (spec.low, spec.high)
    out = []
    for _ in range(n):
        x = rng.uniform(low, high)
        # 4 decimals survive FP16 and keep the JSON short, unless they leave the range
        v = round(x, 4)
        out.append(v if low <= v < high else x)
    return out


def generate_inputs(
    specs: Sequence[InputSpec], count: int, seed: int, first: list[dict[str, Any]] | None = None
) -> list[list[dict[str, Any]]]:
    """``count`` distinct V2 ``inputs`` lists (the sample request's own data first)."""
    rng = random.Random(f"harness-payloads/{seed}")
    pool: list[list[dict[str, Any]]] = []
    if first is not None and all("data" in x for x in first):
        pool.append([{k: x[k] for k in ("name", "shape", "datatype", "data")} for x in first])
    while len(pool) < count:
        pool.append(
            [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "datatype": s.datatype,
                    "data": _values(s, rng),
                }
                for s in specs
            ]
        )
    return pool
