"""The results document: build, atomic write, versioned load, merge; golden files."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from harness import __version__
from harness.errors import ResultFormatError
from harness.results import (
    READABLE_VERSIONS,
    SCHEMA,
    combine_verdicts,
    load_document,
    machine_metadata,
    merge_documents,
    new_document,
    write_document,
)
from harness.testing.reference_document import build_document
from harness.testing.results import MACHINE, scenario

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
GOLDEN_RESULTS = sorted(DATA.glob("results_v*.json"))


def test_new_document_is_stamped_with_run_metadata():
    doc = new_document(
        sut={"target": "http://127.0.0.1:1", "pid": 7}, loadgen={"workers": 1}, clock=lambda: 0.0
    )
    assert doc["schema"] == SCHEMA == "harness.results/1"
    assert doc["harness_version"] == __version__
    assert doc["created"] == "1970-01-01T00:00:00Z"
    assert doc["verdict"] is None and doc["partial"] is False and doc["scenarios"] == []
    assert doc["sut"] == {"target": "http://127.0.0.1:1", "pid": 7}
    assert set(doc["machine"]) == {
        "host",
        "cpu_model",
        "governor",
        "cpu_count",
        "affinity",
        "python",
        "platform",
        "harness_version",
    }


def test_machine_metadata_describes_this_process():
    m = machine_metadata()
    assert m["cpu_count"] == os.cpu_count()
    assert m["affinity"] == sorted(os.sched_getaffinity(0))
    assert m["python"] == ".".join(map(str, sys.version_info[:3]))
    assert m["harness_version"] == __version__


def test_write_then_load_round_trips_and_cleans_numbers(tmp_path):
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append(
        {
            **scenario("s", 1.0),
            "x": float("nan"),
            "y": np.float64(2.5),
            "z": np.arange(3),
            "w": (1, float("inf")),
        }
    )
    path = write_document(tmp_path / "out" / "results.json", doc)
    loaded = load_document(path)
    sc = loaded["scenarios"][0]
    # JSON has no NaN/inf: they are written as null; numpy values as plain numbers.
    assert sc["x"] is None and sc["y"] == 2.5 and sc["z"] == [0, 1, 2] and sc["w"] == [1, None]
    assert "NaN" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp file left


def test_repeated_writes_replace_the_file_whole(tmp_path):
    path = tmp_path / "results.json"
    doc = new_document(machine=MACHINE)
    for i in range(5):
        doc["scenarios"].append(scenario(f"s{i}", 1.0))
        # A reader that opened the previous version keeps reading it whole: the writer
        # renames a new file over the path instead of truncating the old one.
        reader = path.open() if path.exists() else None
        write_document(path, doc)
        if reader is not None:
            with reader:
                assert len(json.loads(reader.read())["scenarios"]) == i
        assert len(load_document(path)["scenarios"]) == i + 1


def test_unserialisable_value_fails_before_touching_the_file(tmp_path):
    path = tmp_path / "results.json"
    write_document(path, new_document(machine=MACHINE))
    before = path.read_text()
    bad = new_document(machine=MACHINE)
    bad["scenarios"].append({"name": "s", "obj": object()})
    with pytest.raises(TypeError, match="not JSON"):
        write_document(path, bad)
    assert path.read_text() == before
    assert len(list(tmp_path.iterdir())) == 1


def test_a_killed_writer_leaves_a_loadable_document(tmp_path):
    """SIGKILL a process that rewrites results.json in a loop: the file is always whole."""
    path = tmp_path / "results.json"
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from harness.results import new_document, write_document
        from harness.testing.results import scenario
        doc = new_document()
        i = 0
        while True:
            doc["scenarios"].append({{**scenario(f"s{{i}}", 1.0), "pad": "x" * 20000}})
            write_document({str(path)!r}, doc)
            i += 1
            if i == 3:
                Path({str(ready)!r}).touch()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer never got going"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = load_document(path)
    assert len(doc["scenarios"]) >= 3
    assert doc["scenarios"][-1]["name"] == f"s{len(doc['scenarios']) - 1}"


@pytest.mark.malformed_results
@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ('{"scenarios": []}', r"no 'schema' key.*harness\.results/1"),
        (
            '{"schema": "harness.results/2", "scenarios": []}',
            r"'harness\.results/2'.*reads harness\.results/1.*newer harness",
        ),
        (
            '{"schema": "harness.results/0", "scenarios": []}',
            r"'harness\.results/0'.*reads harness\.results/1",
        ),
        (
            '{"schema": "pyperf/1.0", "scenarios": []}',
            r"'pyperf/1\.0', which is not a harness results document",
        ),
        (
            '{"schema": 1, "scenarios": []}',
            r"'schema' has value 1; expected 'harness\.results/<version>'",
        ),
        ("[1, 2]", r"top level is a list"),
        ('{"schema": "harness.results/1", "scenarios": {}}', r"'scenarios' has value \{\}"),
        (
            '{"schema": "harness.results/1", "scenarios": [{"checks": []}]}',
            r"scenarios\[0\].*expected an object with a 'name'",
        ),
        (
            '{"schema": "harness.results/1", "scenarios": [{"name": "a", "checks": [{"passed": true}]}]}',
            r"'checks'.*with an 'id'",
        ),
        (
            '{"schema": "harness.results/1", "scenarios": [], "verdict": "ok"}',
            r"'verdict' has value 'ok'",
        ),
        ('{"schema": "harness.results/1", "scen', r"not valid JSON.*line 1.*truncated"),
        ("", r"not valid JSON"),
    ],
)
def test_load_refuses_what_it_cannot_read(tmp_path, content, pattern):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(ResultFormatError, match=pattern) as info:
        load_document(path)
    assert str(path) in str(info.value)


def test_load_missing_file_says_what_to_point_at(tmp_path):
    with pytest.raises(ResultFormatError, match=r"does not exist.*harness run"):
        load_document(tmp_path / "nope" / "results.json")


def test_error_exit_code_is_usage():
    assert ResultFormatError.exit_code == 2


@pytest.mark.parametrize("path", GOLDEN_RESULTS, ids=lambda p: p.name)
def test_every_golden_results_file_loads(path):
    doc = load_document(path)
    version = int(re.search(r"_v(\d+)\.json$", path.name).group(1))
    assert version in READABLE_VERSIONS
    assert doc["schema"] == f"harness.results/{version}"
    assert [sc["name"] for sc in doc["scenarios"]] == [
        "steady_state",
        "contention",
        "linearity",
        "soak",
        "spike",
    ]


def test_there_is_a_golden_file_for_every_readable_version():
    versions = {int(re.search(r"_v(\d+)\.json$", p.name).group(1)) for p in GOLDEN_RESULTS}
    assert versions == set(READABLE_VERSIONS)


def _shape(obj):
    """Key structure and value types, not values (those depend on numpy's RNG stream)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return sorted({repr(_shape(v)) for v in obj})
    return (
        "number"
        if isinstance(obj, int | float) and not isinstance(obj, bool)
        else type(obj).__name__
    )


def test_golden_v1_has_the_factory_shape():
    """The factory builds documents shaped exactly like the golden file, with its checks."""
    golden = json.loads((DATA / "results_v1.json").read_text())
    built = json.loads(json.dumps(build_document()))
    assert _shape(golden) == _shape(built)
    fixed = ("id", "passed", "threshold", "op", "unit", "skipped")  # not the measured values
    assert [[{k: c[k] for k in fixed} for c in sc["checks"]] for sc in golden["scenarios"]] == [
        [{k: c[k] for k in fixed} for c in sc["checks"]] for sc in built["scenarios"]
    ]


def _keys(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _keys(v, f"{prefix}.{k}")
    elif isinstance(obj, list):
        for v in obj:
            yield from _keys(v, prefix)


def test_docs_describe_every_field_of_the_golden_document():
    doc = json.loads((DATA / "results_v1.json").read_text())
    text = (REPO / "docs" / "outputs.md").read_text()
    # Open-ended maps are data, not fields: the server's self-description, chaos action
    # parameters, class and stage names.
    del doc["sut"]["config"]
    for sc in doc["scenarios"]:
        for ev in sc["chaos"]:
            del ev["params"]
    data_keys = set(doc["scenarios"][0]["classes"]) | {
        s["name"] for sc in doc["scenarios"] for s in sc["stages"]
    }
    undocumented = sorted({k for k in _keys(doc) if k not in data_keys and f"`{k}`" not in text})
    assert not undocumented, f"docs/outputs.md does not mention: {undocumented}"


def _doc(name, verdict="pass", machine=None, sut=None, partial=False):
    doc = new_document(machine=machine or MACHINE, sut=sut or {"target": "t", "pid": 1})
    doc["scenarios"].append({"name": name, "checks": [], "verdict": verdict, "partial": partial})
    doc["verdict"] = verdict
    return doc


def test_merge_combines_scenarios_and_takes_the_worst_verdict():
    merged = merge_documents([_doc("a"), _doc("b", "fail"), _doc("c", "pass", partial=True)])
    assert [sc["name"] for sc in merged["scenarios"]] == ["a", "b", "c"]
    assert merged["verdict"] == "fail"
    assert merged["partial"] is True
    # a real failure is never hidden behind another scenario's invalid measurement
    assert (
        merge_documents([_doc("a"), _doc("b", "invalid"), _doc("c", "fail")])["verdict"] == "fail"
    )
    assert merge_documents([_doc("a"), _doc("b", None)])["verdict"] is None


def test_merge_keeps_a_differing_sut_on_its_scenarios():
    merged = merge_documents([_doc("a"), _doc("b", sut={"target": "t", "pid": 2})])
    assert merged["sut"] == {"target": "t", "pid": 1}
    assert "sut" not in merged["scenarios"][0]
    assert merged["scenarios"][1]["sut"] == {"target": "t", "pid": 2}


@pytest.mark.parametrize("field", ["cpu_count", "affinity", "python", "host", "harness_version"])
def test_merge_refuses_runs_from_different_machines(field):
    other = copy.deepcopy(MACHINE)
    other[field] = "different"
    with pytest.raises(
        ResultFormatError,
        match=rf"machine\.{field} is .* in merge input 0 but 'different' in merge input 1",
    ):
        merge_documents([_doc("a"), _doc("b", machine=other)])


def test_merge_validates_its_inputs():
    bad = _doc("a")
    bad["schema"] = "harness.results/9"
    with pytest.raises(ResultFormatError, match=r"merge input 1.*harness\.results/9"):
        merge_documents([_doc("a"), bad])
    with pytest.raises(ResultFormatError, match="no documents"):
        merge_documents([])


def test_combine_verdicts():
    assert combine_verdicts(["pass", "fail", "pass"]) == "fail"
    assert combine_verdicts(["fail", "invalid"]) == "fail"
    assert combine_verdicts(["pass", "invalid", "not_judged"]) == "invalid"
    assert combine_verdicts(["pass", "not_judged"]) == "not_judged"
    assert combine_verdicts(["pass", "pass"]) == "pass"
    assert combine_verdicts(["pass", None]) is None
    assert combine_verdicts([]) is None
    with pytest.raises(ResultFormatError, match="'maybe'"):
        combine_verdicts(["maybe"])
