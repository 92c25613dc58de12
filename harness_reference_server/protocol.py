"""KServe V2 inference request parsing and response building.

Parsing turns a request body into a typed ``InferRequest`` or raises ``ProtocolError``
with an HTTP status and a message that names the field, what was received and what was
expected. Nothing here knows about the batcher or the HTTP framework.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import orjson

from harness_reference_server.models import Model


class ProtocolError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class InferRequest:
    id: str | None
    rows: np.ndarray  # float32 [k, D]
    level: int  # 0 = highest priority level
    timeout_s: float | None
    output_names: tuple[str, ...]


def priority_level(priority: int, levels: int) -> int:
    """Triton semantics: 1 = highest; 0, absent or above ``levels`` = the default level.

    The default level is the lowest one. Returns a 0-based index (0 = highest).
    """
    if 1 <= priority <= levels:
        return priority - 1
    return levels - 1


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _uint_param(params: dict[str, Any], key: str) -> int | None:
    if key not in params:
        return None
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(
            400,
            f"parameters.{key} has value {_short(value)}. Expected an unsigned integer"
            + (" (microseconds)." if key == "timeout" else "."),
        )
    return value


# Every byte a digit becomes "0", a "." stays, anything else becomes "x": an integer
# token of 19 or more digits (the only kind that can fall outside a 64-bit integer) then
# reads "x" + 19 zeros (or 19 zeros at the start); a fraction's digits follow a ".".
_NUMBER_SHAPE = bytes(
    ord("0") if chr(b) in "0123456789" else ord(".") if chr(b) == "." else ord("x")
    for b in range(256)
)
_LONG_INT = b"x" + b"0" * 19


def decode_json(body: bytes) -> Any:
    """``json.loads(body)``: the same value or the same exception, at a fraction of the cost.

    orjson parses the body when it can give what the standard library gives: it rejects
    everything beyond strict UTF-8 JSON that ``json.loads`` accepts (NaN and Infinity,
    numbers that overflow to infinity, lone surrogates, UTF-16/32 and BOMs, deep
    nesting), so those go to ``json.loads``, as does any body with an integer of 19 or
    more digits (orjson reads integers beyond 64 bits as floats). Floats are correctly
    rounded by both, duplicate keys keep the last value in both.
    """
    shape = body.translate(_NUMBER_SHAPE)
    if _LONG_INT not in shape and not shape.startswith(_LONG_INT[1:]):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


def parse_infer_request(
    body: bytes, model: Model, levels: int, max_batch_size: int
) -> InferRequest:
    try:
        doc = decode_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(
            400, f"request body is not valid JSON ({exc}). Expected a JSON object."
        ) from None
    if not isinstance(doc, dict):
        raise ProtocolError(
            400, f"request body has type {type(doc).__name__}. Expected a JSON object."
        )

    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise ProtocolError(400, f"id has value {_short(req_id)}. Expected a string.")

    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(400, f"parameters has value {_short(params)}. Expected a JSON object.")
    priority = _uint_param(params, "priority") or 0
    timeout_us = _uint_param(params, "timeout")
    # Triton: a timeout of 0 means "no timeout".
    timeout_s = timeout_us / 1e6 if timeout_us else None

    rows = _parse_inputs(doc.get("inputs"), model, max_batch_size)
    output_names = _parse_outputs(doc.get("outputs"), model)
    return InferRequest(
        id=req_id,
        rows=rows,
        level=priority_level(priority, levels),
        timeout_s=timeout_s,
        output_names=output_names,
    )


def _parse_inputs(inputs: Any, model: Model, max_batch_size: int) -> np.ndarray:
    spec = model.input
    if not isinstance(inputs, list) or len(inputs) != 1:
        got = f"{len(inputs)} tensors" if isinstance(inputs, list) else _short(inputs)
        raise ProtocolError(
            400, f"inputs has {got}. Expected a list with one tensor named {spec.name!r}."
        )
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise ProtocolError(400, f"inputs[0] has value {_short(tensor)}. Expected a JSON object.")
    name = tensor.get("name")
    if name != spec.name:
        raise ProtocolError(
            400, f"inputs[0].name has value {_short(name)}. Expected {spec.name!r}."
        )
    datatype = tensor.get("datatype")
    if datatype != spec.datatype:
        raise ProtocolError(
            400, f"inputs[0].datatype has value {_short(datatype)}. Expected {spec.datatype!r}."
        )
    shape = tensor.get("shape")
    expected_shape = f"[k, {spec.width}] with 1 <= k <= {max_batch_size}"
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or shape[1] != spec.width
        or not 1 <= shape[0] <= max_batch_size
    ):
        raise ProtocolError(
            400, f"inputs[0].shape has value {_short(shape)}. Expected {expected_shape}."
        )
    if "data" not in tensor:
        raise ProtocolError(400, "inputs[0].data is missing. Expected a list of numbers.")
    data = tensor["data"]
    if not isinstance(data, list):
        raise ProtocolError(
            400, f"inputs[0].data has value {_short(data)}. Expected a list of numbers."
        )
    try:
        arr = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError):
        raise ProtocolError(
            400,
            "inputs[0].data could not be read as FP32 numbers (non-numeric or ragged nesting). "
            "Expected a flat or nested list of numbers.",
        ) from None
    n_expected = shape[0] * shape[1]
    if arr.size != n_expected:
        raise ProtocolError(
            400,
            f"inputs[0].data has {arr.size} elements. Expected {n_expected} for shape {shape}.",
        )
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and list(arr.shape) != shape):
        raise ProtocolError(
            400,
            f"inputs[0].data is nested as {list(arr.shape)}. Expected flat or nested as {shape}.",
        )
    return arr.reshape(shape[0], shape[1])


def _parse_outputs(outputs: Any, model: Model) -> tuple[str, ...]:
    known = model.output.name
    if outputs is None:
        return (known,)
    if not isinstance(outputs, list):
        raise ProtocolError(
            400, f"outputs has value {_short(outputs)}. Expected a list of {{'name': ...}}."
        )
    names = []
    for i, out in enumerate(outputs):
        name = out.get("name") if isinstance(out, dict) else None
        if name != known:
            raise ProtocolError(
                400, f"outputs[{i}].name has value {_short(name)}. Expected {known!r}."
            )
        names.append(name)
    return tuple(names) or (known,)


def infer_response(model: Model, req: InferRequest, result: np.ndarray) -> dict[str, Any]:
    flat = result.reshape(-1).tolist()
    if not all(map(math.isfinite, flat)):
        # JSON has no NaN/Inf; a model producing them is a model error.
        raise ProtocolError(500, "model output contains NaN or Inf. Expected finite FP32 values.")
    outputs = [
        {
            "name": name,
            "shape": [int(result.shape[0]), int(result.shape[1])],
            "datatype": model.output.datatype,
            "data": flat,
        }
        for name in req.output_names
    ]
    doc: dict[str, Any] = {"model_name": model.name, "model_version": "1", "outputs": outputs}
    if req.id is not None:
        doc["id"] = req.id
    return doc
