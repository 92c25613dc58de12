"""Capacity calibration: a short closed-loop probe for sustainable throughput.

Scenario rates written as ``"0.6x"`` multiply the capacity measured here, so one
checklist serves a slow CPU server and a fast GPU server alike. The probe keeps ``users``
requests in flight back to back (enough to fill the server's batches) for ``duration_s``,
discards the first ``warmup_fraction`` and reports the rate of ``ok`` answers over the
rest: what the server actually completes, not what it was offered.

A token stream lasts seconds, as long as the probe itself: counting the streams sent after
the warm-up would count only those that happened to start and end inside it. With
``streams`` the probe instead measures each user from the end of its first whole stream
(the cold start, when every user's prompt arrives at once, with whatever the server
refused meanwhile) to the end of its last exchange, and divides: capacity = ok streams /
(the users' measured time / users) — the closed-loop law, each user always in the
server, no think time. Every user sends at least one exchange after its first whole
stream, so a probe shorter than a stream still measures one a user after the cold one;
and a user that has measured keeps sending, uncounted, until every user has, so that no
stream is measured in a server emptier than the probe's (those still running then are cut
off, as a client that hangs up). A stream is ok when the protocol reads a whole answer
from it (a finish reason and the end marker, no error event): a 200 cut short or
carrying an error is an error here, as it is to the load's checks.

The probe runs before the sampler starts, so it accounts for its own window
(``harness.collectors.system.ForeignMeter``, read at the end of the warm-up and at the
end): the CPU on the server's cores that was not the run's, and the generator's own CPU.
They are recorded as ``calibration.cpu``; the checks judge the probe with them (another
tenant, a saturated generator) like any measurement, and a disturbed probe's capacity is
not pinned for later scenarios.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import gevent
import gevent.event
import gevent.pool

from harness.collectors.system import ForeignMeter
from harness.errors import TargetUnavailable
from harness.load import http
from harness.load.payloads import PayloadPool, make_id
from harness.protocols import BadResponse
from harness.results import hdr

CALIBRATION_SLOT = 0xFFFF  # ids of probe requests never collide with a worker's
# what a probe's answer was, by status (-1: a 200 whose stream is not a whole answer)
_OUTCOME = {
    200: "whole answers",
    0: "no answer (refused, reset or timed out)",
    -1: "200s whose stream was not whole (no finish reason or end marker, or an error "
    "event: a stream cut short, as by a server that ends one when another arrives)",
}


@dataclass(frozen=True)
class Calibration:
    capacity_rps: float
    users: int
    duration_s: float
    measured_s: float
    ok: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    # the probe's own CPU accounting over its measured part (ForeignMeter.stop())
    cpu: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _whole(pool: PayloadPool, body: bytes) -> bool:
    """Whether the protocol reads a whole answer from a 200's body: for a token stream, a
    finish reason and the end marker, no error event (``parse_answer``)."""
    try:
        pool.parse_answer(body)
    except BadResponse:
        return False
    return True


def calibrate(
    pool: PayloadPool,
    host: str,
    port: int,
    cls: str,
    *,
    users: int,
    duration_s: float,
    timeout_s: float,
    warmup_fraction: float = 0.2,
    clock: Callable[[], float] = time.perf_counter,
    sut_pid: int | None = None,
    streams: bool = False,
) -> Calibration:
    """Run the probe in this process (gevent) and return the measured capacity, with the
    CPU accounting of its measured part (``sut_pid``: the server's process on this host,
    None when it is elsewhere or unknown — then only the generator's CPU is measured).
    ``streams``: answers that last seconds (token streams), measured by the closed-loop
    law (module docstring)."""
    start = clock()
    measure_from = start + duration_s * warmup_fraction
    stop_at = start + duration_s
    counts = {"ok": 0, "errors": 0}
    busy = [0.0]  # streams: the users' measured time, summed
    last_done = [stop_at]
    hist = hdr.new_histogram()
    seq = iter(range(1 << 40))

    finished = [0]  # streams: users that have measured what they will
    # every answer of the probe by what it was (measured or not): what a probe that got no
    # successful answer says it got instead
    outcomes: Counter[str] = Counter()
    all_finished = gevent.event.Event()

    def user() -> None:
        conn = http.Connection(host, port)
        # streams: the user's time from the end of its first whole stream (its cold start,
        # with whatever was refused before it) to the end of its last measured exchange
        since: float | None = None
        measured = 0
        end = start
        done = False
        try:
            while True:
                t0 = clock()
                if not done and t0 >= stop_at:
                    if not streams:
                        return
                    if measured or t0 >= stop_at + timeout_s:
                        done = True
                        finished[0] += 1
                        if finished[0] == users:
                            all_finished.set()
                if done and all_finished.is_set():
                    return
                n = next(seq)
                raw = pool.raw(cls, n % len(pool), make_id(CALIBRATION_SLOT, n))
                try:
                    status, body = conn.exchange(raw, timeout_s)
                except (http.RequestTimeout, http.ConnectionFailed):
                    status = 0
                t1 = clock()
                if streams and status == 200 and not _whole(pool, body):
                    status = -1  # a 200 whose stream is not a whole answer: an error
                outcomes[_OUTCOME.get(status, f"HTTP {status}")] += 1
                if status == 0:
                    gevent.sleep(0.01)  # don't spin on a refused connection
                if done:
                    # streams: a user that has measured keeps the server as busy as it was
                    # until the last one has (a server with fewer streams in flight is
                    # faster, and the last streams measured would say so), uncounted
                    continue
                if streams and since is None:
                    if status == 200:
                        since = t1
                    continue
                if not streams and t0 < measure_from:
                    continue
                measured += 1
                end = t1
                last_done[0] = max(last_done[0], t1)
                if status == 200:
                    counts["ok"] += 1
                    hist.record_value(max(1, int((t1 - t0) * 1e6)))
                else:
                    counts["errors"] += 1
        finally:
            conn.close()
            if since is not None and measured:
                busy[0] += end - since

    meter = ForeignMeter(sut_pid)

    def start_meter() -> None:
        gevent.sleep(max(0.0, measure_from - clock()))
        meter.start()

    group = gevent.pool.Group()
    for _ in range(users):
        group.spawn(user)
    metering = gevent.spawn(start_meter)
    if streams:
        # the users still streaming once every user has measured are cut off mid-stream
        all_finished.wait(timeout=duration_s + 3 * timeout_s + 5)
        group.kill(block=True, timeout=5.0)
    else:
        group.join(timeout=duration_s + timeout_s + 5)
        group.kill(block=False)
    metering.join(timeout=1.0)
    cpu = meter.stop() if metering.successful() else None
    measured = max(1e-9, last_done[0] - measure_from)
    if counts["ok"] == 0:
        got = ", ".join(f"{what} {n}" for what, n in outcomes.most_common()) or "none"
        raise TargetUnavailable(
            f"capacity calibration got no successful answer in {duration_s:g} s from "
            f"{users} users (what came instead: {got}); check the server, or write "
            f"absolute rates (req/s) or load.capacity_rps in the scenario"
        )
    pct = hdr.summary_ms(hist)
    if streams:
        measured = max(1e-9, last_done[0] - start)
    return Calibration(
        capacity_rps=users * counts["ok"] / busy[0] if streams else counts["ok"] / measured,
        users=users,
        duration_s=duration_s,
        measured_s=measured,
        ok=counts["ok"],
        errors=counts["errors"],
        p50_ms=pct["p50_ms"],
        p99_ms=pct["p99_ms"],
        cpu=cpu,
    )
