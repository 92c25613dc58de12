"""Unit tests: config, faults parsing, priority mapping, the pure batch queue, models."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import numpy as np
import pytest

from harness_reference_server.batch_queue import BatchQueue, Pending, QueueFull
from harness_reference_server.batcher import BatchCap, Batcher, BatcherConfig
from harness_reference_server.config import ConfigError, ServerConfig, parse_config
from harness_reference_server.fault_catalog import FaultSet, parse_faults
from harness_reference_server.models import MLPModel, SimModel
from harness_reference_server.protocol import decode_json, priority_level


def item(level: int, t: float, n: int = 1) -> Pending:
    return Pending(np.zeros((n, 2), np.float32), level, t, None)


# -- config --------------------------------------------------------------------------


def test_config_defaults_and_flags() -> None:
    cfg = parse_config([])
    assert (cfg.model, cfg.max_batch_size, cfg.max_delay_ms, cfg.priority_levels) == (
        "mlp",
        32,
        5.0,
        2,
    )
    assert cfg.queue_capacity == 128 and cfg.workers == 1 and cfg.blas_threads == 1
    assert cfg.served_name == "mlp"
    cfg = parse_config(
        ["--model", "sim", "--model-name", "m", "--queue-size", "7", "--mlp-dims", "4,5,6"]
    )
    assert cfg.served_name == "m" and cfg.queue_capacity == 7 and cfg.mlp_dims == (4, 5, 6)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-batch-size", "0"], "--max-batch-size has value 0. Expected an integer >= 1"),
        (["--queue-size", "0"], "--queue-size has value 0"),
        (["--workers", "0"], "--workers has value 0"),
        (["--priority-levels", "0"], "--priority-levels has value 0"),
        (["--max-delay-ms", "-1"], "--max-delay-ms has value -1.0"),
        (["--mlp-dims", "5"], "--mlp-dims has value '5'"),
        (["--sim-dims", "1,2,3"], "--sim-dims has value '1,2,3'"),
        (["--fault", "bogus"], "--fault has value 'bogus'. Expected NAME[:PARAM] with NAME one of"),
        (
            ["--fault", "cross-wire:2"],
            "--fault has value 'cross-wire:2'. Expected cross-wire:P with 0 <= P <= 1",
        ),
        (["--fault", "leak-memory:x"], "leak-memory:BYTES_PER_REQUEST"),
        (["--fault", "stall:1,2"], "0 < HOLD_S < PERIOD_S"),
        (["--fault", "no-batching:3"], "no-batching without a parameter"),
    ],
)
def test_config_errors_name_flag_value_and_valid(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(argv)
    assert needle in str(exc.value)


def test_bad_dims_type_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["--mlp-dims", "a,b"])
    assert exc.value.code == 2
    assert "--mlp-dims has value 'a,b'" in capsys.readouterr().err


def test_fault_defaults_and_names() -> None:
    f = parse_faults(
        [
            "leak-memory",
            "leak-threads",
            "leak-fds:7",
            "cross-wire",
            "slow-start",
            "stall",
            "no-batching",
            "unbounded-queue",
            "ignore-priority",
        ]
    )
    assert f.names() == [
        "leak-memory:4096",
        "leak-threads:100",
        "leak-fds:7",
        "no-batching",
        "unbounded-queue",
        "ignore-priority",
        "cross-wire:0.05",
        "slow-start:5",
        "stall:10,0.5",
    ]
    assert not FaultSet() and f
    assert ServerConfig(faults=f).faults.stall == (10.0, 0.5)


# -- priority -----------------------------------------------------------------------


def test_priority_levels_follow_triton() -> None:
    # 1 = highest; 0, absent or above the number of levels = default = lowest level.
    assert [priority_level(p, 2) for p in (0, 1, 2, 3, 99)] == [1, 0, 1, 1, 1]
    assert [priority_level(p, 3) for p in (0, 1, 2, 3, 4)] == [2, 0, 1, 2, 2]
    assert priority_level(1, 1) == 0 and priority_level(0, 1) == 0


# -- batch queue --------------------------------------------------------------------


def test_queue_rejects_at_capacity_per_level() -> None:
    q = BatchQueue(levels=2, capacity=2)
    assert q.offer(item(1, 0)) and q.offer(item(1, 1))
    assert not q.offer(item(1, 2))
    assert q.offer(item(0, 3))  # the other level has its own bound
    assert (q.depth(0), q.depth(1), q.live) == (1, 2, 3)
    unbounded = BatchQueue(levels=1, capacity=1, bounded=False)
    assert all(unbounded.offer(item(0, t)) for t in range(10))


def test_take_serves_high_priority_first_and_respects_max_rows() -> None:
    q = BatchQueue(levels=2, capacity=10)
    low = [item(1, t) for t in range(3)]
    high = [item(0, 10 + t, n=2) for t in range(2)]
    for x in low + high:
        q.offer(x)
    assert q.oldest() == 0
    batch = q.take(max_rows=5)
    assert batch == [high[0], high[1], low[0]]
    assert q.live == 2 and q.live_rows == 2
    assert q.take(max_rows=10, max_requests=1) == [low[1]]


def test_take_stops_at_a_request_that_does_not_fit() -> None:
    q = BatchQueue(levels=1, capacity=10)
    a, b, c = item(0, 0, n=3), item(0, 1, n=3), item(0, 2, n=1)
    for x in (a, b, c):
        q.offer(x)
    assert q.take(max_rows=4) == [a]  # FIFO: c does not jump over b


def test_arrival_order_ignores_levels_when_forming_batches() -> None:
    # fault fifo-dispatch: bounds stay per level, batches follow arrival time
    q = BatchQueue(levels=2, capacity=2)
    low = [item(1, t) for t in (0, 1)]
    high = item(0, 5)
    for x in (*low, high):
        assert q.offer(x)
    assert not q.offer(item(1, 6)) and q.offer(item(0, 7))  # admission still per level
    assert q.take(max_rows=3, arrival_order=True) == [low[0], low[1], high]


def test_a_cap_below_a_request_still_takes_that_request() -> None:
    q = BatchQueue(levels=1, capacity=4)
    big, small = item(0, 0, n=4), item(0, 1)
    q.offer(big)
    q.offer(small)
    assert q.take(max_rows=1) == [big]  # never stranded by a collapsed cap
    assert q.take(max_rows=1) == [small]


def test_batch_cap_halves_on_overflow_and_regains_a_slot_per_grow_s() -> None:
    cap = BatchCap(32, grow_s=1.0, cooldown_s=0.1)
    assert cap.value(0.0) == 32
    cap.overflow(10.0)
    assert cap.value(10.0) == 16
    cap.overflow(10.05)  # within the cooldown: one overflow burst is one cut
    assert cap.value(10.05) == 16 and cap.cuts == 1
    for k in range(4):
        cap.overflow(10.2 + 0.2 * k)
    assert cap.value(10.8) == 1  # 16 -> 8 -> 4 -> 2 -> 1, never 0
    assert cap.value(13.8) == 4  # three slots regained in three seconds
    cap.overflow(13.8)
    assert cap.value(13.8) == 2  # a new overflow halves the regrown cap
    assert cap.value(13.8 + 100) == 32  # regrows to the limit, not past it


def test_discard_is_lazy_and_keeps_counts() -> None:
    q = BatchQueue(levels=1, capacity=2)
    a, b = item(0, 0), item(0, 1)
    q.offer(a)
    q.offer(b)
    assert q.discard(a) and not q.discard(a)
    assert q.depth(0) == 1 and q.oldest() == 1
    assert q.offer(item(0, 2))  # the discarded slot is free again
    assert q.take(max_rows=10)[0] is b


# -- batcher on a loop ------------------------------------------------------------------


def test_batcher_forms_batches_and_splits_outputs() -> None:
    calls: list[int] = []

    def run(x: np.ndarray) -> np.ndarray:
        calls.append(x.shape[0])
        return x * 2

    async def main() -> list[np.ndarray]:
        b = Batcher(run, BatcherConfig(max_batch_size=8, max_delay_s=0.05, levels=1, capacity=8))
        await b.start()
        futs = [b.submit(np.full((1, 2), i, np.float32), 0, None) for i in range(4)]
        with pytest.raises(QueueFull):
            for _ in range(10):
                b.submit(np.zeros((1, 2), np.float32), 0, None)
        out = await asyncio.gather(*futs)
        await b.stop()
        return out

    out = asyncio.run(main())
    assert [float(o[0, 0]) for o in out] == [0.0, 2.0, 4.0, 6.0]
    assert calls[0] == 8  # all queued requests went in one batch


def test_cross_wire_swaps_outputs_in_a_batch() -> None:
    async def main() -> list[np.ndarray]:
        cfg = BatcherConfig(
            max_batch_size=4, max_delay_s=0.05, levels=1, capacity=4, cross_wire_p=1.0
        )
        b = Batcher(lambda x: x.copy(), cfg)
        await b.start()
        futs = [b.submit(np.full((1, 2), i, np.float32), 0, None) for i in range(4)]
        out = await asyncio.gather(*futs)
        await b.stop()
        assert b.cross_wired_batches == 1
        return out

    out = asyncio.run(main())
    mismatched = [i for i, o in enumerate(out) if float(o[0, 0]) != i]
    assert len(mismatched) == 2


# -- models ---------------------------------------------------------------------------


def test_mlp_is_deterministic_and_batch_invariant() -> None:
    a, b = MLPModel("m", (8, 32, 4), seed=3), MLPModel("m", (8, 32, 4), seed=3)
    x = np.random.default_rng(0).standard_normal((5, 8), dtype=np.float32)
    ya = a.predict(x)
    np.testing.assert_array_equal(ya, b.predict(x))
    np.testing.assert_allclose(a.predict(x[2:3]), ya[2:3], rtol=1e-5, atol=1e-6)
    assert not np.allclose(MLPModel("m", (8, 32, 4), seed=4).predict(x), ya)


def test_mlp_weights_are_generated_once_then_read_from_their_file(tmp_path, monkeypatch) -> None:
    from harness_reference_server import models

    monkeypatch.setenv(models.WEIGHTS_ENV, str(tmp_path))
    x = np.random.default_rng(0).standard_normal((3, 8), dtype=np.float32)
    first = MLPModel("m", (8, 32, 4), seed=3)
    y = first.predict(x)
    (kept,) = tmp_path.iterdir()
    assert kept == models.weight_file((8, 32, 4), 3)

    def never(self):
        raise AssertionError("generated again although the file holds them")

    monkeypatch.setattr(MLPModel, "_generate", never)
    np.testing.assert_array_equal(MLPModel("m", (8, 32, 4), seed=3).predict(x), y)
    monkeypatch.undo()
    monkeypatch.setenv(models.WEIGHTS_ENV, str(tmp_path))
    # another seed or shape is another file; a file that is not whole is generated again
    assert models.weight_file((8, 32, 4), 4) != kept != models.weight_file((8, 16, 4), 3)
    kept.write_bytes(kept.read_bytes()[:100])
    np.testing.assert_array_equal(MLPModel("m", (8, 32, 4), seed=3).predict(x), y)
    assert models._read_layers(kept, (8, 32, 4)) is not None  # rewritten whole
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # no temporary file left


def test_mlp_weights_are_kept_nowhere_when_turned_off(tmp_path, monkeypatch) -> None:
    from harness_reference_server import models

    monkeypatch.setenv(models.WEIGHTS_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    MLPModel("m", (8, 32, 4), seed=3).load()
    assert models.weight_file((8, 32, 4), 3) is None and not any(tmp_path.iterdir())


def test_sim_costs_base_plus_item_and_outputs_depend_on_input() -> None:
    slept: list[float] = []
    m = SimModel("s", (4, 2), base_ms=15, item_ms=0.5, seed=0, sleep=slept.append)
    y = m.predict(np.eye(4, dtype=np.float32))
    assert slept == [pytest.approx(0.017)]
    assert y.shape == (4, 2) and len({tuple(r) for r in y.round(4)}) == 4


def test_hold_open_window_counts_from_when_a_worker_is_free() -> None:
    now = [0.0]
    b = Batcher(
        lambda x: x,
        BatcherConfig(max_batch_size=4, max_delay_s=0.005, levels=1),
        clock=lambda: now[0],
    )
    b.peak_last_cycle = 4  # the previous cycle held four requests: company is expected
    assert b._wait_s(now[0]) is None  # nothing queued
    b.queue.offer(item(0, 0.0))
    now[0] = 0.001
    assert b._wait_s(now[0]) == pytest.approx(0.004)  # oldest arrived at 0: 4 ms left
    now[0] = 0.006
    assert b._wait_s(now[0]) == 0.0  # its 5 ms are up
    b._busy = 1
    assert b._wait_s(now[0]) is None  # no free worker: waiting for a worker, not company
    b._busy, b._worker_free_since = 0, 0.010
    now[0] = 0.011
    assert b._wait_s(now[0]) == pytest.approx(0.004)  # held open 5 ms after the worker freed
    for t in range(3):
        b.queue.offer(item(0, 0.011 + t))
    assert b._wait_s(now[0]) == 0.0  # a full batch goes at once


def test_a_partial_batch_goes_at_once_when_nobody_else_is_expected() -> None:
    now = [0.0]
    b = Batcher(
        lambda x: x,
        BatcherConfig(max_batch_size=8, max_delay_s=0.005, levels=2),
        clock=lambda: now[0],
    )
    b.queue.offer(item(1, 0.0))
    assert b._wait_s(now[0]) == 0.0  # no previous cycle: a first request never waits
    b.peak_last_cycle = 1
    assert b._wait_s(now[0]) == 0.0  # one request was all the previous cycle held
    b.peak_last_cycle = 3
    assert b._wait_s(now[0]) == pytest.approx(0.005)  # two more may come: held open
    b.queue.offer(item(0, 0.0))
    b.computing = 1  # a second worker computes one of the three
    assert b._wait_s(now[0]) == 0.0  # queued + computing = 3: everyone is here
    b.computing = 0
    b.config = BatcherConfig(max_batch_size=8, max_delay_s=0.005, levels=2, workers=2)
    b._busy = 1
    assert b._wait_s(now[0]) == pytest.approx(0.005)  # one worker free, one request missing
    b._busy = 2
    assert b._wait_s(now[0]) is None  # no worker free: the batch grows while it waits


def test_closed_loop_clients_never_wait_for_company_that_is_not_coming() -> None:
    """C clients that resubmit as soon as they are answered: once the batcher has seen
    them all, each round's batch is all C and goes without the (here 1 s) delay; when
    only one client is left, its requests wait for the others at most twice."""
    sizes: list[int] = []

    def run(x: np.ndarray) -> np.ndarray:
        sizes.append(x.shape[0])
        return x

    async def client(b: Batcher, rounds: int) -> list[float]:
        waits = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            await b.submit(np.zeros((1, 2), np.float32), 0, None)
            waits.append(time.perf_counter() - t0)
        return waits

    async def main() -> tuple[float, list[float]]:
        b = Batcher(run, BatcherConfig(max_batch_size=8, max_delay_s=1.0, levels=1))
        await b.start()
        try:
            t0 = time.perf_counter()
            await asyncio.gather(*(client(b, 5) for _ in range(3)))
            three = time.perf_counter() - t0
            b.config = dataclasses.replace(b.config, max_delay_s=0.05)
            alone = await client(b, 5)
        finally:
            await b.stop()
        return three, alone

    three, alone = asyncio.run(main())
    assert sizes[:5] == [3] * 5  # every round of three went as one batch ...
    assert three < 0.5  # ... at once: a 1 s wait in any round would show
    assert sizes[5:] == [1] * 5
    assert all(w >= 0.04 for w in alone[:2])  # the recent peak of three: held open
    assert all(w < 0.04 for w in alone[2:])  # two cycles later: alone, and goes at once


def test_infer_path_parsing() -> None:
    from harness_reference_server.app import _infer_model_name

    assert _infer_model_name("/v2/models/mlp/infer") == "mlp"
    assert _infer_model_name("/v2/models/mlp/versions/1/infer") == "mlp"
    for path in (
        "/v2/models//infer",
        "/v2/models/a/b/infer",
        "/v2/models/mlp/versions//infer",
        "/v2/models/mlp",
        "/v3/models/m/infer",
    ):
        assert _infer_model_name(path) is None, path


def test_blas_threads_pinned_before_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness_reference_server.__main__ import _pin_blas_threads

    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _pin_blas_threads([]) == ["--blas-threads", "1"]
    import os

    assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "3"
    assert _pin_blas_threads(["--blas-threads", "2"]) == ["--blas-threads", "2"]
    assert os.environ["OPENBLAS_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "2"


def test_leak_memory_every_n_requests_retains_one_block_per_n() -> None:
    """leak-memory:BYTES,EVERY sizes a slow leak independent of the per-object overhead:
    4096 B every 125th request at 90 req/s is ~10 MiB/h."""
    from harness_reference_server.faults import FaultRuntime

    f = parse_faults(["leak-memory:4096,125"])
    assert f.names() == ["leak-memory:4096,125"]
    rt = FaultRuntime(f)
    for _ in range(1000):
        rt.on_request()
    assert rt.retained_bytes == 8 * 4096
    assert parse_faults(["leak-memory:100"]).names() == ["leak-memory:100"]
    for bad in ("leak-memory:1,0", "leak-memory:1,2,3", "leak-memory:1,x"):
        with pytest.raises(ConfigError, match="EVERY_N_REQUESTS"):
            parse_faults([bad])


def test_every_fault_name_round_trips_through_its_canonical_string() -> None:
    specs = [
        "leak-memory:4096,170",
        "leak-threads:100",
        "leak-fds:7",
        "no-batching",
        "unbounded-queue",
        "ignore-priority",
        "cross-wire:0.03",
        "slow-start:2.5",
        "stall:8,0.6",
        "late-leak:2048,30",
        "stale-output:0.02",
        "error-rate:0.05",
        "serialize",
        "slowdown:20",
        "fifo-dispatch",
        "backoff-batching:1",
        "cold-errors:10",
    ]
    f = parse_faults(specs)
    assert f.names() == specs
    assert parse_faults(f.names()) == f


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"a","inputs":[{"data":[0.25,-1e-7,3,1.7976931348623157e308]}]}',
        b'{"a":1,"a":2}',  # duplicate keys: the last one wins
        b"[1e400, -1e400]",  # overflows to infinity in json, rejected by orjson
        b"[NaN, Infinity, -Infinity]",
        b"18446744073709551616",  # beyond 64 bits: json keeps the integer
        b"-9223372036854775809",
        b'{"timeout": 123456789012345678901234567890}',
        b"[12345678901234567890.5, 0.00012345678901234567891]",  # 19+ digits, not integers
        b'"\\ud800"',  # a lone surrogate
        b"\xef\xbb\xbf{}",  # UTF-8 BOM
        '{"x": 1}'.encode("utf-16-le"),
        b"[" * 2000 + b"]" * 2000,  # deeper than orjson goes
        b"",
        b"{",
        b'{"a": 1,}',
        b"\xff",
        b"[1, 2] x",
    ],
)
def test_decode_json_gives_what_json_loads_gives(body: bytes) -> None:
    """Same value (types and float bits included) or the same exception and message."""

    def outcome(decode: Any) -> tuple[Any, ...]:
        try:
            value = decode(body)
        except Exception as exc:  # the exception is the outcome compared
            return type(exc), str(exc)
        return "ok", repr(value), json.dumps(value, default=str)

    assert outcome(decode_json) == outcome(json.loads)


def test_decode_json_agrees_with_json_loads_on_random_numbers() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(2000).astype(np.float32).astype(np.float64),
            rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000),
            rng.integers(-(2**62), 2**62, 2000).astype(np.float64),
        ]
    )
    texts = [repr(float(v)) for v in values] + [f"{v:.25e}" for v in values[:2000]]
    texts += [str(int(v)) for v in values[4000:]]
    body = ("[" + ",".join(texts) + "]").encode()
    got, want = decode_json(body), json.loads(body)
    assert [(type(x), repr(x)) for x in got] == [(type(x), repr(x)) for x in want]
