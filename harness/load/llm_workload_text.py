"""Prompts of an exact token count under the shipped tokenizer (harness_reference_server.llm.tokens).

Every word is one of ``VOCABULARY`` (at most four letters, so one token with or without
a leading space): a text of ``n`` words joined by spaces is ``n`` tokens, and a chat
message's content of ``n`` words adds ``n`` tokens to the rendered prompt. The template's
own tokens (``<|user|>\\n`` ... ``<|assistant|>\\n``) are measured once from
``chat_prompt`` itself, so the counts follow the server's template.
"""

from __future__ import annotations

import random
from typing import Any

from harness_reference_server.llm.tokens import VOCABULARY, chat_prompt, count_tokens

MARK = "ba"  # a vocabulary word: one token, never merged with the template's "\n"


def _split_counts(messages: list[dict[str, str]], mark: str = MARK) -> tuple[int, int]:
    """(tokens before, tokens after) the one content equal to ``mark`` in the render."""
    text = chat_prompt(messages)
    before, after = text.split(mark)
    assert count_tokens(text) == count_tokens(before) + 1 + count_tokens(after)
    return count_tokens(before), count_tokens(after)


# a chat request with one user message: <|user|>\n CONTENT \n<|assistant|>\n
USER_OPEN, USER_CLOSE = _split_counts([{"role": "user", "content": MARK}])
CHAT_OVERHEAD = USER_OPEN + USER_CLOSE
# a shared system prompt: <|system|>\n SYSTEM \n<|user|>\n — the part every request of a
# group repeats — has the system words plus SHARED_OVERHEAD tokens
SHARED_OVERHEAD = (
    _split_counts([{"role": "system", "content": MARK}, {"role": "user", "content": "be"}], "be")[0]
    - 1
)


def extended_count(prefix: str, prefix_count: int, text: str) -> int:
    """``count_tokens(text)`` for a ``text`` that may start with ``prefix`` (whose count is
    ``prefix_count``): only the rest is tokenized when no token can span the boundary —
    ``prefix`` ends in a lone newline after a non-space and the rest starts with a
    non-space, or with one space then a non-space (the reference server's answers), as
    each chat turn's rendered prompt extends the one before."""
    rest = text[len(prefix) :]
    head = rest[1:2] if rest[:1] == " " else rest[:1]
    if (
        prefix.endswith("\n")
        and not prefix[-2:-1].isspace()
        and head
        and not head.isspace()
        and text.startswith(prefix)
    ):
        return prefix_count + count_tokens(rest)
    return count_tokens(text)


def words(rng: random.Random, n: int) -> list[str]:
    return rng.choices(VOCABULARY, k=n)


def text_of(ws: list[str]) -> str:
    """The words joined by spaces: ``len(ws)`` tokens."""
    return " ".join(ws)


def user_message(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def system_message(content: str) -> dict[str, Any]:
    return {"role": "system", "content": content}
