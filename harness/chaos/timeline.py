"""Run chaos events at their offsets, record when each began and ended, and always undo them.

Undo happens in four places, whichever comes first: the event's own end, the runner's
``finally``, an ``atexit`` hook, and SIGINT/SIGTERM handlers (installed only when started
from the main thread; they chain to the previous handler). Only threading primitives are
used, which gevent patches, so the runner can live inside a Locust process; it waits on an
Event until the next due time, never sleeping longer than needed.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.chaos.base import Action, ChaosTarget
from harness.chaos.hog import CpuHog
from harness.chaos.kill import KillRestart
from harness.chaos.pause import Pause
from harness.chaos.proxy import NetworkFault
from harness.chaos.terminate import Terminate
from harness.errors import ConfigError
from harness.primitives import trapped_signals

ActionFactory = Callable[[ChaosTarget, dict[str, Any]], Action]

DEFAULT_ACTIONS: Mapping[str, ActionFactory] = {
    "cpu_hog": CpuHog.for_target,
    "pause": Pause.for_target,
    "kill": KillRestart.for_target,
    "terminate": Terminate.for_target,
    "network": NetworkFault.for_target,
}


def _event_wait(stop: threading.Event, timeout: float) -> None:
    stop.wait(timeout)


def normalize_events(events: Iterable[Any]) -> list[tuple[float, str, dict[str, Any]]]:
    """Accept ``(offset_s, action, params)`` tuples or scenario ``ChaosEvent`` objects
    (``at_s``, ``action``, ``params``, ``duration_s``); duration goes into params."""
    out = []
    for i, ev in enumerate(events):
        if hasattr(ev, "at_s"):
            params = dict(ev.params)
            params.setdefault("duration_s", ev.duration_s)
            out.append((float(ev.at_s), str(ev.action), params))
        else:
            try:
                offset, action, params = ev
            except (TypeError, ValueError):
                raise ConfigError(
                    f"chaos[{i}] has value {ev!r}. Valid: (offset_s, action, params)"
                ) from None
            if not isinstance(offset, int | float) or offset < 0:
                raise ConfigError(f"chaos[{i}].offset_s has value {offset!r}. Valid: seconds ≥ 0")
            out.append((float(offset), str(action), dict(params or {})))
    return sorted(out, key=lambda e: e[0])


class Timeline:
    """Execute chaos ``events`` against ``target``; ``records`` holds one dict per started event:
    ``{action, params, at_s, start_s, end_s, ok, error, detail}`` (seconds since ``start()``;
    ``at_s`` is the planned offset, ``start_s``/``end_s`` when it really began and ended).
    """

    def __init__(
        self,
        events: Iterable[Any],
        target: ChaosTarget,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[threading.Event, float], None] = _event_wait,
        actions: Mapping[str, ActionFactory] = DEFAULT_ACTIONS,
        handle_signals: bool = True,
    ) -> None:
        self.events = normalize_events(events)
        for i, (_, name, _) in enumerate(self.events):
            if name not in actions:
                raise ConfigError(
                    f"chaos[{i}].action has value {name!r}. Valid: {', '.join(actions)}"
                )
        self.target = target
        # Build every action now so a bad parameter is a ConfigError before the run starts.
        self._planned: list[Action] = []
        for i, (_, name, params) in enumerate(self.events):
            try:
                self._planned.append(actions[name](target, dict(params)))
            except ConfigError as e:
                raise ConfigError(f"chaos[{i}] ({name}): {e}") from None
        self.clock = clock
        self.wait = wait
        self.actions = actions
        self.handle_signals = handle_signals
        self.stop_event = threading.Event()
        self.done = threading.Event()
        self.records: list[dict[str, Any]] = []
        self.t0: float | None = None
        self._lock = threading.RLock()
        # Held for a whole revert, so a signal handler's revert_all() waits for a revert the
        # runner thread is doing instead of returning (and letting the process exit) early.
        self._revert_lock = threading.RLock()
        self._active: dict[int, Action] = {}  # record index → applied, not yet reverted
        self._thread: threading.Thread | None = None
        # the signal trap while armed, and the handlers it replaced (chained to)
        self._trap: contextlib.ExitStack | None = None
        self._prev_handlers: dict[int, Any] = {}

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, t0: float | None = None) -> Timeline:
        """Run on a daemon thread; offsets count from ``t0`` (default: now)."""
        self._arm(t0)
        self._thread = threading.Thread(target=self._run, name="chaos-timeline", daemon=True)
        self._thread.start()
        return self

    def run(self, t0: float | None = None) -> list[dict[str, Any]]:
        """Run in the calling thread until every event has ended (or ``stop()``)."""
        self._arm(t0)
        self._run()
        return self.records

    def stop(self, timeout: float | None = 30.0) -> list[dict[str, Any]]:
        """Stop early: revert everything now, then wait for the runner to finish."""
        self.stop_event.set()
        self.revert_all("stopped")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._disarm()  # the runner thread cannot restore signal handlers; the main thread can
        return self.records

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def __enter__(self) -> Timeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _arm(self, t0: float | None) -> None:
        self.t0 = self.clock() if t0 is None else t0
        atexit.register(self.revert_all, "exit")
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            self._trap = contextlib.ExitStack()
            self._prev_handlers = self._trap.enter_context(trapped_signals(self._on_signal))

    def _disarm(self) -> None:
        atexit.unregister(self.revert_all)
        if self._trap is not None and threading.current_thread() is threading.main_thread():
            self._trap.close()  # the handlers before are back
            self._trap, self._prev_handlers = None, {}

    def _on_signal(self, signum: int) -> None:
        self.stop_event.set()
        self.revert_all(signal.Signals(signum).name)
        prev = self._prev_handlers.get(signum)
        if callable(prev):
            prev(signum, None)  # the interrupted frame is not passed on
        elif prev == signal.SIG_IGN:
            return
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    # -- the schedule ---------------------------------------------------------------------

    def _now(self) -> float:
        assert self.t0 is not None
        return self.clock() - self.t0

    def _run(self) -> None:
        # heap of (due_s, seq, kind, event index or record index)
        heap: list[tuple[float, int, str, int]] = []
        for i, (offset, _, _) in enumerate(self.events):
            heapq.heappush(heap, (offset, i, "apply", i))
        seq = len(self.events)
        try:
            while heap and not self.stop_event.is_set():
                due, _, kind, idx = heap[0]
                remaining = due - self._now()
                if remaining > 0:
                    self.wait(self.stop_event, remaining)
                    continue
                heapq.heappop(heap)
                if kind == "apply":
                    rec_idx, duration = self._apply(idx)
                    if rec_idx is not None:
                        start = self.records[rec_idx]["start_s"]
                        seq += 1
                        heapq.heappush(heap, (start + (duration or 0.0), seq, "revert", rec_idx))
                else:
                    self._revert(idx)
        finally:
            self.revert_all("stopped" if self.stop_event.is_set() else None)
            self._disarm()
            self.done.set()

    def _apply(self, event_idx: int) -> tuple[int | None, float | None]:
        offset, name, params = self.events[event_idx]
        rec: dict[str, Any] = {
            "action": name,
            "params": dict(params),
            "at_s": offset,
            "start_s": round(self._now(), 4),
            "end_s": None,
            "ok": True,
            "error": None,
            "detail": {},
        }
        action = self._planned[event_idx]
        rec["params"] = action.params
        with self._lock:
            if self.stop_event.is_set():
                return None, None
            self.records.append(rec)
            idx = len(self.records) - 1
            self._active[idx] = action
        try:
            action.apply()
        except Exception as e:
            rec.update(ok=False, error=f"apply: {type(e).__name__}: {e}")
            self._revert(idx)
            return None, None
        finally:
            rec["detail"] = action.detail
        return idx, action.duration_s

    def _revert(self, rec_idx: int, reason: str | None = None) -> None:
        with self._revert_lock:
            self._revert_locked(rec_idx, reason)

    def _revert_locked(self, rec_idx: int, reason: str | None) -> None:
        with self._lock:
            action = self._active.pop(rec_idx, None)
        if action is None:
            return
        rec = self.records[rec_idx]
        try:
            action.revert()
        except Exception as e:
            rec["ok"] = False
            msg = f"revert: {type(e).__name__}: {e}"
            rec["error"] = f"{rec['error']}; {msg}" if rec["error"] else msg
        rec["end_s"] = round(self._now(), 4) if self.t0 is not None else None
        rec["detail"] = action.detail | ({"interrupted": reason} if reason else {})

    def revert_all(self, reason: str | None = None) -> None:
        """Undo every applied action now (idempotent; safe from handlers and atexit)."""
        with self._revert_lock:
            with self._lock:
                pending = sorted(self._active, reverse=True)
            for idx in pending:
                self._revert_locked(idx, reason)
