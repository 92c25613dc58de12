"""Waking the event loop at an absolute ``time.monotonic()`` instant, to the microsecond.

``asyncio.sleep`` under uvloop has millisecond granularity: libuv rounds each delay to
whole milliseconds and reads its loop time from a millisecond clock, so a wake-up lands
anywhere in a window of about 1-2 ms around the asked instant. ``DeadlineTimer`` arms a
Linux ``timerfd`` on CLOCK_MONOTONIC (the clock of ``time.monotonic``) with an absolute
expiry in nanoseconds and waits for it to become readable through the running loop's
``add_reader``: the kernel's high-resolution timer wakes the loop's ``epoll`` at the
instant, no thread and no CPU burnt while waiting.

Where ``timerfd`` is missing (not Linux, no libc through ctypes) ``DeadlineTimer``
falls back to ``asyncio.sleep`` for the remaining time; ``precise`` says which is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
    except (OSError, AttributeError):
        return None
    return libc


class DeadlineTimer:
    """``await wait_until(t)`` returns at ``time.monotonic()`` >= ``t`` (at once if past).

    One timer serves one waiter at a time (the engine's step loop); ``close`` frees it.
    """

    def __init__(self) -> None:
        self._fd = -1
        self._libc = _libc() if hasattr(os, "O_CLOEXEC") else None
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            self._fd = fd if fd >= 0 else -1
        self._spec = _Itimerspec()

    @property
    def precise(self) -> bool:
        """True when waits use the kernel's timer (timerfd), not ``asyncio.sleep``."""
        return self._fd >= 0

    async def wait_until(self, deadline: float) -> None:
        if self._fd < 0:
            delay = deadline - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            return
        ns = int(deadline * 1e9)
        if ns <= time.monotonic_ns():
            await asyncio.sleep(0)
            return
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._spec, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        loop = asyncio.get_running_loop()
        fired = loop.create_future()
        loop.add_reader(self._fd, _fire, self._fd, fired)
        try:
            await fired
        finally:
            loop.remove_reader(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _fire(fd: int, fired: asyncio.Future[None]) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 8)  # the expiry count; reading it disarms readability
    if not fired.done():
        fired.set_result(None)
