"""A JSONL file of requests the user brings, read and checked before any load starts.

One JSON object a line (blank lines are skipped):

- ``{"messages": [{"role": "user", "content": "..."}, ...]}`` — a chat request; a
  message's ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts,
  its ``role`` one of ``ROLES``; other message fields (``name``, ...) are passed through;
- ``{"prompt": "..."}`` — a completions request;
- and optionally ``max_tokens`` (an integer >= 1), ``priority`` (an integer; vLLM's,
  lower is served first) and ``class`` (a traffic-class name).

Any other key, or a line that is not such an object, raises ``ConfigError`` naming
``file:line`` and what is wrong, so a bad file fails the run before the first request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness_reference_server.llm.tokens import message_text

ROLES = ("system", "developer", "user", "assistant", "tool")
KEYS = ("messages", "prompt", "max_tokens", "priority", "class")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The file's requests, in order, each a dict with ``messages`` or ``prompt`` and the
    optional keys it had (JSON-able: they go in the plan as they are)."""
    return [item for _, item in read_jsonl_lines(path)]


def read_jsonl_lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``read_jsonl`` with each request's line number (from 1)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{p}: cannot read the request file ({exc}); give a UTF-8 JSONL file"
        ) from None
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append((number, _item(line, f"{p}:{number}")))
    if not out:
        raise ConfigError(f"{p}: no requests; write one JSON object a line, e.g. {_EXAMPLE}")
    return out


_EXAMPLE = '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}'


def _item(line: str, where: str) -> dict[str, Any]:
    def fail(problem: str) -> ConfigError:
        return ConfigError(f"{where}: {problem}; a line looks like {_EXAMPLE}")

    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise fail(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise fail(f"a JSON {type(doc).__name__}, not an object")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (valid: {', '.join(KEYS)})")
    if ("messages" in doc) == ("prompt" in doc):
        raise fail("give exactly one of 'messages' (chat) and 'prompt' (completions)")
    if "prompt" in doc and (not isinstance(doc["prompt"], str) or not doc["prompt"]):
        raise fail("'prompt' must be a non-empty string")
    if "messages" in doc:
        _check_messages(doc["messages"], fail)
    if "max_tokens" in doc and not _int(doc["max_tokens"], 1):
        raise fail(f"'max_tokens' = {doc['max_tokens']!r} must be an integer >= 1")
    if "priority" in doc and not _int(doc["priority"], None):
        raise fail(f"'priority' = {doc['priority']!r} must be an integer")
    if "class" in doc and (not isinstance(doc["class"], str) or not doc["class"].strip()):
        raise fail(f"'class' = {doc['class']!r} must be a non-empty string")
    return doc


def _check_messages(messages: Any, fail: Callable[[str], ConfigError]) -> None:
    if not isinstance(messages, list) or not messages:
        raise fail("'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise fail(f"messages[{i}] is a JSON {type(m).__name__}, not an object")
        if m.get("role") not in ROLES:
            raise fail(f"messages[{i}].role = {m.get('role')!r} (valid: {', '.join(ROLES)})")
        try:
            message_text(m.get("content"))
        except ValueError:
            raise fail(
                f"messages[{i}].content must be a string or a list of "
                '{"type": "text", "text": ...} parts'
            ) from None


def _int(value: Any, minimum: int | None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)
