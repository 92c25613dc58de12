"""Typed errors. The library raises them; only ``harness.cli`` prints one line and exits.

Each message names what was wrong (the key or input), the value received, and what is
valid or what to do instead.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness reports to the user."""

    exit_code = 3


class ConfigError(HarnessError):
    """Bad usage, scenario file, checklist or option value (exit 2)."""

    exit_code = 2


class ResultFormatError(HarnessError):
    """A results document that cannot be read: wrong schema, unknown version (exit 2)."""

    exit_code = 2


class TargetUnavailable(HarnessError):
    """The server under test cannot be reached, would not start, or died (exit 1)."""

    exit_code = 1


class InvalidRun(HarnessError):
    """The run judges nothing: the generator saturated, the sampler missed ticks, … (exit 3)."""

    exit_code = 3
