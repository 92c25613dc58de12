"""The run lifecycle: named states, the transitions allowed between them, one owner.

A Locust process's harness is always in exactly one ``RunState``; ``Lifecycle.advance``
moves it and refuses (``IllegalTransition``, naming both states) a move its table does
not allow, so a listener firing out of order shows up as an error instead of a flag
silently left set. Two tables, one per role:

master / local runner (``MASTER``)::

    idle ─► preparing ─┬─► ready ─► running ─┬─► completed ─┐
                       │     │               └─► aborted ───┤
                       └─► failed                           ▼
                             └──────────────────────────► draining ─► writing ─► written ─► judged
                                                                                    │
    (the web UI's next start: written or judged ─► preparing) ◄─────────────────────┘

- ``preparing``: SUT, metadata, golden outputs, calibration, the plans out;
- ``failed``: preparation raised; the run measures nothing, its results carry the error;
- ``ready``: plans sent, side tasks started, the shape has not handed out a stage yet;
- ``running``: the shape drives the stages;
- ``completed``: the stages ran out (Locust stops the users);
- ``aborted``: stopped early by the harness itself (the SUT died, a worker failed, a
  thread-sweep restart failed); the cause is recorded;
- ``draining``: the test stopped; waiting for the requests still out and the workers'
  final reports (recordings are still merged);
- ``writing``: recordings closed; side tasks stopped; results.json being written;
- ``written``: the final results.json of the run is on disk;
- ``judged``: ``harness.finish`` turned it into verdicts, reports and the exit code.

A user's stop (SIGTERM, the web UI's stop button) goes from ``preparing``, ``ready`` or
``running`` straight to ``draining``: the run is partial, as it is when aborted.

worker (``WORKER``)::

    idle ─► ready ─► draining ─► reported          (a new plan: back to ready)
      └────────┴──► failed

- ``ready``: a plan arrived, the engine is built; ``draining``: asked for its final
  report, waiting for its requests out; ``reported``: final report sent; ``failed``: the
  plan could not be used, the error was sent to the master instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum


class RunState(Enum):
    IDLE = "idle"
    PREPARING = "preparing"
    FAILED = "failed"
    READY = "ready"
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    DRAINING = "draining"
    WRITING = "writing"
    WRITTEN = "written"
    JUDGED = "judged"
    REPORTED = "reported"  # worker: final report sent


S = RunState

MASTER: Mapping[RunState, frozenset[RunState]] = {
    S.IDLE: frozenset({S.PREPARING}),
    S.PREPARING: frozenset({S.READY, S.FAILED, S.DRAINING}),
    S.FAILED: frozenset({S.DRAINING}),
    S.READY: frozenset({S.RUNNING, S.COMPLETED, S.ABORTED, S.DRAINING}),
    S.RUNNING: frozenset({S.COMPLETED, S.ABORTED, S.DRAINING}),
    S.COMPLETED: frozenset({S.ABORTED, S.DRAINING}),
    S.ABORTED: frozenset({S.DRAINING}),
    S.DRAINING: frozenset({S.WRITING}),
    S.WRITING: frozenset({S.WRITTEN}),
    S.WRITTEN: frozenset({S.JUDGED, S.PREPARING}),
    S.JUDGED: frozenset({S.PREPARING}),
}

WORKER: Mapping[RunState, frozenset[RunState]] = {
    S.IDLE: frozenset({S.READY, S.FAILED, S.DRAINING}),
    S.READY: frozenset({S.READY, S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.REPORTED, S.READY, S.FAILED}),
    S.REPORTED: frozenset({S.READY, S.FAILED}),
    S.FAILED: frozenset({S.READY, S.FAILED}),
}

# master: the test is stopping or stopped; a stop request finalises it
STOPPABLE = frozenset({S.PREPARING, S.FAILED, S.READY, S.RUNNING, S.COMPLETED, S.ABORTED})
# master: the run is live — recordings are merged and the side tasks' greenlets loop
# (from the start of preparation, which sends the plans, until the recording is closed)
COLLECTING = STOPPABLE | {S.DRAINING}
# master: a results.json of this run is final on disk
ON_DISK = frozenset({S.WRITTEN, S.JUDGED})


class IllegalTransition(RuntimeError):
    """A move the lifecycle's table does not allow: a bug in the harness, not a usage error."""

    def __init__(self, role: str, current: RunState, new: RunState) -> None:
        super().__init__(f"{role} run lifecycle: cannot go from {current.value!r} to {new.value!r}")
        self.current = current
        self.new = new


class Lifecycle:
    """One process's run state and the states it passed through since its run began."""

    def __init__(self, table: Mapping[RunState, frozenset[RunState]], role: str) -> None:
        self._table = table
        self.role = role
        self.state = RunState.IDLE
        self.history: list[RunState] = [RunState.IDLE]

    @classmethod
    def master(cls) -> Lifecycle:
        return cls(MASTER, "master")

    @classmethod
    def worker(cls) -> Lifecycle:
        return cls(WORKER, "worker")

    def can(self, new: RunState) -> bool:
        return new in self._table.get(self.state, frozenset())

    def advance(self, new: RunState) -> RunState:
        """Move to ``new``; ``IllegalTransition`` if the table does not allow it."""
        if not self.can(new):
            raise IllegalTransition(self.role, self.state, new)
        if new in (RunState.PREPARING, RunState.READY) and self.state not in (
            RunState.PREPARING,
            RunState.IDLE,
        ):
            self.history = [self.state]  # a new run begins (web UI restart, a new plan)
        self.state = new
        self.history.append(new)
        return new

    def advance_if(self, new: RunState) -> bool:
        """Move to ``new`` when the table allows it; False (and stay) when it does not."""
        if not self.can(new):
            return False
        self.advance(new)
        return True

    def is_in(self, states: Iterable[RunState]) -> bool:
        return self.state in frozenset(states)

    def reached(self, state: RunState) -> bool:
        """Whether this run passed through ``state``."""
        return state in self.history

    def __repr__(self) -> str:
        return f"Lifecycle({self.role}, {self.state.value})"
