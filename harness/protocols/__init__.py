"""The wire protocols the harness speaks, by name.

Everything protocol-specific — the readiness and metadata endpoints, request bodies,
answer parsing for the integrity check, the server's statistics — lives in one module
per protocol; the rest of the harness asks the protocol (``WireProtocol`` in
``protocol.py``) and never names an endpoint itself. ``kserve-v2`` (``kserve_v2.py``,
KServe V2 / Open Inference Protocol over REST) is the default; ``openai``
(``openai_wire.py``: OpenAI-compatible chat, streamed token by token) is the other.

``get(NAME)`` finds a registered protocol. A name of the form ``MODULE:ATTRIBUTE``
imports MODULE on first use and takes its ATTRIBUTE — a ``WireProtocol`` instance, or a
subclass (instantiated with no arguments) — so a protocol of one's own needs no change
here: ``--protocol mypackage.echo:EchoProtocol`` (the module must be importable by every
Locust process of the run).
"""

from __future__ import annotations

import importlib

from harness.errors import ConfigError
from harness.protocols.kserve_v2 import KServeV2
from harness.protocols.openai_wire import OpenAIChat
from harness.protocols.protocol import (
    ID_WIDTH,
    BadResponse,
    ClassParams,
    Counters,
    WireProtocol,
)

__all__ = [
    "DEFAULT",
    "ID_WIDTH",
    "BadResponse",
    "ClassParams",
    "Counters",
    "WireProtocol",
    "default",
    "get",
    "names",
    "register",
]

DEFAULT = "kserve-v2"

_registry: dict[str, WireProtocol] = {}


def register(protocol: WireProtocol, name: str | None = None) -> WireProtocol:
    """Make ``protocol`` selectable as ``name`` (default: its own ``name``); the last
    registration of a name wins. Returns it."""
    if not isinstance(protocol, WireProtocol):
        raise TypeError(f"{protocol!r} is not a WireProtocol instance")
    _registry[name or protocol.name] = protocol
    return protocol


def names() -> list[str]:
    """The registered protocols' names, sorted."""
    return sorted(_registry)


def get(name: str) -> WireProtocol:
    """The protocol ``--protocol`` names; a ConfigError (exit 2) naming the valid ones."""
    found = _registry.get(name)
    if found is not None:
        return found
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"--protocol has value {name!r}; valid: {', '.join(names())}, or MODULE:ATTRIBUTE "
            "naming a WireProtocol of one's own"
        )
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--protocol has value {name!r}: {exc}") from None
    if isinstance(obj, type) and issubclass(obj, WireProtocol):
        obj = obj()
    if not isinstance(obj, WireProtocol):
        raise ConfigError(
            f"--protocol has value {name!r}: {attr} is {type(obj).__name__}, not a WireProtocol"
        )
    return register(obj, name)


def default() -> WireProtocol:
    """The protocol spoken when none is named (``kserve-v2``)."""
    return _registry[DEFAULT]


register(KServeV2())
register(OpenAIChat())
