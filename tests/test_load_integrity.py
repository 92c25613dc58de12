"""Integrity classification on synthetic golden outputs, and answer parsing."""

from __future__ import annotations

import json
import random

import pytest

from harness.load.integrity import build_golden, golden_from_wire, golden_to_wire
from harness.protocols import BadResponse
from harness.protocols.kserve_v2 import flatten, parse_answer


def _outputs(n: int = 16, dim: int = 10, seed: int = 3) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(-5, 5) for _ in range(dim)] for _ in range(n)]


def test_own_output_is_ok_even_with_small_batching_noise() -> None:
    outs = _outputs()
    g = build_golden(outs)
    noisy = [v + 1e-6 for v in outs[4]]
    assert g.classify(4, noisy).kind == "ok"


def test_another_inputs_output_is_cross_wired() -> None:
    outs = _outputs()
    g = build_golden(outs)
    v = g.classify(4, [x + 1e-7 for x in outs[9]])
    assert v.kind == "cross_wired" and v.matched == 9


def test_own_output_beyond_tolerance_is_drift() -> None:
    outs = _outputs()
    g = build_golden(outs)
    shifted = [x + 0.05 for x in outs[2]]
    assert g.classify(2, shifted).kind == "drift"
    assert g.classify(2, outs[2][:-1]).kind == "drift"  # wrong length
    assert g.classify(2, ["a"] * 10).kind == "drift"


def test_tolerance_widens_for_a_nondeterministic_server() -> None:
    outs = _outputs()
    tight = build_golden(outs).tolerance
    again = [x + 1e-3 for x in outs[0]]
    loose = build_golden(outs, repeats=[(0, again)]).tolerance
    assert loose >= 10 * 1e-3 * 0.999 > tight


def test_indistinguishable_inputs_are_twins_not_cross_wires() -> None:
    outs = _outputs(8)
    outs[5] = list(outs[3])  # two inputs with the same answer
    g = build_golden(outs)
    assert g.distinct == 6
    assert g.classify(3, outs[5]).kind == "ok"
    assert g.classify(0, outs[5]).kind == "cross_wired"


def test_non_numeric_outputs_compare_exactly() -> None:
    outs = [["cat"], ["dog"], ["eel"]]
    g = build_golden(outs)
    assert g.classify(0, ["cat"]).kind == "ok"
    assert g.classify(0, ["dog"]).kind == "cross_wired"
    assert g.classify(0, ["cow"]).kind == "drift"


def test_golden_survives_the_wire() -> None:
    g = build_golden(_outputs())
    again = golden_from_wire(json.loads(json.dumps(golden_to_wire(g))))
    assert again.tolerance == g.tolerance
    assert again.classify(7, g.outputs[7]).kind == "ok"
    assert again.classify(7, g.outputs[1]).kind == "cross_wired"


def test_parse_answer_flattens_and_orders_outputs() -> None:
    body = json.dumps(
        {
            "id": "42",
            "outputs": [
                {"name": "b", "shape": [1, 2], "datatype": "FP32", "data": [[3.0, 4.0]]},
                {"name": "a", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]},
            ],
        }
    ).encode()
    rid, values = parse_answer(body)
    assert rid == "42" and values == (1.0, 2.0, 3.0, 4.0)
    assert flatten([[[1], [2]], [[3], [4]]]) == [1, 2, 3, 4]


@pytest.mark.parametrize("body", [b"not json", b'{"outputs": []}', b'{"error": "x"}', b"[1]"])
def test_parse_answer_rejects_non_v2_bodies(body: bytes) -> None:
    with pytest.raises(BadResponse):
        parse_answer(body)


# -- golden fetch against a real server ---------------------------------------------------


def _sim_pool(port: int, n: int):
    from harness.load.payloads import ClassParams, PayloadPool
    from harness.protocols.kserve_v2 import InputSpec, generate_inputs

    inputs = generate_inputs([InputSpec("input", "FP32", (1, 16))], n, seed=3)
    return PayloadPool(
        "127.0.0.1", port, "/v2/models/sim/infer", inputs, [ClassParams("default", 0, None)]
    )


@pytest.mark.slow
def test_golden_fetch_retries_a_transient_5xx() -> None:
    from harness.load.target import fetch_golden
    from harness.testing.server import start_server

    pauses: list[float] = []
    # error-rate answers 500 for 20 % of requests (seeded, so the same ones every run)
    with start_server("--model", "sim", "--sim-base-ms", "0", "--fault", "error-rate:0.2") as srv:
        golden = fetch_golden(_sim_pool(srv.port, 24), "127.0.0.1", srv.port, 5.0, pauses.append)
    assert len(golden.outputs) == 24
    assert pauses and pauses[0] == 0.1  # some 500s were retried, after a short pause


@pytest.mark.slow
def test_golden_fetch_gives_up_on_a_server_that_keeps_failing() -> None:
    from harness.errors import TargetUnavailable
    from harness.load.target import GOLDEN_TRIES, fetch_golden
    from harness.testing.server import start_server

    pauses: list[float] = []
    with (
        start_server("--model", "sim", "--sim-base-ms", "0", "--fault", "error-rate:1") as srv,
        pytest.raises(TargetUnavailable, match=r"HTTP 500 .*\(4 tries\).*--no-verify"),
    ):
        fetch_golden(_sim_pool(srv.port, 4), "127.0.0.1", srv.port, 5.0, pauses.append)
    assert len(pauses) == GOLDEN_TRIES - 1


def test_kept_golden_outputs_are_reused_as_such_only_for_the_same_server_process(tmp_path) -> None:
    """``--golden-cache``: a peak search's points all run against one server; the second
    point on reuses the golden outputs the first fetched (each fetch is 136 single
    requests, 1-4 s on a batching server). Reused as they are only when the server
    *process* is the same one: a restarted server on the same port, other inputs, or a
    process this host cannot see (no pid) do not match its key (another process of the
    same model is checked first: the next test)."""
    from harness.load.target import fetch_golden, golden_key, keep_golden, kept_golden
    from harness.testing.server import start_server

    path = tmp_path / "golden.json"
    with start_server("--model", "sim", "--sim-base-ms", "0") as srv:
        url = f"http://127.0.0.1:{srv.port}"
        pool = _sim_pool(srv.port, 12)
        key = golden_key(pool, url, "sim", srv.pid)
        assert key is not None and key["pid"] == srv.pid
        assert kept_golden(path, key) is None  # nothing kept yet
        golden = fetch_golden(pool, "127.0.0.1", srv.port, 5.0)
        keep_golden(path, key, golden)
        again = kept_golden(path, golden_key(pool, url, "sim", srv.pid))
        assert again is not None
        assert again.outputs == golden.outputs and again.tolerance == golden.tolerance
        # other inputs on the same server: fetched anew
        assert kept_golden(path, golden_key(_sim_pool(srv.port, 13), url, "sim", srv.pid)) is None
        # no pid (a server on another host): never kept, never reused
        assert golden_key(pool, url, "sim", None) is None
        keep_golden(tmp_path / "none.json", None, golden)
        assert not (tmp_path / "none.json").exists()
    # everything else the same, another server process (a restart): not its own outputs
    with start_server("--model", "sim", "--sim-base-ms", "0") as srv2:
        new_key = golden_key(pool, url, "sim", srv2.pid)
        assert new_key is not None and kept_golden(path, new_key) is None
        assert {k: v for k, v in new_key.items() if k not in ("pid", "started")} == {
            k: v for k, v in key.items() if k not in ("pid", "started")
        }


def test_a_golden_from_another_process_of_the_model_is_reused_only_once_it_still_holds(
    tmp_path,
) -> None:
    """The next scenario's server (a new process of the same model): the kept golden of
    the same model and pool is reused once its first inputs, asked again one at a time,
    each get their kept output; a server of other weights (another seed), one that
    answers errors, or another pool does not get it."""
    from harness.load import target
    from harness.testing.server import start_server

    path = tmp_path / "golden.json"
    meta = {"name": "sim", "platform": "simulated"}
    with start_server("--model", "sim", "--sim-base-ms", "0") as srv:
        pool = _sim_pool(srv.port, 12)
        content = target.golden_content_key(pool, "sim", meta)
        golden = target.fetch_golden(pool, "127.0.0.1", srv.port, 5.0)
        key = target.golden_key(pool, f"http://127.0.0.1:{srv.port}", "sim", srv.pid)
        target.keep_golden(path, key, golden, content)
    with start_server("--model", "sim", "--sim-base-ms", "0") as same:
        pool = _sim_pool(same.port, 12)
        assert target.golden_content_key(pool, "sim", meta) == content  # port aside
        kept = target.kept_golden_of_model(path, content)
        assert kept is not None and kept.outputs == golden.outputs
        assert target.golden_still_holds(kept, pool, "127.0.0.1", same.port, 5.0)
        # other inputs, or the model's metadata changed: nothing kept for them
        assert (
            target.kept_golden_of_model(
                path, target.golden_content_key(_sim_pool(same.port, 13), "sim", meta)
            )
            is None
        )
        assert (
            target.kept_golden_of_model(
                path, target.golden_content_key(pool, "sim", {**meta, "versions": ["2"]})
            )
            is None
        )
    with start_server("--model", "sim", "--sim-base-ms", "0", "--seed", "1") as other:
        pool = _sim_pool(other.port, 12)
        assert not target.golden_still_holds(kept, pool, "127.0.0.1", other.port, 5.0)
    with start_server("--model", "sim", "--fault", "error-rate:1.0") as failing:
        pool = _sim_pool(failing.port, 12)
        assert not target.golden_still_holds(kept, pool, "127.0.0.1", failing.port, 5.0)


def test_a_golden_file_keeps_one_entry_per_model_and_pool_the_newest_first(tmp_path) -> None:
    from harness.load import target

    path = tmp_path / "golden.json"
    goldens = [build_golden([[float(i), float(k)] for i in range(4)]) for k in range(12)]
    for k, g in enumerate(goldens):
        target.keep_golden(path, {"pid": k}, g, {"pool": str(k % 10)})
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == target.GOLDEN_KEPT
    assert [e["content"]["pool"] for e in entries[:3]] == ["1", "0", "9"]
    # pools 0 and 1 were kept again: only their newest entries remain
    assert target.kept_golden_of_model(path, {"pool": "1"}).outputs == goldens[11].outputs
    assert target.kept_golden(path, {"pid": 1}) is None
    assert target.kept_golden(path, {"pid": 11}).outputs == goldens[11].outputs
    path.write_text("{not json")
    assert target.kept_golden_of_model(path, {"pool": "1"}) is None  # fetched anew


def test_own_distance_agrees_with_classify_and_refuses_what_is_not_a_number() -> None:
    """The numpy-free check of the common case: within τ of its own golden output → the
    distance; anything else (NaN, inf, a bool, a string, a huge int, another length) →
    None, and classify then judges it exactly as before."""
    outs = [[float(i), float(i) * 2, 0.5] for i in range(8)]
    g = build_golden(outs)
    assert g.own_distance(3, [3.0, 6.0, 0.5]) == 0.0
    close = [3.0 + g.tolerance / 2, 6.0, 0.5]
    assert g.own_distance(3, close) == pytest.approx(g.tolerance / 2)
    assert g.classify(3, close).kind == "ok"
    for wrong in (
        [float("nan"), 6.0, 0.5],
        [3.0, float("inf"), 0.5],
        [True, 6.0, 0.5],
        ["3", 6.0, 0.5],
        [10**400, 6.0, 0.5],
        [3.0, 6.0],
        outs[4],
    ):
        assert g.own_distance(3, wrong) is None
    assert g.classify(3, [float("nan"), 6.0, 0.5]).kind == "drift"
    assert g.classify(3, outs[4]).kind == "cross_wired"
    assert g.classify(3, [10**400, 6.0, 0.5]).kind == "drift"  # not an exception
    assert g.classify(3, [3, 6, 0.5]).kind == "ok"  # ints are numbers
