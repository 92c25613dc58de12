"""The server command the harness starts (``--sut-cmd``): its placeholders, checked once.

The harness picks the port, so ``{port}`` must be in the command; ``{threads}`` is filled
with the stage's thread count where a scenario sweeps it. ``harness tune`` adds one
placeholder per ``--space`` dimension and passes their names as ``extra``.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from harness.errors import ConfigError

# the placeholders the harness fills itself
FILLED = ("port", "threads")


def placeholders(cmd: str) -> set[str]:
    """The ``{NAME}`` fields of ``cmd`` (a ConfigError naming the flag for a malformed one)."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(cmd) if f is not None}
    except ValueError as e:
        raise ConfigError(
            f"--sut-cmd has value {cmd!r}: bad placeholder ({e}); write a literal brace as "
            "{{ or }}"
        ) from None


def check_command(cmd: str, extra: Iterable[str] = ()) -> None:
    """``cmd`` has a ``{port}`` placeholder and no placeholder other than ``{port}``,
    ``{threads}`` and ``extra``; otherwise a ConfigError (exit 2) naming the fix."""
    fields = placeholders(cmd)
    if "port" not in fields:
        raise ConfigError(
            f"--sut-cmd has value {cmd!r}: no {{port}} placeholder; the harness picks "
            'a free port, e.g. --sut-cmd "python -m harness_reference_server --port {port}"'
        )
    valid = (*FILLED, *extra)
    unknown = sorted(f for f in fields if f not in valid)
    if unknown:
        raise ConfigError(
            f"--sut-cmd has value {cmd!r}: bad placeholder "
            f"{', '.join('{' + u + '}' for u in unknown)}. Valid placeholders: "
            f"{', '.join('{' + v + '}' for v in valid)} (write a literal brace as {{{{ or }}}})"
        )
