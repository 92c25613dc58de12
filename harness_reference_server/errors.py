"""Errors raised inside the reference server (it imports nothing of ``harness``)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A command-line option has an invalid value; the message names flag, value, valid."""
