"""The primitives written once: an atomic write and a signal trap."""

from __future__ import annotations

import os
import signal
import stat

import pytest

from harness.primitives import atomic_write, trapped_signals


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "doc.json"
    atomic_write(target, "old")
    atomic_write(target, b"new", fsync=True)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["doc.json"]


def test_atomic_write_failing_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "doc.json"
    atomic_write(target, "old")
    with pytest.raises(TypeError):
        atomic_write(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_trapped_signals_call_the_handler_then_restore_the_previous_one():
    got: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with trapped_signals(got.append):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert got == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is before
