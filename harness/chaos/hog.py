"""CPU hogs: K busy-loop processes pinned to the SUT's cores.

Each hog is a fresh ``python -S -c`` process that (1) asks the kernel to SIGKILL it when
its parent dies (``PR_SET_PDEATHSIG`` via prctl — note: tied to the *thread* that spawned
it, so spawn from a thread that outlives the hog, as the timeline does), (2) pins itself,
and (3) exits by itself ``duration + grace`` seconds later, so a hog never outlives its
purpose even if the harness is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psutil

from harness.chaos.base import Action, ChaosTarget, target_cores
from harness.collectors.run_processes import HOG_COMM
from harness.errors import ConfigError

# argv: deadline seconds, expected parent pid, core ("-" = not pinned), process name
HOG_CODE = """
import ctypes, os, signal, sys, time
deadline, parent, core = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
try:
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    libc.prctl(15, sys.argv[4].encode())  # PR_SET_NAME: not counted as load generator CPU
except Exception:
    pass
if os.getppid() != parent:  # the parent died before prctl took effect
    sys.exit(0)
if core != "-":
    os.sched_setaffinity(0, {int(core)})
end = time.monotonic() + deadline
while time.monotonic() < end:
    for _ in range(20000):
        pass
"""


def _observe(p: subprocess.Popen) -> tuple[float | None, list[int] | None]:
    """A live hog's own CPU seconds and the cores it may run on; None once it is gone."""
    if p.poll() is not None:
        return None, None
    try:
        proc = psutil.Process(p.pid)
        t = proc.cpu_times()
        affinity = sorted(proc.cpu_affinity())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None, None
    return round(t.user + t.system, 2), affinity


def spawn_hog(seconds: float, core: int | None) -> subprocess.Popen:
    """One self-terminating busy process (optionally pinned to ``core``)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-c",
            HOG_CODE,
            str(seconds),
            str(os.getpid()),
            "-" if core is None else str(core),
            HOG_COMM,
        ],  # fmt: skip
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the harness's group is handled by the harness
    )


class CpuHog(Action):
    """``cores`` busy processes, round-robin over ``pin`` (None: not pinned)."""

    name = "cpu_hog"

    def __init__(
        self,
        cores: int,
        duration_s: float,
        pin: Sequence[int] | None = None,
        grace_s: float = 2.0,
    ) -> None:
        super().__init__(duration_s)
        if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
            raise ConfigError(f"cpu_hog.cores has value {cores!r}. Valid: an integer ≥ 1")
        if not duration_s or duration_s <= 0:
            raise ConfigError(f"cpu_hog.duration_s has value {duration_s!r}. Valid: seconds > 0")
        # Any online core, not just ours: the harness itself may be pinned to the load
        # generator's cores while the hogs go to the SUT's.
        allowed = set(range(os.cpu_count() or 1))
        if pin is not None:
            bad = [c for c in pin if c not in allowed]
            if bad or not pin:
                raise ConfigError(
                    f"cpu_hog.pin has value {list(pin)!r}. Valid: a non-empty list of cores "
                    f"from {sorted(allowed)}"
                )
        self.cores = cores
        self.pin = tuple(pin) if pin is not None else None
        self.grace_s = grace_s
        self.procs: list[subprocess.Popen] = []
        self._cores_used: list[int | None] = []

    @classmethod
    def for_target(cls, target: ChaosTarget, params: dict[str, Any]) -> CpuHog:
        """From scenario params: ``cores`` int or "sut"; ``pin`` "sut", "none" or a list."""
        sut_cores = target_cores(target)
        cores = params.get("cores", "sut")
        pin = params.get("pin", "sut")
        n = len(sut_cores) if cores == "sut" else cores
        pins = list(sut_cores) if pin == "sut" else (None if pin in ("none", None) else pin)
        return cls(cores=n, duration_s=float(params.get("duration_s", 0.0)), pin=pins)

    @property
    def params(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "pin": list(self.pin) if self.pin is not None else None,
            "duration_s": self.duration_s,
        }

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self.procs]

    def _apply(self) -> None:
        assert self.duration_s is not None
        for i in range(self.cores):
            core = self.pin[i % len(self.pin)] if self.pin else None
            with self._lock:
                if self._reverted:
                    return
                self.procs.append(spawn_hog(self.duration_s + self.grace_s, core))
                self._cores_used.append(core)
        self.detail["pids"] = self.pids()
        self.detail["cores_used"] = list(self._cores_used)

    def _revert(self) -> None:
        with self._lock:
            procs = list(self.procs)
        cpu_s: list[float | None] = []
        affinity: list[list[int] | None] = []
        for p in procs:
            cpu, cores = _observe(p)
            cpu_s.append(cpu)
            affinity.append(cores)
            with contextlib.suppress(ProcessLookupError):
                p.kill()  # Popen.kill skips a child already reaped, so a reused pid is safe
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5.0)
        # Proof the hogs ran where asked: their own CPU seconds and the cores they were
        # allowed, observed just before the kill (None for a hog already gone).
        self.detail["hog_cpu_s"] = cpu_s
        self.detail["affinity"] = affinity
