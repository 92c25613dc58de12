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

from locust import LoadTestShape

from harness.load.users import ClosedLoopUser, OpenLoopUser


class ScenarioShape(LoadTestShape):
    """Stages of the ``--scenario`` file, on the scenario's clock."""

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
            return slots, float(slots), [OpenLoopUser]
        users = int(stage.users or 1)
        return users, float(max(users, 1)), [ClosedLoopUser]
