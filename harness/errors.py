"""Typed errors. The library raises them; only ``harness.cli`` prints one line and exits.

Each message names what was wrong (the key or input), the value received, and what is
valid or what to do instead.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The harness's exit codes: the one vocabulary the CLI, the Locust plugin and
    ``harness.finish`` use (docs/checks.md, "From verdicts to one exit code")."""

    PASS = 0  # every scenario judged at least one of its own checks, and none failed
    FAIL = 1  # a check failed (a server that died or could not be reached included)
    USAGE = 2  # usage or configuration error, found before load started
    INVALID = 3  # the measurement cannot be trusted (generator saturated, chaos not applied…)
    NOT_JUDGED = 4  # the run measured nothing its checks could judge: not a pass
    INTERRUPTED = 130  # the CLI was interrupted (Ctrl-C): 128 + SIGINT, the shell's convention

    @classmethod
    def for_verdict(cls, verdict: str | None) -> ExitCode:
        """A results document's verdict as an exit code (an unknown or missing verdict:
        the measurement cannot be trusted)."""
        return _FOR_VERDICT.get(verdict or "", cls.INVALID)


_FOR_VERDICT = {
    "pass": ExitCode.PASS,
    "fail": ExitCode.FAIL,
    "invalid": ExitCode.INVALID,
    "not_judged": ExitCode.NOT_JUDGED,
}


class HarnessError(Exception):
    """Base of every error the harness reports to the user."""

    exit_code = ExitCode.INVALID


class ConfigError(HarnessError):
    """Bad usage, scenario file, checklist or option value (exit 2)."""

    exit_code = ExitCode.USAGE


class ResultFormatError(HarnessError):
    """A results document that cannot be read: wrong schema, unknown version (exit 2)."""

    exit_code = ExitCode.USAGE


class TargetUnavailable(HarnessError):
    """The server under test cannot be reached, would not start, or died (exit 1)."""

    exit_code = ExitCode.FAIL


class InvalidRun(HarnessError):
    """The run judges nothing: the generator saturated, the sampler missed ticks, … (exit 3)."""

    exit_code = ExitCode.INVALID
