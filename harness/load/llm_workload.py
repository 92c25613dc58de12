"""What an LLM load sends: seeded token workloads built as OpenAI-compatible request bodies.

Four workloads (``WorkloadConfig.workload``):

- ``synthetic`` — ``requests`` prompts whose token counts are drawn from ``input`` and
  whose ``max_tokens`` are drawn from ``output`` (``harness.load.llm_workload_lengths``);
- ``shared_prefix`` — ``groups`` groups, each with a head of exactly ``prefix_tokens``
  tokens (chat: the group's system prompt and the template around it; a multiple of
  ``block_size``, so a prefix cache reuses it whole) that all its requests repeat,
  followed by a per-request suffix of ``input`` tokens; the requests of the groups are
  interleaved in a seeded order;
- ``multi_turn`` — ``conversations`` conversations of ``turns`` turns (a length spec
  too); each turn adds ``input`` tokens to the conversation and carries every earlier
  user message and the assistant's actual answer (``Conversation``);
- ``jsonl`` — the requests of the user's ``file`` (``harness.load.llm_workload_jsonl``),
  each line's ``max_tokens`` kept, else drawn from ``output``.

**Exact lengths.** A prompt is built from vocabulary words so that, under the shipped
tokenizer (``harness_reference_server.llm.tokens``), the completions prompt or the rendered chat
prompt has exactly the drawn token count, which each ``LlmRequest`` carries as
``prompt_tokens`` (input tokens/s need no ``usage``). Against the reference server this is
``usage.prompt_tokens``; a server with another tokenizer counts the same text differently.
Each body asks ``max_tokens`` = the drawn output length with ``ignore_eos: true``: servers
that honour ``ignore_eos`` (vLLM, SGLang, the reference server) then send exactly that
many tokens; others may stop early at an end of sequence.

**One plan, every process.** ``build_plan`` (on the master) draws every length from the
seed and returns a JSON-able plan; ``requests_from_plan`` / ``conversations_from_plan``
(on each worker) rebuild the same bodies from it: the text of request ``i`` is a function
of (seed, ``i``, its lengths) only.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.load import llm_workload_text as tx
from harness.load.llm_workload_jsonl import read_jsonl_lines
from harness.load.llm_workload_lengths import LengthSpec, parse_length
from harness.load.stream_aborts import DEFAULT_AFTER
from harness.load.toml_table import Table
from harness.protocols.openai import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    Generation,
    chat_body,
    completion_body,
    encode_body,
    reference_expectation,
)
from harness_reference_server.llm.tokens import chat_prompt, count_tokens

SCHEMA = "harness.llm_workload/1"
WORKLOADS = ("synthetic", "shared_prefix", "multi_turn", "jsonl")
APIS = ("chat", "completions")


@dataclass(frozen=True)
class WorkloadConfig:
    """A validated workload (``config_from_table`` reads one from a TOML table or options)."""

    workload: str = "synthetic"
    api: str = "chat"
    input: LengthSpec = parse_length("normal:mean=256,stdev=100,min=16,max=1024")
    output: LengthSpec = parse_length("normal:mean=256,stdev=100,min=1,max=1024")
    requests: int = 1000  # synthetic, shared_prefix
    groups: int = 4  # shared_prefix
    prefix_tokens: int = 512  # shared_prefix: a multiple of block_size
    conversations: int = 8  # multi_turn
    turns: LengthSpec = parse_length(4)  # multi_turn
    file: str | None = None  # jsonl
    seed: int = 0
    ignore_eos: bool = True
    # ask for the usage chunk (stream_options.include_usage); False for a server that
    # never sends one (llama-cpp-python): its absence is then no problem, and the tokens
    # are counted one per token-bearing event
    include_usage: bool = True
    block_size: int = 16
    max_context: int | None = None  # the server's context length: longer requests refused
    # client aborts (harness.load.stream_aborts): the share of streams that hang up, after
    # how many token events, in which stages (empty: every stage)
    abort_share: float = 0.0
    abort_after: LengthSpec = parse_length(DEFAULT_AFTER)
    abort_stages: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlmRequest:
    """One request: where it goes, its body, and what it asks for."""

    path: str  # CHAT_PATH or COMPLETIONS_PATH
    body: dict[str, Any]
    prompt_tokens: int  # under the shipped tokenizer
    max_tokens: int | None
    traffic_class: str | None = None
    group: int | None = None  # shared_prefix: the group whose prefix it repeats

    def encoded(self) -> bytes:
        return encode_body(self.body)


def config_from_table(data: Mapping[str, Any], src: str, where: str = "llm") -> WorkloadConfig:
    """The workload a TOML table (or a dict of CLI options) describes; ConfigError naming
    the key, the value and the fix, before any load starts."""
    d = WorkloadConfig()
    t = Table(data, where, src, [f for f in WorkloadConfig.__dataclass_fields__])

    def spec(key: str, default: LengthSpec) -> LengthSpec:
        value = t.take(key)
        return default if value is None else parse_length(value, t.key(key))

    cfg = WorkloadConfig(
        workload=t.string("workload", d.workload, WORKLOADS),
        api=t.string("api", d.api, APIS),
        input=spec("input", d.input),
        output=spec("output", d.output),
        requests=t.number("requests", d.requests, positive=True, integer=True),
        groups=t.number("groups", d.groups, positive=True, integer=True),
        prefix_tokens=t.number("prefix_tokens", d.prefix_tokens, positive=True, integer=True),
        conversations=t.number("conversations", d.conversations, positive=True, integer=True),
        turns=spec("turns", d.turns),
        file=t.string("file", None),
        seed=t.number("seed", d.seed, integer=True),
        ignore_eos=t.boolean("ignore_eos", d.ignore_eos),
        include_usage=t.boolean("include_usage", d.include_usage),
        block_size=t.number("block_size", d.block_size, positive=True, integer=True),
        max_context=t.number("max_context", None, positive=True, integer=True),
        abort_share=float(t.number("abort_share", d.abort_share, minimum=0)),
        abort_after=spec("abort_after", d.abort_after),
        abort_stages=_names(t, "abort_stages"),
    )
    if cfg.abort_share > 1:
        t.fail("abort_share", cfg.abort_share, "must be ≤ 1; use a share of the streams, 0-1")
    check(cfg, f"{src}: {where}")
    return cfg


def _names(t: Table, key: str) -> tuple[str, ...]:
    value = t.take(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        t.fail(key, value, 'is not a list of stage names; write e.g. ["storm"]')
    return tuple(value)


def check(cfg: WorkloadConfig, where: str = "llm") -> None:
    """ConfigError when ``cfg`` can draw a length its workload cannot build."""
    chat = cfg.api == "chat"
    if cfg.workload == "jsonl":
        if not cfg.file:
            raise ConfigError(
                f"{where}.file is missing; the jsonl workload reads its requests there"
            )
        return
    if cfg.workload == "multi_turn" and not chat:
        raise ConfigError(f"{where}.api = 'completions': multi_turn needs api = 'chat'")
    if cfg.workload == "synthetic":
        least = tx.CHAT_OVERHEAD + 1 if chat else 1
        why = "a chat prompt's template and one word" if chat else "one word"
    elif cfg.workload == "shared_prefix":
        least = tx.USER_CLOSE + 1 if chat else 1
        why = "the user's word and the generation prompt" if chat else "one word"
        lowest = (
            cfg.block_size * (-(-(tx.SHARED_OVERHEAD + 1) // cfg.block_size))
            if chat
            else cfg.block_size
        )
        if cfg.prefix_tokens % cfg.block_size or cfg.prefix_tokens < lowest:
            raise ConfigError(
                f"{where}.prefix_tokens = {cfg.prefix_tokens}: use a multiple of block_size "
                f"({cfg.block_size}) of at least {lowest}, so a prefix cache reuses it whole"
            )
    else:
        least = tx.CHAT_OVERHEAD + 2
        why = "a turn's template and one word"
    if cfg.input.low < least:
        raise ConfigError(
            f"{where}.input = {cfg.input.text!r} can draw {cfg.input.low} tokens; the "
            f"{cfg.workload} workload needs at least {least} ({why}): raise its min"
        )
    if cfg.max_context is not None:
        _check_context(cfg, where)


def longest_request(cfg: WorkloadConfig) -> int:
    """The most tokens one request of ``cfg`` can hold, prompt and ``max_tokens`` (a
    multi-turn conversation's answers counted at ``max_tokens``), in the harness's
    tokens; 0 for a ``jsonl`` file (its requests are counted when it is read)."""
    most = (cfg.input.high or 0) + (cfg.output.high or 0)
    if cfg.workload == "shared_prefix":
        most += cfg.prefix_tokens
    elif cfg.workload == "multi_turn":
        most *= cfg.turns.high or 1
    return most


def _check_context(cfg: WorkloadConfig, where: str) -> None:
    """ConfigError when a request can hold more than ``max_context`` tokens (prompt and
    ``max_tokens``; a multi-turn conversation's answers counted at ``max_tokens``)."""
    highs = {"input": cfg.input.high, "output": cfg.output.high}
    if cfg.workload == "multi_turn":
        highs["turns"] = cfg.turns.high
    unbounded = [k for k, v in highs.items() if v is None]
    if unbounded:
        raise ConfigError(
            f"{where}.{unbounded[0]} has no max, so it can pass max_context "
            f"({cfg.max_context}); give the spec a max"
        )
    most = longest_request(cfg)
    if most > (cfg.max_context or 0):
        raise ConfigError(
            f"{where}: a request can reach {most} tokens (prompt and max_tokens) > "
            f"max_context {cfg.max_context}; lower the input, output or turns max"
        )


def build_plan(cfg: WorkloadConfig) -> dict[str, Any]:
    """The JSON-able plan of ``cfg``: every length drawn from ``cfg.seed`` (and for
    ``jsonl`` the file's requests, read and checked now)."""
    check(cfg)
    rng = random.Random(f"harness-llm-workload/{cfg.seed}/lengths")
    plan: dict[str, Any] = {
        "schema": SCHEMA,
        "workload": cfg.workload,
        "api": cfg.api,
        "seed": cfg.seed,
        "ignore_eos": cfg.ignore_eos,
        "block_size": cfg.block_size,
        "input": cfg.input.text,
        "output": cfg.output.text,
    }
    if not cfg.include_usage:
        plan["include_usage"] = False  # absent: asked, as every plan before the key
    if cfg.workload == "synthetic":
        plan["requests"] = [
            [cfg.input.draw(rng), cfg.output.draw(rng)] for _ in range(cfg.requests)
        ]
    elif cfg.workload == "shared_prefix":
        reqs = [
            [cfg.input.draw(rng), cfg.output.draw(rng), i % cfg.groups] for i in range(cfg.requests)
        ]
        rng.shuffle(reqs)
        plan.update(groups=cfg.groups, prefix_tokens=cfg.prefix_tokens, requests=reqs)
    elif cfg.workload == "multi_turn":
        plan["turns"] = cfg.turns.text
        plan["conversations"] = [
            [[cfg.input.draw(rng), cfg.output.draw(rng)] for _ in range(cfg.turns.draw(rng))]
            for _ in range(cfg.conversations)
        ]
    else:
        items = []
        for line, item in read_jsonl_lines(Path(cfg.file or "")):
            item.setdefault("max_tokens", cfg.output.draw(rng))
            _check_item_context(cfg, item, line)
            items.append(item)
        plan["items"] = items
    return plan


def _check_item_context(cfg: WorkloadConfig, item: Mapping[str, Any], line: int) -> None:
    if cfg.max_context is None:
        return
    text = chat_prompt(item["messages"]) if "messages" in item else item["prompt"]
    n = count_tokens(text) + item["max_tokens"]
    if n > cfg.max_context:
        raise ConfigError(
            f"{cfg.file}:{line}: {n} tokens (prompt and max_tokens) > "
            f"max_context {cfg.max_context}; shorten it or lower its max_tokens"
        )


def _checked(plan: Mapping[str, Any], *workloads: str) -> Mapping[str, Any]:
    if plan.get("schema") != SCHEMA:
        raise ConfigError(f"an LLM workload plan of schema {plan.get('schema')!r}, not {SCHEMA}")
    if plan.get("workload") not in workloads:
        raise ConfigError(f"a {plan.get('workload')!r} plan; this needs one of {workloads}")
    return plan


def _generation(
    plan: Mapping[str, Any], max_tokens: int, priority: int | None = None
) -> Generation:
    return Generation(
        max_tokens=max_tokens,
        ignore_eos=plan["ignore_eos"] or None,
        priority=priority,
        include_usage=plan.get("include_usage", True),
    )


def requests_from_plan(plan: Mapping[str, Any], model: str) -> list[LlmRequest]:
    """The requests of a ``synthetic``, ``shared_prefix`` or ``jsonl`` plan, in order:
    the same on every process."""
    _checked(plan, "synthetic", "shared_prefix", "jsonl")
    if plan["workload"] == "jsonl":
        return [_jsonl_request(plan, item, model) for item in plan["items"]]
    return [build_request(plan, i, model) for i in range(len(plan["requests"]))]


def build_request(plan: Mapping[str, Any], index: int, model: str) -> LlmRequest:
    """Request ``index`` of a ``synthetic`` or ``shared_prefix`` plan."""
    _checked(plan, "synthetic", "shared_prefix")
    seed, chat = plan["seed"], plan["api"] == "chat"
    entry = plan["requests"][index]
    n_in, n_out = entry[0], entry[1]
    rng = random.Random(f"harness-llm-workload/{seed}/request/{index}")
    gen = _generation(plan, n_out)
    if plan["workload"] == "synthetic":
        words = tx.words(rng, n_in - tx.CHAT_OVERHEAD if chat else n_in)
        if chat:
            body = chat_body(model, [tx.user_message(tx.text_of(words))], gen)
            return LlmRequest(CHAT_PATH, body, n_in, n_out)
        return LlmRequest(
            COMPLETIONS_PATH, completion_body(model, tx.text_of(words), gen), n_in, n_out
        )
    group = entry[2]
    prefix = shared_prefix(plan, group)
    total = plan["prefix_tokens"] + n_in
    if chat:
        words = tx.words(rng, n_in - tx.USER_CLOSE)
        messages = [tx.system_message(prefix), tx.user_message(tx.text_of(words))]
        return LlmRequest(CHAT_PATH, chat_body(model, messages, gen), total, n_out, group=group)
    suffix = "".join(" " + w for w in tx.words(rng, n_in))
    body = completion_body(model, prefix + suffix, gen)
    return LlmRequest(COMPLETIONS_PATH, body, total, n_out, group=group)


def shared_prefix(plan: Mapping[str, Any], group: int) -> str:
    """Group ``group``'s shared text: the system message's content (chat), or the start of
    the prompt (completions). Its first word is the group's own, so no two groups share
    a block."""
    return _shared_prefix(plan["seed"], plan["api"], plan["prefix_tokens"], group)


@functools.lru_cache(maxsize=256)
def _shared_prefix(seed: int, api: str, prefix_tokens: int, group: int) -> str:
    n = prefix_tokens - (tx.SHARED_OVERHEAD if api == "chat" else 0)
    rng = random.Random(f"harness-llm-workload/{seed}/prefix/{group}")
    return tx.text_of([tx.VOCABULARY[group % len(tx.VOCABULARY)], *tx.words(rng, n - 1)])


def _jsonl_request(plan: Mapping[str, Any], item: Mapping[str, Any], model: str) -> LlmRequest:
    gen = _generation(plan, item["max_tokens"], item.get("priority"))
    if "messages" in item:
        body = chat_body(model, item["messages"], gen)
        n, path = count_tokens(chat_prompt(item["messages"])), CHAT_PATH
    else:
        body = completion_body(model, item["prompt"], gen)
        n, path = count_tokens(item["prompt"]), COMPLETIONS_PATH
    return LlmRequest(path, body, n, item["max_tokens"], traffic_class=item.get("class"))


class Conversation:
    """One conversation of a ``multi_turn`` plan. Ask ``next_request(None)`` for the first
    turn, then ``next_request(answer)`` with the text the server streamed for the turn
    before: the next body carries every earlier message and that answer, and its
    ``prompt_tokens`` is its rendered prompt's exact count. With answers that re-tokenize
    in place (the reference server's do), turn ``k`` has the prompt tokens of turn ``k-1``
    plus the answer's plus the ``input`` tokens drawn for it."""

    def __init__(
        self,
        plan: Mapping[str, Any],
        index: int,
        model: str,
        turns: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """``turns``: conversation ``index``'s [input, output] lengths when ``plan`` does
        not carry its ``conversations`` (``plan_header``): the same conversation."""
        _checked(plan, "multi_turn")
        self.plan, self.index, self.model = plan, index, model
        self.turns = [
            list(t) for t in (turns if turns is not None else plan["conversations"][index])
        ]
        self.messages: list[dict[str, Any]] = []
        self.turn = 0  # requests built so far
        self._prompt_text, self._prompt_tokens = "", 0  # the last request's rendered prompt

    @property
    def done(self) -> bool:
        return self.turn >= len(self.turns)

    def next_request(self, previous_answer: str | None) -> LlmRequest:
        """The body of the next turn. ValueError when the conversation is over, when an
        answer is missing after the first turn or given before it."""
        if self.done:
            raise ValueError(f"conversation {self.index} has had its {len(self.turns)} turns")
        if (previous_answer is None) != (self.turn == 0):
            raise ValueError("pass None for the first turn and the previous answer's text after it")
        n_in, n_out = self.turns[self.turn]
        if previous_answer is not None:
            self.messages.append({"role": "assistant", "content": previous_answer})
        target = self._prompt_tokens + count_tokens(previous_answer or "") + n_in
        rng = random.Random(
            f"harness-llm-workload/{self.plan['seed']}/conversation/{self.index}/{self.turn}"
        )
        one_word = chat_prompt([*self.messages, tx.user_message(tx.MARK)])
        one = tx.extended_count(self._prompt_text, self._prompt_tokens, one_word)
        words = tx.words(rng, max(1, target - one + 1))
        self.messages.append(tx.user_message(tx.text_of(words)))
        self._prompt_text = chat_prompt(self.messages)
        self._prompt_tokens = one - 1 + len(words)
        self.turn += 1
        body = chat_body(self.model, self.messages, _generation(self.plan, n_out))
        return LlmRequest(CHAT_PATH, body, self._prompt_tokens, n_out)


def plan_header(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` without its per-request lists: what every turn of every conversation
    needs besides the conversation's own lengths (``Conversation(..., turns=...)``)."""
    return {k: v for k, v in plan.items() if k not in ("conversations", "requests", "items")}


def conversations_from_plan(plan: Mapping[str, Any], model: str) -> list[Conversation]:
    """The conversations of a ``multi_turn`` plan, each at its first turn."""
    _checked(plan, "multi_turn")
    return [Conversation(plan, i, model) for i in range(len(plan["conversations"]))]


def reference_answer(request: LlmRequest) -> str:
    """The text the reference server streams for ``request`` (its output oracle)."""
    return reference_expectation(request.body).text


def play_with_reference(
    plan: Mapping[str, Any], index: int, model: str
) -> list[tuple[LlmRequest, str]]:
    """Conversation ``index`` played to its end against the reference server's oracle:
    each turn's request and the answer the server gives it. Pure: no server is asked."""
    conv, out, answer = Conversation(plan, index, model), [], None
    while not conv.done:
        request = conv.next_request(answer)
        answer = reference_answer(request)
        out.append((request, answer))
    return out
