"""Payloads from V2 metadata, from options, from a sample request; the missing-spec error."""

from __future__ import annotations

import json

import pytest

from harness.errors import ConfigError
from harness.load.payloads import ID_WIDTH, ClassParams, PayloadPool, make_id
from harness.protocols.kserve_v2 import (
    InputSpec,
    generate_inputs,
    parse_input_option,
    resolve_specs,
)

META = {
    "name": "mlp",
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}],
    "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 2]}],
}


def test_specs_from_metadata_replace_variable_dims() -> None:
    specs, first = resolve_specs(META, "mlp")
    assert specs == [InputSpec("input", "FP32", (1, 8))] and first is None


def test_missing_input_metadata_names_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_specs({"name": "skl", "inputs": []}, "skl")
    msg = str(err.value)
    assert "--input NAME:DTYPE:SHAPE" in msg and "--sample-request" in msg and "skl" in msg
    assert "\n" not in msg


def test_input_option_parsing_and_errors() -> None:
    assert parse_input_option("x:fp32:1,4") == InputSpec("x", "FP32", (1, 4))
    assert parse_input_option("x:INT64:-1x3") == InputSpec("x", "INT64", (1, 3))
    for bad in ("x:FP32", "x:FLOAT:1,4", "x:FP32:a,b", "x:FP32:0,4"):
        with pytest.raises(ConfigError, match="--input"):
            parse_input_option(bad)
    specs, _ = resolve_specs({"inputs": []}, "m", input_options=["x:FP32:1,4"])
    assert specs[0].shape == (1, 4)


def test_sample_request_is_used_as_first_input(tmp_path) -> None:
    sample = {"inputs": [{"name": "in", "datatype": "FP64", "shape": [1, 3], "data": [1, 2, 3]}]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(sample))
    specs, first = resolve_specs({"inputs": []}, "m", sample_request=str(path))
    pool = generate_inputs(specs, 5, seed=1, first=first)
    assert pool[0][0]["data"] == [1, 2, 3]
    assert len({json.dumps(p) for p in pool}) == 5
    with pytest.raises(ConfigError, match="no such file"):
        resolve_specs({}, "m", sample_request=str(tmp_path / "none.json"))


def test_pool_is_distinct_and_reproducible() -> None:
    specs = [InputSpec("input", "FP32", (1, 8)), InputSpec("flag", "BOOL", (1, 1))]
    a = generate_inputs(specs, 64, seed=7)
    assert a == generate_inputs(specs, 64, seed=7)
    assert len({json.dumps(p) for p in a}) == 64
    assert a != generate_inputs(specs, 64, seed=8)


def test_encoded_requests_carry_class_parameters_and_id() -> None:
    inputs = generate_inputs([InputSpec("input", "FP32", (1, 8))], 4, seed=1)
    classes = [ClassParams("high", 1, 50_000), ClassParams("default", 0, None)]
    pool = PayloadPool("127.0.0.1", 8000, "/v2/models/mlp/infer", inputs, classes)
    rid = make_id(3, 12345)
    assert len(rid) == ID_WIDTH
    raw = pool.raw("high", 2, rid)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v2/models/mlp/infer HTTP/1.1")
    assert f"Content-Length: {len(body)}".encode() in head
    doc = json.loads(body)
    assert doc["id"] == rid
    assert doc["parameters"] == {"priority": 1, "timeout": 50_000}
    assert doc["inputs"] == inputs[2]
    plain = json.loads(pool.body("default", 2, rid))
    assert "parameters" not in plain and plain["inputs"] == inputs[2]
