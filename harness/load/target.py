"""Talking to the target around a run: golden outputs, metadata helpers, the sampler.

Everything here runs on the master (or local runner) before or after the load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError, TargetUnavailable
from harness.load import http, integrity, payloads
from harness.primitives import atomic_write

log = logging.getLogger("harness.load")


# A transient 5xx/429 before the load (one failed model call, a momentarily full queue)
# must not abort the run: each golden request gets this many tries, with these pauses.
GOLDEN_TRIES = 4
GOLDEN_BACKOFF_S = (0.1, 0.5, 1.0)


def fetch_golden(
    pool: payloads.PayloadPool,
    host: str,
    port: int,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> integrity.Golden:
    """Send every pool input once, one at a time (batch size 1), and keep the answers.

    A 5xx or 429 answer is retried (``GOLDEN_TRIES`` in all); a server that keeps failing
    one input, or does not answer, is unavailable for an integrity-checked run.
    """
    conn = http.Connection(host, port)
    cls = pool.class_names[-1]
    outputs = []
    retried = 0
    try:

        def ask(i: int, n: int) -> tuple[Any, ...]:
            nonlocal retried
            for attempt in range(GOLDEN_TRIES):
                rid = payloads.make_id(0xFFFE, n)
                try:
                    status, body = conn.exchange(pool.raw(cls, i, rid), max(timeout_s, 10.0))
                except (http.RequestTimeout, http.ConnectionFailed) as exc:
                    raise TargetUnavailable(f"golden output for pool input {i}: {exc}") from None
                if (status >= 500 or status == 429) and attempt + 1 < GOLDEN_TRIES:
                    retried += 1
                    sleep(GOLDEN_BACKOFF_S[min(attempt, len(GOLDEN_BACKOFF_S) - 1)])
                    continue
                break
            if status != 200:
                raise TargetUnavailable(
                    f"golden output for pool input {i}: HTTP {status} {body[:200]!r}"
                    + (f" ({GOLDEN_TRIES} tries)" if status >= 500 or status == 429 else "")
                    + "; the server must answer single requests before load starts "
                    "(--no-verify skips the integrity check and this fetch)"
                )
            try:
                return pool.parse_answer(body)[1]  # as its protocol reads an answer
            except integrity.BadResponse as exc:
                raise TargetUnavailable(f"golden output for pool input {i}: {exc}") from None

        for i in range(len(pool)):
            outputs.append(ask(i, i))
        repeats = [(i, ask(i, len(pool) + i)) for i in range(min(8, len(pool)))]
    finally:
        conn.close()
    if retried:
        log.warning("harness: golden fetch retried %d request(s) after a 5xx/429", retried)
    return integrity.build_golden(outputs, repeats)


def golden_key(
    pool: payloads.PayloadPool, base_url: str, model: str, pid: int | None
) -> dict[str, Any] | None:
    """What a kept golden must match to be reused: the same server *process* (its pid and
    start time: a restarted server, even on the same port, fetches anew), URL, model and
    pool inputs. None when the process cannot be identified here (no pid, or a server on
    another host): such a run always fetches."""
    import psutil

    if pid is None:
        return None
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return {
        "pid": pid,
        "started": started,
        "url": base_url,
        "model": model,
        "pool": golden_key_pool(pool),
    }


# A golden file keeps the goldens of this many models and pools, the newest first.
GOLDEN_KEPT = 8
# How many pool inputs a golden kept from another process of the same model is checked
# with before it is reused: each asked again alone, each answer its kept output within τ.
GOLDEN_RECHECK = 8


def golden_content_key(pool: payloads.PayloadPool, model: str, model_meta: Any) -> dict[str, Any]:
    """What a golden kept from *another* server process must match before it is checked
    for reuse (``golden_still_holds``): the model's name and metadata and the pool's inputs
    (not the URL or the process: a restarted server has a new port and pid)."""
    key = golden_key_pool(pool)
    return {
        "model": model,
        "metadata": json.dumps(model_meta, sort_keys=True, default=str),
        "pool": key,
    }


def golden_key_pool(pool: payloads.PayloadPool) -> str:
    """A digest of the pool's requests as the golden fetch sends them: each body, and the
    request head without its Host line (a new server has a new port)."""
    cls = pool.class_names[-1]
    digest = hashlib.sha256()
    for i in range(len(pool)):
        head, _, body = pool.raw(cls, i, payloads.make_id(0xFFFE, i)).partition(b"\r\n\r\n")
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"host:")]
        digest.update(b"\r\n".join(lines) + b"\r\n\r\n" + body)
    return digest.hexdigest()


def _kept_entries(path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
        entries = doc.get("entries")
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    except (OSError, ValueError, AttributeError):
        return []


def _golden_of(entry: Mapping[str, Any]) -> integrity.Golden | None:
    try:
        return integrity.golden_from_wire(entry["golden"])
    except (KeyError, TypeError, ValueError):
        return None


def kept_golden(path: Path, key: dict[str, Any] | None) -> integrity.Golden | None:
    """The golden outputs an earlier run kept in ``path`` (``--golden-cache``) when they
    were fetched from the server process ``key`` names; else None."""
    if key is None:
        return None
    for entry in _kept_entries(path):
        if entry.get("key") == key:
            return _golden_of(entry)
    return None


def kept_golden_of_model(path: Path, content: dict[str, Any]) -> integrity.Golden | None:
    """The newest golden ``path`` keeps for the same model and pool (``content``),
    fetched from another server process: reused only once ``golden_still_holds``."""
    for entry in _kept_entries(path):
        if entry.get("content") == content:
            return _golden_of(entry)
    return None


def keep_golden(
    path: Path,
    key: dict[str, Any] | None,
    golden: integrity.Golden,
    content: dict[str, Any] | None = None,
) -> None:
    """Keep ``golden`` in ``path`` for the next run against the same server process
    (``key``) or, once checked, another process of the same model (``content``); the
    entry of the same model and pool is replaced, at most ``GOLDEN_KEPT`` are kept. The
    file is written atomically: a run killed mid-write leaves the previous file."""
    if key is None and content is None:
        return
    entries = [
        e
        for e in _kept_entries(path)
        if not (content is not None and e.get("content") == content)
        and not (key is not None and e.get("key") == key)
    ]
    entry = {"key": key, "content": content, "golden": integrity.golden_to_wire(golden)}
    atomic_write(path, json.dumps({"entries": [entry, *entries][:GOLDEN_KEPT]}))


def golden_still_holds(
    golden: integrity.Golden,
    pool: payloads.PayloadPool,
    host: str,
    port: int,
    timeout_s: float,
    n: int = GOLDEN_RECHECK,
) -> bool:
    """Whether this server, asked the pool's first ``n`` inputs again one at a time,
    answers each with its kept output (within τ; exactly, for outputs that are not
    numbers). Any other answer, an error or no answer: False (the golden is fetched)."""
    conn = http.Connection(host, port)
    cls = pool.class_names[-1]
    try:
        for i in range(min(n, len(pool), len(golden.outputs))):
            rid = payloads.make_id(0xFFFE, i)
            try:
                status, body = conn.exchange(pool.raw(cls, i, rid), max(timeout_s, 10.0))
                if status != 200:
                    return False
                values = pool.parse_answer(body)[1]
            except (http.RequestTimeout, http.ConnectionFailed, integrity.BadResponse):
                return False
            if not golden.holds_own(i, values):
                return False
        return True
    finally:
        conn.close()


def cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    t = os.times()
    return t.user + t.system


def get(url: str) -> tuple[int, bytes]:
    """GET ``url`` → (status, body); (0, b"") when nothing answered. A TLS handshake that
    fails is a configuration error (exit 2 naming --ca-cert/--insecure), not "no answer"."""
    try:
        return http.request(url, "GET", timeout=10.0)
    except http.TLSFailed as exc:
        raise ConfigError(str(exc)) from None
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
    from harness.collectors.child import sample_command, start_sample

    cmd = sample_command(
        pid, out, metrics_url=metrics_url, loadgen_pids=[os.getpid()], pid_file=pid_file
    )
    env = None
    ca_cert = http.current().ca_cert
    if ca_cert is not None:
        # the scraper's urllib trusts what OpenSSL's default paths name: an https://
        # metrics URL signed by the --ca-cert CA verifies like the load's requests do
        env = {**os.environ, "SSL_CERT_FILE": os.path.abspath(ca_cert)}
    return start_sample(cmd, out, env)


def samples_left(out: Path) -> dict[str, Any] | None:
    """What a sampler wrote into ``out`` (its server, system and metrics sections), read
    without stopping anything: the evidence a run that died before its results still has.
    None when nothing readable is there."""
    from harness.collectors import read_samples

    if not out.is_dir():
        return None
    try:
        return read_samples(out)
    except HarnessError as exc:
        log.warning("harness: sampler output unreadable: %s", exc)
        return None


def stop_sampler(proc: subprocess.Popen | None, out: Path) -> dict[str, Any] | None:
    """Stop ``harness sample`` by pid (SIGTERM, then SIGKILL) and read what it wrote."""
    if proc is None:
        return None
    from harness.collectors.child import stop_sample

    stop_sample(proc)
    from harness.collectors import read_samples

    try:
        return read_samples(out)
    except HarnessError as exc:
        log.warning("harness: sampler output unreadable: %s", exc)
        return None
