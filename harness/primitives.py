"""Small primitives every room of the harness uses, written once.

- ``atomic_write``: a file other processes read while the harness writes it (a pid file
  the sampler follows, results.json, progress.json, the tune state) is either the old
  contents or the new, never half of one.
- ``trapped_signals``: SIGINT and SIGTERM call a handler for the body of a ``with``
  instead of killing the process (the run then stops cleanly and writes what it
  measured); the handlers before are back on every exit path.
- ``cpu_model``: the machine's CPU model name, read the same way by the results document
  (``machine.cpu_model``) and by the agent (its ``/info``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def atomic_write(
    path: str | Path, data: str | bytes, *, mode: int = 0o644, fsync: bool = False
) -> None:
    """Replace ``path`` with ``data`` in one rename: a reader sees the old file or the new.

    The temporary file is in the same directory (a rename across file systems is not
    atomic) and is removed on any failure. ``mode``: the new file's permissions (a
    temporary file is created 0600; results are shared artefacts). ``fsync``: flush to
    the disk before the rename (the results document: it must survive a power cut)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def trapped_signals(
    handler: Callable[[int], Any], signals: tuple[int, ...] = STOP_SIGNALS
) -> Iterator[dict[int, Any]]:
    """For the body, each of ``signals`` calls ``handler(signum)`` instead of its handler
    before; those are restored on every exit path. Outside the main thread (where Python
    cannot set handlers) the signals are left alone. Yields the handlers before, by
    signal (empty outside the main thread), for a handler that chains to them."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            previous[sig] = signal.signal(sig, lambda signum, _frame: handler(signum))
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's model name (Linux ``/proc/cpuinfo``; elsewhere ``platform.processor()``)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "cpu model"):
                    return " ".join(value.split()) or None
    except OSError:
        pass
    return platform.processor() or None
