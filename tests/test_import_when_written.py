"""``harness.locust_run.ImportWhenWritten``: the wrap-up's imports load on a background
thread once a scenario's complete results are written, and ``cancel()`` returns only when
that thread is done, so the caller's own imports never run beside it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from harness.locust_run import ImportWhenWritten


@pytest.fixture
def slow_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module that takes 0.4 s to import and says when it started."""
    started = tmp_path / "started"
    (tmp_path / "slow_wrapup_module.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(0.4)\n"
        "DONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_wrapup_module", raising=False)
    return "slow_wrapup_module", started


def test_cancel_waits_for_an_import_under_way(tmp_path: Path, slow_module) -> None:
    name, started = slow_module
    results = tmp_path / "results.json"
    results.write_text('{"partial": false}')
    warm = ImportWhenWritten(results, [name])
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline, "the import never started"
        time.sleep(0.01)
    warm.cancel()  # mid-import: returns once the module is whole
    assert sys.modules[name].DONE is True and warm.imported.is_set()


def test_nothing_is_imported_before_the_results_are_complete(tmp_path: Path, slow_module) -> None:
    name, started = slow_module
    results = tmp_path / "results.json"
    results.write_text('{"partial": true}')  # the partial results a long load writes
    warm = ImportWhenWritten(results, [name])
    time.sleep(0.2)
    warm.cancel()
    assert not started.exists() and name not in sys.modules and not warm.imported.is_set()
