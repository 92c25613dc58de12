"""Chaos actions (each with apply and revert) and the timeline that runs and undoes them."""

from harness.chaos.base import Action, ChaosTarget, target_cores
from harness.chaos.hog import CpuHog, spawn_hog
from harness.chaos.kill import KillRestart
from harness.chaos.pause import Pause
from harness.chaos.terminate import Terminate
from harness.chaos.timeline import DEFAULT_ACTIONS, Timeline, normalize_events

__all__ = [
    "DEFAULT_ACTIONS",
    "Action",
    "ChaosTarget",
    "CpuHog",
    "KillRestart",
    "Pause",
    "Terminate",
    "Timeline",
    "normalize_events",
    "spawn_hog",
    "target_cores",
]
