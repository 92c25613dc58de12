"""The LoadTestShape that drives a scenario's stages.

Time is the scenario's own clock (seconds since its shared t = 0, set by the master when
it prepared the run), not Locust's shape clock, so the shape, the workers' open-loop
schedules and the chaos timeline all agree on when a stage starts.

- open-loop stage: one ``OpenLoopUser`` per load process — it only runs that process's
  scheduler; the rate lives in the schedule every process computes from the scenario;
- closed-loop stage: ``users`` ``ClosedLoopUser``s;
- after the last stage: ``None`` (Locust stops the test; the plugin then waits for the
  requests still out and writes the results).

The first ``tick()`` prepares the run (SUT, metadata, golden outputs, calibration, plan to
the workers): Locust calls ``tick()`` before it starts anything, so this is the one place
that runs before the first spawn message on every kind of runner.
"""

from __future__ import annotations

import gevent
from locust import LoadTestShape

from harness.load.users import ClosedLoopUser, OpenLoopUser

# how often Locust's shape worker calls tick() (locust.runners.Runner.shape_worker)
TICK_S = 1.0


class ScenarioShape(LoadTestShape):
    """Stages of the ``--scenario`` file, on the scenario's clock."""

    _last: tuple[int, float, list[type]] | None = None

    def tick(self) -> tuple[int, float, list[type]] | None:
        state = getattr(self.runner.environment, "harness", None)
        if state is None:
            return None
        if not state.prepare():
            return None  # preparation failed or the run stopped; the cause is in the results
        stage = state.shape_tick()  # moves the run to running, or completed at the end
        if stage is None:
            return None
        if stage.kind == "open":
            slots = state.slots
            now: tuple[int, float, list[type]] = (slots, float(slots), [OpenLoopUser])
        else:
            users = int(stage.users or 1)
            now = (users, float(max(users, 1)), [ClosedLoopUser])
        left = state.scenario.duration_s - state.scenario_time()
        if now == self._last and 0 < left < TICK_S:
            # Locust ticks once a second from when preparation ended, not on the scenario's
            # clock: without this the run would idle up to a second past its last stage
            # (a peak point in five measured seconds spent one in ten doing nothing)
            gevent.sleep(left)
            if state.shape_tick() is None:
                return None
        self._last = now
        return now
