"""Parse and validate an OpenAI-style completions or chat request into ``LLMRequest``.

Every invalid request raises ``BadRequest`` naming the field, the value and what is
valid; the app answers it 400 with an OpenAI-style error body before any streaming.
Fields this server does not model (``top_p``, ``stop``, ``logprobs``, ...) are accepted
and ignored, as vLLM ignores what does not apply.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from harness_reference_server.llm.tokens import chat_prompt, effective_seed, message_text, token_ids

ROLES = ("system", "developer", "user", "assistant", "tool")


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


def error_doc(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object (``{"error": {message, type, param, code}}``)."""
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclasses.dataclass(frozen=True)
class LLMRequest:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    ignore_eos: bool
    priority: int
    stream: bool
    include_usage: bool
    deadline_s: float | None


def _field(
    doc: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any, valid: str
) -> Any:
    value = doc.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise BadRequest(f"'{name}' has value {value!r}. Expected {valid}.", name)
    return value


def parse_request(body: bytes, *, chat: bool, model: str, max_model_len: int) -> LLMRequest:
    """The request in ``body`` (a JSON object) for the served ``model``."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    name = doc.get("model")
    if not isinstance(name, str):
        raise BadRequest(f"'model' has value {name!r}. Expected {model!r}.", "model")
    if name != model:
        raise BadRequest(f"The model `{name}` does not exist.", "model", status=404)
    text = _chat_text(doc.get("messages")) if chat else _prompt_text(doc.get("prompt"))
    ids = token_ids(text)
    if len(ids) >= max_model_len:
        raise BadRequest(
            f"the prompt has {len(ids)} tokens. Expected fewer than the model's context "
            f"length, {max_model_len}.",
            "messages" if chat else "prompt",
        )
    n = _field(doc, "n", (int,), 1, "1 (this server generates one choice)")
    if n != 1:
        raise BadRequest(
            f"'n' has value {n!r}. Expected 1 (this server generates one choice).", "n"
        )
    limit_name = (
        "max_completion_tokens" if chat and "max_completion_tokens" in doc else "max_tokens"
    )
    room = max_model_len - len(ids)
    max_tokens = _field(doc, limit_name, (int,), room, "an integer >= 1")
    if max_tokens < 1 or max_tokens > room:
        raise BadRequest(
            f"'{limit_name}' has value {max_tokens!r}. Expected 1 to {room} (the context "
            f"length {max_model_len} minus the prompt's {len(ids)} tokens).",
            limit_name,
        )
    temperature = _field(doc, "temperature", (int, float), 1.0, "a number from 0 to 2")
    if not 0 <= temperature <= 2:
        raise BadRequest(
            f"'temperature' has value {temperature!r}. Expected a number from 0 to 2.",
            "temperature",
        )
    seed = _field(doc, "seed", (int,), None, "an integer")
    stream = _field(doc, "stream", (bool,), False, "true or false")
    options = _field(doc, "stream_options", (dict,), {}, "an object")
    if options and not stream:
        raise BadRequest(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options"
        )
    include_usage = _field(options, "include_usage", (bool,), False, "true or false")
    deadline = _field(doc, "deadline_s", (int, float), None, "a number of seconds > 0")
    if deadline is not None and deadline <= 0:
        raise BadRequest(
            f"'deadline_s' has value {deadline!r}. Expected a number of seconds > 0.", "deadline_s"
        )
    return LLMRequest(
        chat=chat,
        prompt_ids=ids,
        max_tokens=max_tokens,
        seed=effective_seed(seed, temperature),
        ignore_eos=_field(doc, "ignore_eos", (bool,), False, "true or false"),
        priority=_field(doc, "priority", (int,), 0, "an integer (lower is served first)"),
        stream=stream,
        include_usage=include_usage,
        deadline_s=deadline,
    )


def _chat_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest(
            f"'messages' has value {messages!r}. Expected a non-empty list of messages.", "messages"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(
                f"'messages[{i}]' has value {m!r}. Expected an object with 'role' one of {', '.join(ROLES)}.",
                f"messages[{i}]",
            )
        try:
            message_text(m.get("content") or "")
        except ValueError as exc:
            raise BadRequest(f"'messages[{i}].content': {exc}.", f"messages[{i}].content") from None
    return chat_prompt(messages)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest(
            f"'prompt' has value {prompt!r}. Expected a string (one prompt per request).", "prompt"
        )
    return prompt
