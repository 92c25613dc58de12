"""The open-loop engine on a fake clock: schedule kept, drops counted, nothing lost."""

from __future__ import annotations

import gevent
import gevent.event
import pytest

from harness.load.options import Options, scenario_for
from harness.load.recording import Recording, counters_view
from harness.load.scenario import packaged_scenarios
from harness.load.users import Engine, Plan
from harness.protocols.kserve_v2 import InputSpec, generate_inputs
from harness.testing.locust_runs import SCENARIOS


class FakeTime:
    """A clock that only moves when the engine sleeps (no wall time passes in the test)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        gevent.sleep(0)  # let the sends spawned so far run at the current time
        self.now += s


def _options(path: str, **over) -> Options:
    base = dict(
        scenario=path,
        mode="quick",
        model="m",
        sut_pid=None,
        sut_cmd=None,
        sut_cores=None,
        out="x",
        inputs=(),
        sample_request=None,
        closed_loop_users=None,
        seed=None,
        max_in_flight=None,
        calibrate_s=None,
        capacity_rps=100.0,
        request_timeout_s=None,
        ready_timeout_s=10.0,
        sample=False,
        verify=False,
    )
    base.update(over)
    return Options(**base)


def _engine(path: str, fake: FakeTime, slot: int = 0, slots: int = 1, **over) -> Engine:
    sc = scenario_for(_options(path, **over)).with_cores(2)
    inputs = generate_inputs([InputSpec("input", "FP32", (1, 4))], 8, seed=1)
    plan = Plan(
        origin_unix=5000.0,
        slot=slot,
        slots=slots,
        base_url="http://127.0.0.1:9",
        model="m",
        capacity_rps=100.0,
        inputs=inputs,
        golden=None,
    )
    rec = Recording(sc.load.window_s, sc.load.first_requests)
    return Engine(sc, plan, rec, clock=fake.clock, wall=lambda: 5000.0, sleep=fake.sleep)


def test_constant_schedule_is_sent_in_full_on_time() -> None:
    fake = FakeTime()
    eng = _engine(str(SCENARIOS / "short_constant.toml"), fake)
    seen = []

    def exchange(raw, index, rid, t, conn=None):
        seen.append((t, fake.now - eng.origin))
        return "ok", 10

    eng._exchange = exchange  # the network is not what this test is about
    eng.run_open()
    eng.pool.join()
    c = counters_view(eng.recording.totals().counts)
    assert c["scheduled"] == 540 and c["ok"] == 540 and c["dropped"] == 0
    # each request left at its intended time (fake clock: zero dispatch lag)
    assert len(seen) == 540
    assert all(abs(actual - intended) < 1e-9 for intended, actual in seen)
    assert eng.recording.dispatch_lag.get_max_value() <= 1


def test_latency_counts_from_the_intended_send_time() -> None:
    # The generator starts 0.5 s late: the requests it owes are sent at once, and their
    # latency includes the time they should already have been out (no coordinated omission).
    fake = FakeTime()
    eng = _engine(str(SCENARIOS / "short_constant.toml"), fake)
    fake.now = eng.origin + 0.5
    eng._exchange = lambda *a, **k: ("ok", 0)
    eng.run_open()
    eng.pool.join()
    rec = eng.recording
    assert rec.totals().counts["scheduled"] == 540
    lat = rec.totals().hdr
    assert 490_000 <= lat.get_max_value() <= 510_000  # the first arrival waited 0.5 s
    assert 490_000 <= rec.dispatch_lag.get_max_value() <= 510_000
    assert lat.get_value_at_percentile(50) <= 1  # later ones were on time


def test_full_pool_counts_dropped_and_accounting_balances() -> None:
    fake = FakeTime()
    eng = _engine(str(SCENARIOS / "short_constant.toml"), fake, max_in_flight=4)
    release = gevent.event.Event()

    def stuck(raw, index, rid, t, conn=None):
        release.wait()  # a stalled server: nothing comes back
        return "ok", 0

    eng._exchange = stuck
    eng.run_open()
    rec = eng.recording
    c = counters_view(rec.totals().counts, rec.in_flight)
    assert c["scheduled"] == 540
    assert rec.in_flight == 4 and c["dropped"] == 536
    assert c["scheduled"] == c["ok"] + c["failed_total"] + c["dropped"] + c["in_flight"]
    release.set()
    eng.pool.join()
    c = counters_view(rec.totals().counts, rec.in_flight)
    assert c["ok"] == 4 and c["in_flight"] == 0 and c["dropped"] == 536


def test_workers_split_the_schedule_exactly() -> None:
    counts = []
    for slot in range(3):
        fake = FakeTime()
        eng = _engine(str(SCENARIOS / "short_constant.toml"), fake, slot=slot, slots=3)
        eng._exchange = lambda *a, **k: ("ok", 0)
        eng.run_open()
        eng.pool.join()
        counts.append(eng.recording.totals().counts["scheduled"])
    assert sum(counts) == 540 and max(counts) - min(counts) <= 2


def test_stopping_hands_back_the_next_arrival() -> None:
    fake = FakeTime()
    eng = _engine(str(SCENARIOS / "short_constant.toml"), fake)
    eng._exchange = lambda *a, **k: ("ok", 0)
    eng.stopping = True
    eng.run_open()
    assert eng.recording.totals().counts["scheduled"] == 0


@pytest.mark.parametrize("name", packaged_scenarios())
def test_every_packaged_scenario_builds_an_engine(name: str) -> None:
    fake = FakeTime()
    eng = _engine(name, fake)
    assert eng.scenario.stages, name
    assert eng.max_in_flight >= 1
