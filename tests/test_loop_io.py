"""A disk that makes a write wait must not hold the load generator's gevent loop.

Every send of the open-loop schedule is a greenlet of one loop; a blocking call on that
loop delays them all, and the dispatch-lag rule then (rightly) refuses the run. On this
VM's ext4 disk the rename that replaces ``progress.json`` was measured waiting 0.4-0.7 s
(py-spy on a network run whose dispatch lag jumped by that much): the harness's own file
writes during the load go through gevent's native threadpool. These tests slow the
rename down on purpose and time a greenlet that should tick every 10 ms meanwhile; the
control does the same write on the loop and shows the stall the test would catch.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import gevent.monkey
import pytest

from harness.agent.client import RemoteSampler
from harness.load import controller
from harness.load.controller import HarnessState, replace_text

SLOW_S = 0.3  # the rename's wait, in the range measured on the VM's disk
TICK_S = 0.01


def _slow_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.replace waits SLOW_S in the kernel, as a rename behind a busy journal does
    (a native sleep: it holds whichever thread calls it, as the syscall would)."""
    native_sleep = gevent.monkey.get_original("time", "sleep")
    real_replace = os.replace

    def slow_replace(src: Any, dst: Any) -> None:
        native_sleep(SLOW_S)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", slow_replace)


def _worst_tick_delay(work: gevent.Greenlet, span_s: float) -> float:
    """Tick every TICK_S for ``span_s`` beside ``work``; the worst lateness of a tick."""
    worst = 0.0
    end = time.perf_counter() + span_s
    while time.perf_counter() < end:
        before = time.perf_counter()
        gevent.sleep(TICK_S)
        worst = max(worst, time.perf_counter() - before - TICK_S)
    work.join(timeout=5)
    return worst


ATTEMPTS = 3


def _off_loop_delay(spawn: Callable[[int], gevent.Greenlet], span_s: float) -> float:
    """The worst tick delay beside a fresh ``spawn(attempt)``, the least of up to ATTEMPTS
    windows (stopping at the first under SLOW_S / 3). A write on the loop stalls it by
    SLOW_S in every window; a box busy with other work (CI's fast tier runs beside package
    installs, two tests at a time on 2 cores) can leave a thread off-CPU for a quarter
    of a second in one window, not in three."""
    delays = []
    for attempt in range(ATTEMPTS):
        delays.append(_worst_tick_delay(spawn(attempt), span_s))
        if delays[-1] < SLOW_S / 3:
            break
    return min(delays)


def test_progress_is_written_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_disk(monkeypatch)
    monkeypatch.setattr(controller, "PROGRESS_EVERY_S", 0.05)
    workers: list[gevent.Greenlet] = []

    def spawn(attempt: int) -> gevent.Greenlet:
        (tmp_path / str(attempt)).mkdir()
        writes = iter(range(3))
        state = SimpleNamespace(
            out_dir=tmp_path / str(attempt),
            progress=lambda: {"elapsed_s": 1.0},
            _collecting=lambda: next(writes, None) is not None,
        )
        workers.append(gevent.spawn(HarnessState._write_progress, state))
        return workers[-1]

    # control, same conditions: the same write on the loop
    control = gevent.spawn(replace_text, tmp_path / "control.json", "{}")
    on_loop = _worst_tick_delay(control, 2 * SLOW_S)
    off_loop = _off_loop_delay(spawn, 3 * SLOW_S + 0.3)
    assert on_loop >= 0.8 * SLOW_S, on_loop  # the stall the test exists to catch
    assert off_loop < SLOW_S / 3, (off_loop, on_loop)
    assert all(w.successful() for w in workers), [w.exception for w in workers]
    for attempt in range(len(workers)):
        progress = tmp_path / str(attempt) / "progress.json"
        assert json.loads(progress.read_text()) == {"elapsed_s": 1.0}


def _remote_sampler(out: Path) -> RemoteSampler:
    """A RemoteSampler whose agent answers one pull with a sampler.json and a CSV."""
    sampler = RemoteSampler.__new__(RemoteSampler)
    sampler.out, sampler.id, sampler._lock, sampler._meta_mtime = out, "s1", threading.Lock(), None
    pulled = {"sampler.json": b'{"started_unix": 100.0}', "process.csv": b"t,x\n1,2\n"}
    doc = {"meta_mtime": 1, "files": {k: base64.b64encode(v).decode() for k, v in pulled.items()}}
    client = SimpleNamespace(request=lambda *a, **k: doc)
    sampler.sut = SimpleNamespace(client=client, clock_offset_s=0.0, agent_doc={"host": "h"})
    return sampler


def test_agent_samples_are_copied_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RemoteSampler.fetch writes what it pulled (sampler.json replaced whole, the CSVs
    appended) on the threadpool it is given; the run's loop stays free meanwhile."""
    _slow_disk(monkeypatch)
    (tmp_path / "on").mkdir()
    control = gevent.spawn(_remote_sampler(tmp_path / "on").fetch)
    on_loop = _worst_tick_delay(control, SLOW_S + 0.2)
    workers: list[gevent.Greenlet] = []

    def spawn(attempt: int) -> gevent.Greenlet:
        (tmp_path / f"off{attempt}").mkdir()
        fetch = _remote_sampler(tmp_path / f"off{attempt}").fetch
        workers.append(gevent.spawn(fetch, gevent.get_hub().threadpool.apply))
        return workers[-1]

    off_loop = _off_loop_delay(spawn, SLOW_S + 0.2)
    assert control.successful(), control.exception
    assert all(w.successful() for w in workers), [w.exception for w in workers]
    assert on_loop >= 0.8 * SLOW_S, on_loop
    assert off_loop < SLOW_S / 3, (off_loop, on_loop)
    for side in ["on", *(f"off{attempt}" for attempt in range(len(workers)))]:
        meta = json.loads((tmp_path / side / "sampler.json").read_text())
        assert meta["agent"] == {"host": "h"}, meta
        assert (tmp_path / side / "process.csv").read_bytes() == b"t,x\n1,2\n"


def test_partial_results_are_serialised_and_written_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every WRITE_EVERY_S a run replaces results.json with what it has so far: the
    document is built on the loop, its serialising and fsync'd write on the threadpool."""
    from harness import results
    from harness.load import finalisation

    _slow_disk(monkeypatch)
    monkeypatch.setattr(controller, "WRITE_EVERY_S", 0.05)
    doc = {"schema": "x/1", "rows": [{"t": i / 4, "p99_ms": 1.5 * i} for i in range(2000)]}
    monkeypatch.setattr(finalisation, "build_document", lambda state, partial, samples: doc)
    control = gevent.spawn(results.write_document, tmp_path / "control.json", doc)
    on_loop = _worst_tick_delay(control, SLOW_S + 0.2)
    workers: list[gevent.Greenlet] = []

    def spawn(attempt: int) -> gevent.Greenlet:
        (tmp_path / str(attempt)).mkdir()
        writes = iter(range(3))
        state = SimpleNamespace(
            out_dir=tmp_path / str(attempt), _collecting=lambda: next(writes, None) is not None
        )
        workers.append(gevent.spawn(HarnessState._write_periodically, state))
        return workers[-1]

    off_loop = _off_loop_delay(spawn, 2 * SLOW_S + 0.3)
    assert on_loop >= 0.8 * SLOW_S, on_loop
    assert off_loop < SLOW_S / 3, (off_loop, on_loop)
    assert all(w.successful() for w in workers), [w.exception for w in workers]
    for attempt in range(len(workers)):
        written = (tmp_path / str(attempt) / "results.json").read_text()
        assert written == (tmp_path / "control.json").read_text() == results.dumps(doc)


def test_a_partial_write_still_going_never_lands_after_the_final_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ends while a partial results.json is in its fsync'd write on the
    threadpool: the final write waits for it (the control, which does not wait, shows the
    partial document replacing the final one)."""
    from harness.load import finalisation

    native_sleep = gevent.monkey.get_original("time", "sleep")
    get_ident = gevent.monkey.get_original("threading", "get_ident")
    main, real_replace = get_ident(), os.replace

    def replace_slowly_off_the_loop(src: Any, dst: Any) -> None:
        if get_ident() != main:
            native_sleep(SLOW_S)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_slowly_off_the_loop)
    monkeypatch.setattr(controller, "WRITE_EVERY_S", 0.01)
    monkeypatch.setattr(
        finalisation, "build_document", lambda state, partial, samples: {"partial": partial}
    )

    def end_during_a_partial_write(out: Path, wait: bool) -> bool:
        out.mkdir()
        collecting = iter([True, True])  # the loop's test, then the one after its sleep
        state = SimpleNamespace(
            out_dir=out, partial_write=None, _collecting=lambda: next(collecting, False)
        )
        writer = gevent.spawn(HarnessState._write_periodically, state)
        gevent.sleep(0.1)  # the partial write is in its slow rename on the threadpool
        assert state.partial_write is not None and not state.partial_write.ready()
        if wait:
            finalisation._wait_partial_write(state)
        finalisation.write_results(state, partial=False, samples=None)
        writer.join(timeout=5)
        native_sleep(SLOW_S + 0.1)  # whatever was still on its way has landed
        return json.loads((out / "results.json").read_text())["partial"]

    assert end_during_a_partial_write(tmp_path / "control", wait=False) is True
    assert end_during_a_partial_write(tmp_path / "waits", wait=True) is False
