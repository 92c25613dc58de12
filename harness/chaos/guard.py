"""An undo guard: a small process that SIGCONTs paused pids if the harness dies.

A pause is undone by the harness itself (the event's end, the timeline's ``finally``, its
signal handlers, atexit) — none of which runs when the harness is SIGKILLed or crashes
hard, and a server left in state ``T`` serves nobody until someone notices. So before the
first SIGSTOP the pause starts a guard: ``python -S -c GUARD_CODE PID...`` in its own
session (a Ctrl-C to the harness's group does not reach it), holding the read end of a
pipe whose only write end the harness keeps. The kernel closes that write end whenever
the harness exits, however it exits; the guard reads EOF and continues every pid it was
given. ``PR_SET_PDEATHSIG`` would not do: it fires on the death of the *thread* that
spawned the child, and a Locust process spawns from short-lived greenlet threads.

A normal revert continues the pids itself and then closes the pipe; the guard's own
SIGCONT is then a no-op (a running process ignores it). The guard checks each pid's start
time (``/proc/<pid>/stat`` field 22) before signalling, so a pid reused by another
process after the server exited is left alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

# argv: "pid:start_ticks" ...; stdout: "ready\n" once armed; stdin: EOF = continue all
GUARD_CODE = r"""
import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(15, b"harness-guard")  # PR_SET_NAME: not load-generator CPU
except Exception:
    pass
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
targets = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]]
sys.stdout.write("ready\n")
sys.stdout.flush()
while os.read(0, 4096):
    pass
def start_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])
for pid, ticks in targets:
    if start_ticks(pid) == ticks:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
"""


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (identifies it with its pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2 :].split()[19])


class ContGuard:
    """A guard process that SIGCONTs ``pids`` when this process dies or ``close()`` is
    called. ``start()`` returns once the guard is armed (it has the pids and waits)."""

    def __init__(self, pids: list[int]) -> None:
        self.targets = [(pid, t) for pid in pids if (t := start_ticks(pid)) is not None]
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout_s: float = 10.0) -> ContGuard:
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-c", GUARD_CODE, *(f"{p}:{t}" for p, t in self.targets)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        assert self.proc.stdout is not None
        # Wait for the guard to be armed: a pause must not start before its undo exists.
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                self.close()
                raise RuntimeError(f"the undo guard did not start within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.close()
            raise RuntimeError(f"the undo guard did not arm (said {line!r})")
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """EOF to the guard: it continues its pids (already continued: a no-op) and exits."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, 9)
            proc.wait(timeout_s)
