"""The plugin's options about what each request carries: ``--input``, ``--sample-request``,
``--batch-size``, ``--input-data`` (each with a ``HARNESS_*`` environment variable),
declared and validated here for ``harness.load.options``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.errors import ConfigError


def positive_int(text: str) -> int:
    """An integer ≥ 1 (argparse type: the CLI copies it with the option)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return v


def data_file(text: str) -> str:
    """An existing file, as an absolute path (so every process reads the same file)."""
    p = Path(text).expanduser()
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file")
    return str(p.resolve())


def add_input_options(g: Any) -> None:
    g.add_argument(
        "--input",
        dest="harness_input",
        action="append",
        default=None,
        env_var="HARNESS_INPUT",
        help="NAME:DTYPE:SHAPE[:LOW..HIGH] of a model input, when the server lists none or "
        "to set its values' range (half-open; default integers [0, 100), floats [-1, 1)), "
        "e.g. ids:INT64:-1,128:0..30522 (repeatable)",
    )
    g.add_argument(
        "--sample-request",
        default=None,
        env_var="HARNESS_SAMPLE_REQUEST",
        help="a V2 inference request JSON file whose inputs are used as the template",
    )
    g.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        env_var="HARNESS_BATCH_SIZE",
        metavar="N",
        help="inferences per request: the leading -1 (batch) dimension of every input "
        "becomes N (default 1). Throughput is counted in requests; results record N "
        "(sut.inputs.batch_size)",
    )
    g.add_argument(
        "--input-data",
        type=data_file,
        default=None,
        env_var="HARNESS_INPUT_DATA",
        metavar="FILE",
        help='the requests\' data, perf_analyzer\'s JSON ({"data": [{"INPUT0": [...]}, ...]}, '
        "an entry per batch element) or JSONL (.jsonl: an entry per line); sent in the "
        "file's order, cycled; checked against the model's inputs before the load",
    )


def input_options_from(parsed: Any) -> dict[str, Any]:
    """The input options validated (ConfigError naming the fix) into Options fields;
    ``parsed`` reads them as argparse would have typed them."""
    inputs = parsed.harness_input or ()
    if isinstance(inputs, str):  # from the environment variable: comma-free, space-separated
        inputs = inputs.split()
    batch_size = parsed.batch_size
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size has value {batch_size!r}; expected an integer ≥ 1")
    input_data = parsed.input_data or None
    if input_data and parsed.sample_request:
        raise ConfigError(
            "--sample-request and --input-data are both set; give one: a sample request is "
            "one template, an input-data file every request's data"
        )
    if input_data and not Path(input_data).is_file():
        raise ConfigError(f"--input-data has value {input_data!r}: no such file")
    return {
        "inputs": tuple(inputs),
        "sample_request": parsed.sample_request,
        "batch_size": batch_size or 1,
        "input_data": str(Path(input_data).resolve()) if input_data else None,
    }
