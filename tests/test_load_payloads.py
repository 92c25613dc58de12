"""Payloads from V2 metadata, from options, from a sample request, from an input-data
file; value ranges, the batch size; the missing-spec error."""

from __future__ import annotations

import argparse
import json

import configargparse
import pytest

from harness.errors import ConfigError
from harness.load.options import Options, add_options, options_from
from harness.load.payloads import ID_WIDTH, ClassParams, PayloadPool, make_id
from harness.protocols.kserve_v2 import (
    InputSpec,
    KServeV2,
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


# -- value ranges ---------------------------------------------------------------------------


def _values_of(spec: InputSpec, n: int = 40) -> list:
    return [v for inputs in generate_inputs([spec], n, seed=3) for v in inputs[0]["data"]]


def test_generated_integers_are_non_negative_ids_by_default() -> None:
    for dtype in ("INT8", "INT32", "INT64", "UINT8", "UINT64"):
        values = _values_of(InputSpec("ids", dtype, (1, 16)))
        assert all(isinstance(v, int) and 0 <= v < 100 for v in values), dtype
        assert max(values) >= 90 and min(values) <= 9, dtype  # the whole range is drawn
    floats = _values_of(InputSpec("x", "FP32", (1, 16)))
    assert all(-1.0 <= v < 1.0 for v in floats) and min(floats) < 0 < max(floats)


def test_declared_range_bounds_every_generated_value() -> None:
    spec = parse_input_option("ids:INT64:-1,128:0..30522")
    assert (spec.low, spec.high, spec.shape, spec.declared) == (0, 30522, (1, 128), (-1, 128))
    ids = _values_of(spec, 20)
    assert all(isinstance(v, int) and 0 <= v < 30522 for v in ids) and max(ids) > 20000
    # half-open: HIGH is never sent, LOW is
    assert set(_values_of(parse_input_option("c:INT32:1,64:3..5"))) == {3, 4}
    narrow = _values_of(parse_input_option("x:FP32:1,64:0.5..0.50005"))
    assert all(0.5 <= v < 0.50005 for v in narrow)  # rounding never leaves the range
    signed = _values_of(parse_input_option("t:FP16:1,8:-100..-50"))
    assert all(-100 <= v < -50 for v in signed)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ids:INT64:1,128:5..5", "LOW must be below HIGH"),
        ("ids:INT64:1,128:9..2", "LOW must be below HIGH"),
        ("ids:INT64:1,128:0.5..10", "integers"),
        ("ids:INT64:1,128:0-10", "LOW..HIGH"),
        ("ids:INT8:1,128:0..300", "INT8 holds [-128, 128)"),
        ("ids:UINT8:1,128:-1..10", "UINT8 holds [0, 256)"),
        ("x:FP16:1,4:0..1e6", "FP16 holds"),
        ("x:FP32:1,4:nan..1", "finite numbers"),
        ("flag:BOOL:1:0..2", "numeric inputs"),
        ("ids:INT64:1,128:0..10:extra", "NAME:DTYPE:SHAPE[:LOW..HIGH]"),
    ],
)
def test_bad_ranges_name_the_fix(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_input_option(text)
    msg = str(err.value)
    assert says in msg and "--input" in msg and "\n" not in msg, msg


# -- batch size -----------------------------------------------------------------------------

BATCHED = {
    "inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [-1, 4]},
        {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
    ],
    "parameters": {"max_batch_size": 8},
}


def test_batch_size_fills_the_leading_variable_dimension_only() -> None:
    specs, _ = resolve_specs(BATCHED, "bert", batch_size=4)
    assert [s.shape for s in specs] == [(4, 4), (4, 1)]
    pool = generate_inputs(specs, 3, seed=1)
    assert pool[0][0]["shape"] == [4, 4] and len(pool[0][0]["data"]) == 16
    assert resolve_specs(BATCHED, "bert")[0][0].shape == (1, 4)
    (opt,) = resolve_specs({}, "m", input_options=["x:FP32:-1,8"], batch_size=3)[0]
    assert opt.shape == (3, 8)


def test_batch_size_without_a_batch_dimension_or_beyond_the_model_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_specs(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8]}]}, "m", (), None, 2
        )
    assert "no input has a leading -1" in str(err.value) and "x [1, 8]" in str(err.value)
    with pytest.raises(ConfigError, match="exceeds the model's max_batch_size 8"):
        resolve_specs(BATCHED, "bert", batch_size=9)
    assert resolve_specs(BATCHED, "bert", batch_size=8)[0][0].shape == (8, 4)
    sample = tmp_path / "req.json"
    sample.write_text(
        json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
    )
    with pytest.raises(ConfigError, match="--batch-size 2 with --sample-request"):
        resolve_specs({}, "m", sample_request=str(sample), batch_size=2)


# -- --input-data ---------------------------------------------------------------------------

ENTRIES = [
    {"ids": [1, 2, 3, 4], "mask": {"content": [1, 1, 0], "shape": [3]}},
    {"ids": [[5, 6], [7, 8]], "mask": {"content": [1, 0, 0], "shape": [3]}},
    {"ids": [9, 10, 11, 12], "mask": {"content": [1, 1, 1], "shape": [3]}},
]


def _data_file(tmp_path, entries=ENTRIES, name="data.json", doc=None) -> str:
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    else:
        path.write_text(json.dumps(doc if doc is not None else {"data": entries}))
    return str(path)


def _pool(meta, path: str, batch_size: int = 1, **kw) -> list:
    proto = KServeV2()
    template = proto.resolve_inputs(meta, "bert", batch_size=batch_size, input_data=path, **kw)
    return proto.generate_inputs(template, 64, seed=1)


def test_input_data_entries_are_the_pool_in_file_order(tmp_path) -> None:
    pool = _pool(BATCHED, _data_file(tmp_path))
    assert len(pool) == 3  # the file's entries, whatever the pool size asked
    assert pool[0] == [
        {"name": "ids", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]},
        {"name": "mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 0]},
    ]
    assert pool[1][0]["data"] == [5, 6, 7, 8]  # nested values flattened row-major
    assert _pool(BATCHED, _data_file(tmp_path, name="data.jsonl")) == pool  # JSONL: the same


def test_input_data_batches_stack_consecutive_entries_cycled(tmp_path) -> None:
    pool = _pool(BATCHED, _data_file(tmp_path), batch_size=2)
    assert [inputs[0]["data"] for inputs in pool] == [
        [1, 2, 3, 4, 5, 6, 7, 8],
        [5, 6, 7, 8, 9, 10, 11, 12],
        [9, 10, 11, 12, 1, 2, 3, 4],
    ]
    assert {tuple(inp["shape"]) for inputs in pool for inp in inputs} == {(2, 4), (2, 3)}
    ragged = [ENTRIES[0], {"ids": [1, 2, 3, 4], "mask": {"content": [1], "shape": [1]}}]
    with pytest.raises(ConfigError, match=r"entries 0 and 1 .* shapes \[3\] and \[1\]"):
        _pool(BATCHED, _data_file(tmp_path, ragged), batch_size=2)


def test_input_data_may_give_the_whole_shape_at_batch_size_one(tmp_path) -> None:
    whole = [{"ids": {"content": list(range(8)), "shape": [2, 4]}, "mask": [1]}]
    pool = _pool(BATCHED, _data_file(tmp_path, whole))
    assert pool[0][0] == {
        "name": "ids",
        "shape": [2, 4],
        "datatype": "INT64",
        "data": list(range(8)),
    }
    with pytest.raises(ConfigError, match="includes the batch dimension"):
        _pool(BATCHED, _data_file(tmp_path, whole), batch_size=2)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"ids": [1, 2, 3], "mask": [1]}, "input 'ids' has 3 values; shape [4] takes 4"),
        ({"ids": [1, 2, 3, 4]}, "lacks input(s) ['mask']"),
        ({"ids": [1, 2, 3, 4], "mask": [1], "typo": [1]}, "names ['typo']"),
        ({"ids": [1, 2, 3, 4.5], "mask": [1]}, "value [3] = 4.5 is not INT64"),
        ({"ids": [1, 2, 3, True], "mask": [1]}, "value [3] = True is not INT64"),
        ({"ids": [1, 2, 3, 2**63], "mask": [1]}, "outside INT64's range"),
        ({"ids": {"b64": "AAAA"}, "mask": [1]}, "base64"),
        ({"ids": {"content": {"b64": "AAAA"}, "shape": [4]}, "mask": [1]}, "base64"),
        ({"ids": {"content": [1, 2, 3, 4], "shape": [2, 2]}, "mask": [1]}, "does not fit"),
        ({"ids": {"content": [1, 2, 3, 4], "shape": [0]}, "mask": [1]}, "positive ints"),
        ({"ids": "1 2 3 4", "mask": [1]}, "expected a list"),
        ([{"ids": [1, 2, 3, 4]}], "sequence streams are not supported"),
    ],
)
def test_every_input_data_entry_is_checked_naming_file_and_entry(tmp_path, entry, says) -> None:
    path = _data_file(tmp_path, [ENTRIES[0], entry])
    with pytest.raises(ConfigError) as err:
        _pool(BATCHED, path)
    msg = str(err.value)
    assert says in msg and f"{path}: data[1]" in msg and "\n" not in msg, msg
    jsonl = _data_file(tmp_path, [ENTRIES[0], entry], name="data.jsonl")
    with pytest.raises(ConfigError, match=rf"{jsonl}:2\b"):
        _pool(BATCHED, jsonl)


def test_input_data_files_that_are_not_entries_are_refused(tmp_path) -> None:
    for doc, says in (
        ({"inputs": []}, 'no "data" list'),
        ({"data": []}, "has no entries"),
    ):
        with pytest.raises(ConfigError, match=says):
            _pool(BATCHED, _data_file(tmp_path, doc=doc))
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [')
    with pytest.raises(ConfigError, match="is not JSON"):
        _pool(BATCHED, str(bad))
    with pytest.raises(ConfigError, match="no such file"):
        _pool(BATCHED, str(tmp_path / "none.json"))
    # the inputs' datatypes and shapes must be known: from the metadata or --input
    with pytest.raises(ConfigError, match="--input-data needs their datatypes"):
        _pool({"inputs": []}, _data_file(tmp_path))
    pool = _pool(
        {"inputs": []}, _data_file(tmp_path), input_options=("ids:INT64:-1,4", "mask:INT64:-1,3")
    )
    assert len(pool) == 3


def test_input_data_and_sample_request_are_one_or_the_other(tmp_path) -> None:
    with pytest.raises(ConfigError, match="--sample-request and --input-data are both set"):
        resolve_specs({}, "m", sample_request="req.json", input_data=_data_file(tmp_path))
    parsed = _plugin_parse(["--input-data", _data_file(tmp_path), "--sample-request", "r.json"])
    with pytest.raises(ConfigError, match="--sample-request and --input-data are both set"):
        options_from(parsed)


# -- the plugin's options -------------------------------------------------------------------


def _plugin_parse(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    p = configargparse.ArgumentParser()
    add_options(p)
    return p.parse_args(argv, env_vars=env or {})


def test_plugin_options_batch_size_and_input_data_travel_to_workers(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _data_file(tmp_path)
    opts = options_from(_plugin_parse(["--batch-size", "4", "--input-data", "data.json"]))
    assert opts.batch_size == 4 and opts.input_data == str(tmp_path / "data.json")
    assert Options.from_wire(json.loads(json.dumps(opts.to_wire()))) == opts
    env = {"HARNESS_BATCH_SIZE": "3", "HARNESS_INPUT_DATA": "data.json"}
    from_env = options_from(_plugin_parse([], env))
    assert (from_env.batch_size, from_env.input_data) == (3, opts.input_data)
    assert options_from(_plugin_parse([])).batch_size == 1
    for argv in (["--batch-size", "0"], ["--batch-size", "x"], ["--input-data", "none.json"]):
        with pytest.raises(SystemExit):
            _plugin_parse(argv)
