"""Talking to the target around a run: golden outputs, metadata helpers, the sampler.

Everything here runs on the master (or local runner) before or after the load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, TargetUnavailable
from harness.load import http, integrity, payloads

log = logging.getLogger("harness.load")


def fetch_golden(
    pool: payloads.PayloadPool, host: str, port: int, timeout_s: float
) -> integrity.Golden:
    """Send every pool input once, one at a time (batch size 1), and keep the answers."""
    conn = http.Connection(host, port)
    cls = pool.class_names[-1]
    outputs = []
    try:

        def ask(i: int, n: int) -> tuple[Any, ...]:
            rid = payloads.make_id(0xFFFE, n)
            try:
                status, body = conn.exchange(pool.raw(cls, i, rid), max(timeout_s, 10.0))
            except (http.RequestTimeout, http.ConnectionFailed) as exc:
                raise TargetUnavailable(f"golden output for pool input {i}: {exc}") from None
            if status != 200:
                raise TargetUnavailable(
                    f"golden output for pool input {i}: HTTP {status} {body[:200]!r}; the "
                    f"server must answer single requests before load starts"
                )
            try:
                return integrity.parse_answer(body)[1]
            except integrity.BadResponse as exc:
                raise TargetUnavailable(f"golden output for pool input {i}: {exc}") from None

        for i in range(len(pool)):
            outputs.append(ask(i, i))
        repeats = [(i, ask(i, len(pool) + i)) for i in range(min(8, len(pool)))]
    finally:
        conn.close()
    return integrity.build_golden(outputs, repeats)


def cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    t = os.times()
    return t.user + t.system


def get(url: str) -> tuple[int, bytes]:
    try:
        return http.request(url, "GET", timeout=10.0)
    except (http.RequestTimeout, http.ConnectionFailed):
        return 0, b""


def json_or_none(url: str) -> dict[str, Any] | None:
    try:
        return payloads.fetch_json(url)
    except TargetUnavailable:
        return None


def port_of(host: str | None) -> int | None:
    if not host:
        return None
    return http.split_url(host)[1]


def cores_of(handle: Any) -> list[int] | None:
    if handle is None:
        return None
    try:
        cores = handle.cores
        return list(cores) if cores is not None else None
    except (OSError, HarnessError):
        return None


def start_sampler(
    pid: int, out: Path, metrics_url: str, pid_file: Path | None = None
) -> subprocess.Popen:
    """``harness sample`` as a subprocess: the sampler never shares our gevent loop."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "sample",
        "--pid",
        str(pid),
        "--out",
        str(out),
        "--interval",
        "1",
        "--metrics-url",
        metrics_url,
        "--loadgen-pid",
        str(os.getpid()),
    ]
    if pid_file is not None:
        cmd += ["--pid-file", str(pid_file)]
    log_file = open(out / "sampler.log", "wb")  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    finally:
        log_file.close()


def stop_sampler(proc: subprocess.Popen | None, out: Path) -> dict[str, Any] | None:
    """Stop ``harness sample`` by pid (SIGTERM, then SIGKILL) and read what it wrote."""
    if proc is None:
        return None
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    from harness.collectors import read_samples

    try:
        return read_samples(out)
    except HarnessError as exc:
        log.warning("harness: sampler output unreadable: %s", exc)
        return None
