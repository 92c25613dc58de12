"""``harness sample`` as a child process: the one place its command line is built, and
how it is started and stopped.

The sampler runs in a process of its own wherever it runs — beside the Locust process
(harness.load.target) or under ``harness agent`` on the server's host (harness.agent) —
so its reads never share a gevent loop or a request thread. Both start it here.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path


def sample_command(
    pid: int,
    out: Path,
    *,
    interval_s: float = 1.0,
    metrics_url: str | None = None,
    loadgen_pids: Iterable[int] = (),
    pid_file: Path | None = None,
) -> list[str]:
    """The ``harness sample`` argv for ``pid``, writing into ``out``."""
    cmd = [
        sys.executable, "-m", "harness", "sample",
        "--pid", str(pid), "--out", str(out), "--interval", f"{interval_s:g}",
        "--stop-with-parent",  # a SIGKILLed harness leaves no sampler ticking forever
    ]  # fmt: skip
    if metrics_url:
        cmd += ["--metrics-url", metrics_url]
    for lg in loadgen_pids:
        cmd += ["--loadgen-pid", str(lg)]
    if pid_file is not None:
        cmd += ["--pid-file", str(pid_file)]
    return cmd


def start_sample(
    cmd: list[str], out: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen:
    """Start ``cmd`` with its output in ``out/sampler.log`` (the child holds the file)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sampler.log", "wb") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
        )


def stop_sample(proc: subprocess.Popen, timeout_s: float = 10.0) -> int | None:
    """SIGTERM by pid (the sampler closes its files and writes sampler.json), SIGKILL if
    it lingers; the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)
    return proc.returncode
