"""The reference server's failing-request faults for the soak and integrity checks:
late-errors (a server that stops serving after a while) and batch-errors (a batched code
path that raises while batch 1 works). Unit tests on the fault runtime, no server."""

from __future__ import annotations

import numpy as np
import pytest

from harness_reference_server.errors import ConfigError
from harness_reference_server.fault_catalog import parse_faults
from harness_reference_server.faults import FaultRuntime, ModelFault


def batch(n: int) -> list:
    return [np.full((1, 4), i, np.float32) for i in range(n)]


def test_params_defaults_and_errors() -> None:
    assert parse_faults(["late-errors", "batch-errors"]).names() == [
        "late-errors:30,1",
        "batch-errors:2",
    ]
    assert parse_faults(["late-errors:20"]).late_errors == (20.0, 1.0)
    assert parse_faults(["late-errors:0,0.25"]).late_errors == (0.0, 0.25)
    assert parse_faults(["batch-errors:3"]).batch_errors_min == 3
    late = "Expected late-errors:AFTER_S[,P] with AFTER_S >= 0 and 0 <= P <= 1."
    least = "Expected batch-errors:MIN_BATCH, MIN_BATCH >= 2."
    for spec, expected in [
        ("late-errors:-1", late),
        ("late-errors:10,1.5", late),
        ("late-errors:10,nan", late),
        ("late-errors:1,2,3", late),
        ("batch-errors:1", least),
        ("batch-errors:x", least),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_faults([spec])
        assert str(exc.value) == f"--fault has value {spec!r}. {expected}"


def test_late_errors_fail_every_request_from_after_s_after_ready() -> None:
    now = [100.0]
    rt = FaultRuntime(parse_faults(["late-errors:20"]), now=lambda: now[0])
    assert rt.rewrites_outputs
    outputs = batch(4)
    rt.after_batch(outputs)
    assert not any(isinstance(o, ModelFault) for o in outputs)  # not ready: not yet
    rt.mark_ready()
    now[0] = 119.0
    outputs = batch(4)
    rt.after_batch(outputs)
    assert not any(isinstance(o, ModelFault) for o in outputs)
    now[0] = 120.0
    for n in (1, 4):
        outputs = batch(n)
        rt.after_batch(outputs)
        assert all(isinstance(o, ModelFault) for o in outputs)
    assert rt.failed_answers == 5
    assert "late-errors:20,1" in str(outputs[0])


def test_late_errors_at_p_fail_a_reproducible_share() -> None:
    def pattern(seed: int) -> list[bool]:
        rt = FaultRuntime(parse_faults(["late-errors:0,0.5"]), now=lambda: 0.0, seed=seed)
        rt.mark_ready()
        failed = []
        for _ in range(10):
            outputs = batch(8)
            rt.after_batch(outputs)
            failed += [isinstance(o, ModelFault) for o in outputs]
        return failed

    first = pattern(0)
    assert 15 <= sum(first) <= 65  # 80 draws at P = 0.5
    assert pattern(0) == first and pattern(1) != first


def test_batch_errors_fail_whole_batches_of_min_batch_or_more() -> None:
    rt = FaultRuntime(parse_faults(["batch-errors:2"]))
    assert rt.rewrites_outputs
    one = batch(1)
    kept = one[0]
    rt.after_batch(one)
    assert one[0] is kept  # batch 1 (the golden fetch, a lone request) answered
    for n in (2, 8):
        outputs = batch(n)
        rt.after_batch(outputs)
        assert all(isinstance(o, ModelFault) for o in outputs)
    assert rt.failed_answers == 10
    three = FaultRuntime(parse_faults(["batch-errors:3"]))
    outputs = batch(2)
    three.after_batch(outputs)
    assert not any(isinstance(o, ModelFault) for o in outputs)
