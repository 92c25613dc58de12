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
described by the user with ``--input NAME:DTYPE:SHAPE`` or ``--sample-request FILE``. The
inputs' shapes, batch size and value ranges are ``harness.protocols.kserve_v2_inputs``'s;
the user's own data (``--input-data FILE``, perf_analyzer's format) is
``harness.protocols.kserve_v2_data``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from harness.protocols.kserve_v2_data import flatten, load_input_data, requests_from
from harness.protocols.kserve_v2_inputs import (
    DATATYPES,
    InputSpec,
    generate_inputs,
    load_sample_request,
    parse_input_option,
    resolve_specs,
    specs_from_metadata,
)
from harness.protocols.protocol import BadResponse, ClassParams, Counters, WireProtocol

__all__ = [
    "DATATYPES",
    "InputSpec",
    "InputTemplate",
    "KServeV2",
    "counters_of",
    "flatten",
    "generate_inputs",
    "load_sample_request",
    "parse_answer",
    "parse_input_option",
    "resolve_specs",
    "specs_from_metadata",
]

# Triton's per-model duration counters (each with a count and nanoseconds)
DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class InputTemplate:
    """What ``KServeV2.resolve_inputs`` found: the inputs' specs (at the batch size), a
    sample request's literal inputs, or the requests built from an ``--input-data`` file."""

    specs: list[InputSpec]
    first: list[dict[str, Any]] | None = None
    requests: list[list[dict[str, Any]]] | None = None


# -- answers ------------------------------------------------------------------------------


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
        *,
        batch_size: int = 1,
        input_data: str | None = None,
    ) -> InputTemplate:
        specs, first = resolve_specs(
            meta, model, input_options, sample_request, batch_size, input_data
        )
        if input_data is None:
            return InputTemplate(specs, first)
        entries = load_input_data(input_data, specs, batch_size)
        return InputTemplate(specs, requests=requests_from(entries, specs, batch_size))

    def generate_inputs(
        self, template: InputTemplate, count: int, seed: int
    ) -> list[list[dict[str, Any]]]:
        """``count`` generated inputs; with ``--input-data``, the file's requests in
        order instead (their number is the pool's)."""
        if template.requests is not None:
            return list(template.requests)
        return generate_inputs(template.specs, count, seed, template.first)

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
