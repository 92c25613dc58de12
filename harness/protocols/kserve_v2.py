"""KServe V2 / Open Inference Protocol over REST (Triton, MLServer, KServe, TorchServe's
V2 front end, the bundled reference server).

- ready: ``GET /v2/health/ready`` answers 200 (Triton and MLServer send empty bodies);
- metadata: ``GET /v2`` (the server; the reference server names its model there) and
  ``GET /v2/models/{m}`` (the model: its inputs' names, datatypes and shapes, and
  ``parameters.max_batch_size``);
- inference: ``POST /v2/models/{m}/infer`` with ``{"id", ["parameters",] "inputs"}``;
  a traffic class's priority and timeout go in Triton's ``parameters``;
- answers: ``{"id", "outputs": [{"name", "data", ...}]}``; the id is echoed, the
  outputs' data (flat or nested, row-major) are read in output-name order;
- statistics: ``GET /v2/models/{m}/stats``, Triton's statistics extension (the
  reference server offers it too).

Models that list no inputs (MLServer with an sklearn model answers ``"inputs": []``) are
described by the user with ``--input NAME:DTYPE:SHAPE`` or ``--sample-request FILE``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.errors import ConfigError
from harness.protocols.protocol import BadResponse, ClassParams, Counters, WireProtocol

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
# Triton's per-model duration counters (each with a count and nanoseconds)
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 (variable/batch) already replaced by 1


# -- inputs: from the metadata, the options or a sample request ---------------------------


def _shape(raw: Sequence[Any], where: str) -> tuple[int, ...]:
    out = []
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or d == 0 or d < -1:
            raise ConfigError(
                f"{where}: shape {list(raw)} has dimension {d!r}; expected positive integers "
                f"or -1 (variable)"
            )
        out.append(1 if d == -1 else d)
    return tuple(out)


def _datatype(value: Any, where: str) -> str:
    dt = str(value).upper()
    if dt not in DATATYPES:
        raise ConfigError(
            f"{where}: datatype {value!r} is not a V2 datatype; use one of {', '.join(DATATYPES)}"
        )
    return dt


def parse_input_option(text: str) -> InputSpec:
    """``NAME:DTYPE:SHAPE`` (shape as ``1,64`` or ``1x64``; -1 = variable) → InputSpec."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ConfigError(
            f"--input has value {text!r}; expected NAME:DTYPE:SHAPE, e.g. --input input:FP32:1,64"
        )
    name, dtype, shape_text = parts
    try:
        dims = [int(d) for d in shape_text.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise ConfigError(
            f"--input has value {text!r}: shape {shape_text!r} is not a list of integers; "
            f"write e.g. 1,64"
        ) from None
    if not dims:
        raise ConfigError(f"--input has value {text!r}: the shape is empty; write e.g. 1,64")
    return InputSpec(name, _datatype(dtype, f"--input {text!r}"), _shape(dims, f"--input {text!r}"))


def specs_from_metadata(meta: Mapping[str, Any], model: str) -> list[InputSpec]:
    """Input specs from a ``GET /v2/models/{m}`` answer ([] when the server lists none)."""
    inputs = meta.get("inputs") or []
    out = []
    for i, item in enumerate(inputs):
        where = f"GET /v2/models/{model}: inputs[{i}]"
        try:
            out.append(
                InputSpec(
                    str(item["name"]),
                    _datatype(item["datatype"], where),
                    _shape(item["shape"], where),
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
        specs = [
            InputSpec(str(x["name"]), _datatype(x["datatype"], f"{p}"), _shape(x["shape"], f"{p}"))
            for x in inputs
        ]
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


def resolve_specs(
    meta: Mapping[str, Any],
    model: str,
    input_options: Sequence[str] = (),
    sample_request: str | None = None,
) -> tuple[list[InputSpec], list[dict[str, Any]] | None]:
    """Inputs from the options (they win: the user knows best), else from the metadata."""
    if sample_request:
        return load_sample_request(sample_request)
    if input_options:
        return [parse_input_option(t) for t in input_options], None
    specs = specs_from_metadata(meta, model)
    if not specs:
        raise ConfigError(
            f'model {model!r} reports no inputs (GET /v2/models/{model} has "inputs": []); '
            f"state them with --input NAME:DTYPE:SHAPE (e.g. --input input:FP32:1,64) "
            f"or --sample-request FILE"
        )
    return specs, None


def _values(spec: InputSpec, rng: random.Random) -> list[Any]:
    n = math.prod(spec.shape)
    dt = spec.datatype
    if dt == "BOOL":
        return [rng.random() < 0.5 for _ in range(n)]
    if dt == "BYTES":
        return [f"s{rng.getrandbits(32):08x}" for _ in range(n)]
    if dt.startswith("UINT"):
        return [rng.randrange(0, 100) for _ in range(n)]
    if dt.startswith("INT"):
        return [rng.randrange(-50, 50) for _ in range(n)]
    # floats: 4 decimals survive FP16 and keep the JSON short
    return [round(rng.uniform(-1.0, 1.0), 4) for _ in range(n)]


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


# -- answers ------------------------------------------------------------------------------


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


def parse_answer(body: bytes) -> tuple[str | None, tuple[Any, ...]]:
    """(echoed id, all outputs' values concatenated in output-name order)."""
    try:
        doc = json.loads(body)
        outputs = doc["outputs"]
        if not isinstance(outputs, list) or not outputs:
            raise BadResponse("no outputs")
        if len(outputs) == 1:
            values = flatten(outputs[0]["data"])
        else:
            values = []
            for out in sorted(outputs, key=lambda o: str(o.get("name"))):
                values.extend(flatten(out["data"]))
    except BadResponse:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadResponse(f"{type(exc).__name__}: {exc}") from None
    rid = doc.get("id")
    return (None if rid is None else str(rid)), tuple(values)


# -- the statistics extension -------------------------------------------------------------


def counters_of(doc: Any, model: str) -> Counters | None:
    """The model's cumulative counters from a stats answer (every version of it summed),
    or None when the answer is not Triton's statistics for that model."""
    entries = doc.get("model_stats") if isinstance(doc, Mapping) else None
    if not isinstance(entries, list):
        return None
    mine = [e for e in entries if isinstance(e, Mapping) and e.get("name") == model]
    if not mine:
        return None
    out: Counters = {"inference_count": 0, "execution_count": 0}
    for key in DURATIONS:
        out[f"{key}_count"] = out[f"{key}_ns"] = 0
    try:
        for e in mine:
            out["inference_count"] += int(e.get("inference_count") or 0)
            out["execution_count"] += int(e.get("execution_count") or 0)
            inf = e.get("inference_stats") or {}
            for key in DURATIONS:
                d = inf.get(key) or {}
                out[f"{key}_count"] += int(d.get("count") or 0)
                out[f"{key}_ns"] += int(d.get("ns") or 0)
    except (TypeError, ValueError, AttributeError):
        return None
    return out


# -- the protocol -------------------------------------------------------------------------


class KServeV2(WireProtocol):
    """KServe V2 over REST (see the module doc)."""

    name = "kserve-v2"
    ready_path = "/v2/health/ready"
    stats_source = "v2-statistics"

    def server_metadata_path(self) -> str:
        return "/v2"

    def default_model(self, server_meta: Mapping[str, Any] | None) -> str | None:
        model = (server_meta or {}).get("model")
        return str(model) if model else None

    def model_metadata_path(self, model: str) -> str:
        return f"/v2/models/{model}"

    def infer_path(self, model: str) -> str:
        return f"/v2/models/{model}/infer"

    def max_batch(self, meta: Mapping[str, Any]) -> int:
        return int((meta.get("parameters") or {}).get("max_batch_size") or 32)

    def resolve_inputs(
        self,
        meta: Mapping[str, Any],
        model: str,
        input_options: Sequence[str] = (),
        sample_request: str | None = None,
    ) -> tuple[list[InputSpec], list[dict[str, Any]] | None]:
        return resolve_specs(meta, model, input_options, sample_request)

    def generate_inputs(
        self, template: tuple[list[InputSpec], list[dict[str, Any]] | None], count: int, seed: int
    ) -> list[list[dict[str, Any]]]:
        specs, first = template
        return generate_inputs(specs, count, seed, first)

    def request_parts(self, inputs: Any, cls: ClassParams) -> tuple[bytes, bytes]:
        params: dict[str, Any] = {}
        if cls.priority:
            params["priority"] = int(cls.priority)
        if cls.timeout_us:
            params["timeout"] = int(cls.timeout_us)
        rest: dict[str, Any] = {"inputs": inputs}
        if params:
            rest = {"parameters": params, "inputs": inputs}
        return b'{"id":"', ('",' + json.dumps(rest, separators=(",", ":"))[1:]).encode()

    def parse_answer(self, body: bytes) -> tuple[str | None, tuple[Any, ...]]:
        return parse_answer(body)

    def stats_path(self, model: str) -> str:
        return f"/v2/models/{quote(model, safe='')}/stats"

    def stats_counters(self, doc: Any, model: str) -> Counters | None:
        return counters_of(doc, model)
