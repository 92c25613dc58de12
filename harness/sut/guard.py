"""Stop a server when the process that started it dies, SIGKILL included.

``python -m harness.sut.guard PARENT_PID SERVER_PID``: a separate process (its own
session, so a Ctrl-C to the harness does not reach it first) that polls twice a second;
when PARENT_PID is gone it sends SIGCONT and SIGTERM to SERVER_PID's process group (the
server was started in its own group; a paused one must run to handle the SIGTERM), waits
up to 10 s, then SIGKILL. When the server exits first, the guard exits too. An ``atexit``
hook cannot do this: a SIGKILLed harness runs none. ``harness.sut.SutProcess`` starts one
beside every server it starts (``--sut-cmd``: the Locust plugin's, `harness peak`'s and
`harness tune`'s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of a dead parent is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def guard(parent: int, server: int, poll_s: float = 0.5, grace_s: float = 10.0) -> int:
    try:
        pgid = os.getpgid(server)
    except ProcessLookupError:
        return 0
    while _alive(parent):
        if not _alive(server):
            return 0
        time.sleep(poll_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(server):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m harness.sut.guard PARENT_PID SERVER_PID", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(Exception):  # PR_SET_NAME: tell it apart in ps / the sampler
        import ctypes

        ctypes.CDLL(None).prctl(15, b"harness-sutguard")
    return guard(int(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
