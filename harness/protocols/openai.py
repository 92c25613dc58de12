"""The OpenAI-compatible chat / completions codec: request bodies out, stream chunks in.

**Requests.** ``chat_body`` and ``completion_body`` build the JSON bodies of
``POST /v1/chat/completions`` and ``POST /v1/completions`` from a ``Generation`` (the
sampling and streaming fields: ``stream``, ``stream_options.include_usage``,
``max_tokens``, ``ignore_eos``, ``seed``, ``temperature``, ``priority``); a field left
None is left out, so the server's default applies. ``reference_expectation(body)`` is
what the reference server must answer to that body (its output oracle,
``harness_reference_server.llm.tokens``).

**Stream chunks.** ``read_chunk`` turns one server-sent event (``harness.protocols.sse``)
into a typed ``Chunk``. What a chunk may hold, and how it is read:

- ``data: [DONE]`` — the end marker (``done``);
- ``{"error": {...}}`` (or an ``event: error``, or ``"object": "error"``) — an error sent
  after the headers, so under a 200 (``error``: its message);
- ``choices[].delta`` (chat) or ``choices[].text`` (completions): ``role``, ``content``,
  ``reasoning_content`` / ``reasoning``, ``tool_calls`` (their names and argument text),
  ``refusal``, and ``finish_reason``; the choices' text is joined in order (the harness
  asks for one choice);
- ``usage`` (``prompt_tokens``, ``completion_tokens``) on the usage chunk that
  ``include_usage`` adds (``choices: []``), or on every chunk with vLLM's
  ``continuous_usage_stats`` (the last one read is the total);
- anything that is not a JSON object: ``malformed`` (the reason).

A chunk is **token-bearing** when its content, reasoning, tool-call or refusal text is
non-empty: a role chunk (``delta: {"role": "assistant", "content": ""}``), an empty
delta, a finish chunk without text and a usage chunk carry no token.

Pure and stdlib only (``json``); the oracle it imports is stdlib only too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness_reference_server.llm.tokens import Completion, expected_completion

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
DONE = "[DONE]"


@dataclass(frozen=True)
class Generation:
    """The sampling and streaming fields of a request; None leaves a field out."""

    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None  # vLLM / SGLang / the reference server's extension
    priority: int | None = None  # vLLM's: lower is served first
    stream: bool = True
    include_usage: bool = True  # stream_options.include_usage (streams only)

    def fields(self) -> dict[str, Any]:
        """The body fields this sets, in the order OpenAI documents them."""
        out: dict[str, Any] = {}
        for name in ("max_tokens", "temperature", "seed", "ignore_eos", "priority"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["stream"] = self.stream
        if self.stream and self.include_usage:
            out["stream_options"] = {"include_usage": True}
        return out


def chat_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    generation: Generation = Generation(),
    **extra: Any,
) -> dict[str, Any]:
    """The body of a chat request; ``extra`` fields are added as given (they win)."""
    return {"model": model, "messages": [dict(m) for m in messages], **generation.fields(), **extra}


def completion_body(
    model: str,
    prompt: str,
    generation: Generation = Generation(),
    **extra: Any,
) -> dict[str, Any]:
    """The body of a completions request; ``extra`` fields are added as given (they win)."""
    return {"model": model, "prompt": prompt, **generation.fields(), **extra}


def encode_body(body: Mapping[str, Any]) -> bytes:
    """``body`` as compact UTF-8 JSON, as it goes on the wire."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def reference_expectation(body: Mapping[str, Any]) -> Completion:
    """What the reference server answers to ``body`` (a chat body when it has
    ``messages``, else a completions body): its text, tokens, finish reason and prompt
    token count, from the server's own oracle. ``max_completion_tokens`` counts as
    ``max_tokens`` for chat, as the server reads it."""
    limit = body.get("max_tokens")
    if "messages" in body and body.get("max_completion_tokens") is not None:
        limit = body["max_completion_tokens"]
    common = {
        "max_tokens": limit,
        "seed": body.get("seed"),
        "temperature": body.get("temperature"),
        "ignore_eos": bool(body.get("ignore_eos", False)),
    }
    if "messages" in body:
        return expected_completion(messages=body["messages"], **common)
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return expected_completion(prompt=prompt, **common)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(slots=True)  # not frozen: built once per event, frozen init costs ~2 µs
class Chunk:
    """One event of a stream, read. ``content`` is the chat delta's ``content`` or the
    completion's ``text``; the other texts are as named."""

    done: bool = False
    role: str | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: str = ""
    refusal: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    malformed: str | None = None

    @property
    def output_text(self) -> str:
        """Every generated text the chunk carries (what its tokens are counted from)."""
        return self.reasoning + self.content + self.tool_calls + self.refusal

    @property
    def token_bearing(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.refusal)


_DONE_CHUNK = Chunk(done=True)


def read_chunk(data: str, event: str = "message") -> Chunk:
    """The chunk an event's ``data`` (and type) holds; never raises."""
    if data.strip() == DONE:
        return _DONE_CHUNK
    try:
        doc = json.loads(data)
    except ValueError as exc:
        return Chunk(malformed=f"not JSON ({exc}): {data[:80]!r}")
    if not isinstance(doc, dict):
        return Chunk(malformed=f"not a JSON object: {data[:80]!r}")
    if "error" in doc or event == "error" or doc.get("object") == "error":
        return Chunk(error=_error_message(doc))
    choices = doc.get("choices") or []
    if not isinstance(choices, list):
        return Chunk(malformed=f"'choices' is {type(choices).__name__}, not a list")
    role = finish = None
    content = reasoning = tools = refusal = ""
    for choice in choices:
        if not isinstance(choice, dict):
            return Chunk(malformed=f"a choice is {type(choice).__name__}, not an object")
        finish = choice.get("finish_reason") or finish
        delta = choice.get("delta")
        if isinstance(delta, dict):
            role = delta.get("role") or role
            content += _text(delta.get("content"))
            if len(delta) > 1 or "content" not in delta:  # the common token delta skips these
                reasoning += _text(delta.get("reasoning_content") or delta.get("reasoning"))
                tools += _tool_text(delta.get("tool_calls"))
                refusal += _text(delta.get("refusal"))
        else:
            content += _text(choice.get("text"))
    usage = doc.get("usage")
    return Chunk(
        role=role,
        content=content,
        reasoning=reasoning,
        tool_calls=tools,
        refusal=refusal,
        finish_reason=finish,
        usage=None if usage is None else _usage(usage),
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _tool_text(calls: Any) -> str:
    if not isinstance(calls, list):
        return ""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(_text(function.get("name")) + _text(function.get("arguments")))
    return "".join(out)


def _usage(doc: Any) -> Usage | None:
    if not isinstance(doc, dict):
        return None
    prompt, completion = doc.get("prompt_tokens"), doc.get("completion_tokens")
    return Usage(
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


def _error_message(doc: dict[str, Any]) -> str:
    error = doc.get("error", doc)
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        if isinstance(message, str):
            return f"{message} (code {code})" if code is not None else message
    return json.dumps(error)[:200]
