"""The server under test: start it (pinned, in its own process group), wait until it is
ready, stop/restart it, or attach to one the user started.

- ``process.py``: ``SutProcess``, a server command the harness starts and owns, with its
  guard (``guard.py``, ``python -m harness.sut.guard``: its own process, which stops the
  server's group when the process that started it dies, SIGKILL included);
- ``attached.py``: ``AttachedSut`` / ``attach``, a server the user started (``--sut-pid``),
  followed across its supervisor's restarts;
- ``command.py``: the ``--sut-cmd`` template's placeholders, checked once;
- ``cores.py``: which cores the server and the load generator get;
- ``host.py``: free ports, process trees, listeners, readiness polls, the pid file.

Readiness is judged by status code only (Triton and MLServer send empty bodies), at the
protocol's readiness path (``harness.protocols``). Everything is stopped by pid, never
by name.
"""

from __future__ import annotations

from harness.sut.attached import AttachedSut, attach
from harness.sut.command import check_command
from harness.sut.cores import (
    CoreSplit,
    attached_split,
    available_cores,
    choose_cores,
    parse_cores,
    split_cores,
)
from harness.sut.host import (
    free_port,
    listener_pid,
    poll_ready,
    process_age_s,
    tree_pids,
    write_pid_file,
)
from harness.sut.process import SutProcess

__all__ = [
    "AttachedSut",
    "CoreSplit",
    "SutProcess",
    "attach",
    "attached_split",
    "check_command",
    "available_cores",
    "choose_cores",
    "free_port",
    "listener_pid",
    "parse_cores",
    "poll_ready",
    "process_age_s",
    "split_cores",
    "tree_pids",
    "write_pid_file",
]
