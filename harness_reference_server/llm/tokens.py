"""The LLM server's tokenizer and its output oracle: pure, deterministic, stdlib only.

A client imports this module to recompute what the server must answer: the prompt's
token count (``usage.prompt_tokens``), the completion's text, its token count and its
``finish_reason``. Nothing here reads a clock, a file or the network.

**Tokenizer.** A word-level scheme shaped like GPT-2's pre-tokenizer: a piece is an
optional space followed by a run of letters, a run of 1-3 digits, a run of other
non-space characters, or whitespace; a letter run longer than ``MAX_PIECE`` characters
is cut into pieces of ``MAX_PIECE``. Each piece is one token; its id is the CRC-32 of its
UTF-8 bytes. English prose comes out at about 1.2-1.4 tokens per word, as with a BPE
vocabulary. A chat request is tokenized after ``chat_prompt`` renders its messages.

**Output.** Token ``i`` of a completion is a function of (the prompt's token ids, the
seed, ``i``) only: a BLAKE2b hash names a word of ``VOCABULARY`` or, one time in
``EOS_ODDS``, the end of sequence. The request's seed is used when its temperature is
above 0; a greedy request (temperature 0) and a request without a seed use seed 0.
Every generated token is one vocabulary word with a leading space, so the text of a
completion re-tokenizes to exactly the tokens generated (multi-turn prompts that quote an
earlier answer stay block-aligned with it). The end-of-sequence token is neither sent
nor counted in ``usage.completion_tokens``.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_PIECE = 8
EOS_ODDS = 256  # one token in EOS_ODDS ends the sequence: a mean natural length of 256
DEFAULT_MAX_MODEL_LEN = 4096

_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70
# 70 one-syllable, 4,900 two-syllable words: every one a single token (<= MAX_PIECE letters)
VOCABULARY: tuple[str, ...] = tuple(_SYLLABLES) + tuple(
    a + b for a in _SYLLABLES for b in _SYLLABLES
)


def tokenize(text: str) -> list[str]:
    """The pieces of ``text``, in order; ``"".join(tokenize(t)) == t`` for every ``t``."""
    pieces: list[str] = []
    for match in _PIECE.finditer(text):
        piece = match.group()
        if len(piece) <= MAX_PIECE or not piece.strip().isalpha():
            pieces.append(piece)
            continue
        pieces.extend(piece[i : i + MAX_PIECE] for i in range(0, len(piece), MAX_PIECE))
    return pieces


def token_ids(text: str) -> list[int]:
    """The token ids of ``text`` (CRC-32 of each piece)."""
    return [zlib.crc32(piece.encode()) for piece in tokenize(text)]


def count_tokens(text: str) -> int:
    return len(tokenize(text))


def message_text(content: Any) -> str:
    """A chat message's content as text: a string, or the ``text`` of a list of
    ``{"type": "text", "text": ...}`` parts joined; ValueError for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ValueError("content must be a string or a list of text parts")


def chat_prompt(messages: Iterable[Mapping[str, Any]]) -> str:
    """The text a chat request is tokenized as: each message as ``<|role|>\\ncontent\\n``,
    then ``<|assistant|>\\n`` (the generation prompt)."""
    parts = [f"<|{m['role']}|>\n{message_text(m.get('content') or '')}\n" for m in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def effective_seed(seed: int | None, temperature: float | None) -> int:
    """The seed the output is drawn with: the request's when sampling (temperature > 0,
    as OpenAI's default of 1), else 0."""
    if seed is None or (temperature is not None and temperature == 0):
        return 0
    return seed


def stream_key(prompt_ids: Sequence[int], seed: int) -> bytes:
    """A 16-byte digest of (prompt token ids, seed): the output's only input."""
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<q", seed))
    h.update(struct.pack(f"<{len(prompt_ids)}I", *prompt_ids))
    return h.digest()


def token_at(key: bytes, position: int) -> tuple[str, bool]:
    """Token ``position`` (0-based) of the completion keyed by ``key``: (its text, whether
    it is the end of sequence). The text is a word even at an end of sequence, which is
    what a request with ``ignore_eos`` receives there."""
    n = int.from_bytes(
        hashlib.blake2b(key + position.to_bytes(4, "little"), digest_size=8).digest(), "little"
    )
    return " " + VOCABULARY[(n >> 8) % len(VOCABULARY)], n % EOS_ODDS == 0


@dataclass(frozen=True)
class Completion:
    """What the server must answer for a request."""

    text: str
    tokens: tuple[str, ...]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


def generate(prompt_ids: Sequence[int], seed: int, max_tokens: int, ignore_eos: bool) -> Completion:
    """The completion of ``prompt_ids``: tokens until the end of sequence (unless
    ``ignore_eos``) or ``max_tokens``."""
    key = stream_key(prompt_ids, seed)
    out: list[str] = []
    reason = "length"
    for i in range(max_tokens):
        text, eos = token_at(key, i)
        if eos and not ignore_eos:
            reason = "stop"
            break
        out.append(text)
    return Completion("".join(out), tuple(out), reason, len(prompt_ids))


def expected_completion(
    *,
    prompt: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    temperature: float | None = None,
    ignore_eos: bool = False,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> Completion:
    """What the server answers to a completions request (``prompt``) or a chat request
    (``messages``) with these fields: a client's check of a stream's content, length,
    ``usage`` and ``finish_reason``. Without ``max_tokens`` the completion may run to the
    model's context length (``max_model_len`` minus the prompt), as vLLM's."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt and messages")
    text = prompt if prompt is not None else chat_prompt(messages or ())
    ids = token_ids(text)
    limit = max_model_len - len(ids) if max_tokens is None else max_tokens
    return generate(ids, effective_seed(seed, temperature), limit, ignore_eos)
