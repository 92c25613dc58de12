"""Inference requests built from the protocol, pre-encoded once.

The input names, datatypes and shapes come from ``GET /v2/models/{m}``; servers that
report none (MLServer with an sklearn model answers ``"inputs": []``) are told by the
user with ``--input NAME:DTYPE:SHAPE`` or ``--sample-request FILE``. A pool of distinct
inputs is generated from a seed and encoded to bytes once per traffic class, with the
class's Triton ``priority``/``timeout`` parameters; per request only the fixed-width id
is spliced in, so the hot path never touches JSON encoding.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, TargetUnavailable
from harness.load import http

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
ID_WIDTH = 16  # hex digits: 4 for the worker slot, 12 for the sequence number


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 (variable/batch) already replaced by 1


@dataclass(frozen=True)
class ClassParams:
    """What a traffic class adds to each request body."""

    name: str
    priority: int | None = None  # None or 0: leave the server default
    timeout_us: int | None = None


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


class PayloadPool:
    """Pre-encoded requests: ``parts(cls, i)`` → (head + body up to the id, rest of body)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        inputs: Sequence[list[dict[str, Any]]],
        classes: Sequence[ClassParams],
    ) -> None:
        self.inputs = list(inputs)
        self.class_names = [c.name for c in classes]
        self._parts: dict[str, list[tuple[bytes, bytes]]] = {}
        for c in classes:
            params: dict[str, Any] = {}
            if c.priority:
                params["priority"] = int(c.priority)
            if c.timeout_us:
                params["timeout"] = int(c.timeout_us)
            rows = []
            for inp in self.inputs:
                rest = {"inputs": inp}
                if params:
                    rest = {"parameters": params, "inputs": inp}
                tail = ('",' + json.dumps(rest, separators=(",", ":"))[1:]).encode()
                body_len = len(b'{"id":"') + ID_WIDTH + len(tail)
                head = http.build_head("POST", path, host, port, body_len)
                rows.append((head + b'{"id":"', tail))
            self._parts[c.name] = rows

    def __len__(self) -> int:
        return len(self.inputs)

    def raw(self, cls: str, index: int, request_id: str) -> bytes:
        head, tail = self._parts[cls][index]
        return head + request_id.encode() + tail

    def body(self, cls: str, index: int, request_id: str) -> bytes:
        """The JSON body alone (for tests and for the golden fetch)."""
        raw = self.raw(cls, index, request_id)
        return raw[raw.index(b"\r\n\r\n") + 4 :]


def make_id(slot: int, seq: int) -> str:
    """Fixed-width request id, unique across workers: 4 hex digits of slot, 12 of sequence."""
    return f"{slot & 0xFFFF:04x}{seq & 0xFFFFFFFFFFFF:012x}"


def fetch_json(
    url: str, timeout: float = 10.0, on_status: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """GET a JSON document from the SUT; TargetUnavailable when it cannot be had.
    ``on_status`` may raise a more precise error for a status other than 200 first."""
    try:
        status, body = http.request(url, "GET", timeout=timeout)
    except http.TLSFailed as exc:
        raise ConfigError(str(exc)) from None
    except (http.RequestTimeout, http.ConnectionFailed) as exc:
        raise TargetUnavailable(f"GET {url} failed: {exc}; is the server running?") from None
    if status != 200 and on_status is not None:
        on_status(status)
    if status != 200:
        raise TargetUnavailable(f"GET {url} answered HTTP {status}: {body[:200]!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise TargetUnavailable(f"GET {url} did not answer JSON: {body[:200]!r}") from None


def model_metadata(base_url: str, model: str, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /v2/models/{model}``; a 404 is a ConfigError naming --model."""

    def unknown_model(status: int) -> None:
        if status == 404:
            raise ConfigError(
                f"--model has value {model!r}, which the server at {base_url} does not serve "
                f"(GET /v2/models/{model} → 404); pass the model's name with --model NAME"
            )

    return fetch_json(f"{base_url.rstrip('/')}/v2/models/{model}", timeout, unknown_model)
