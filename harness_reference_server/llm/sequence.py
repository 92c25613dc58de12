"""One request inside the LLM engine (``Sequence``) and one step's work (``Step``).

A sequence moves new → waiting ⇄ running → finished; ``finish_reason`` says why it
finished (``stop``, ``length``, or the abort's reason: ``disconnect``, ``deadline``,
``error``, ``interrupted``, ``shutdown``, ``shed``: displaced from a full waiting queue
before it started). What it generates is appended to ``output``
(the oracle's tokens) and, as delivered to its client, to ``outbox``; ``event`` is set
whenever ``outbox`` grows or the sequence finishes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness_reference_server.llm.timings import RequestTimings


class Sequence:
    """One request in the engine; what it produces is appended to ``outbox``."""

    def __init__(
        self,
        prompt_ids: list[int],
        key: bytes,
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        priority: int = 0,
        deadline: float | None = None,
        interruptible: bool = False,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.key = key
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.priority = priority
        self.deadline = deadline
        self.interruptible = interruptible
        self.arrival = 0.0
        self.order = 0
        self.output: list[str] = []  # generated token texts, as the oracle says
        self.outbox: list[str] = []  # delivered and not yet taken by the API
        self.num_computed = 0
        self.blocks: list[int] = []
        self.hashes: list[bytes] = []
        self.state = "new"  # new → waiting ⇄ running → finished
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.prefix_hit_tokens = 0
        self.preemptions = 0
        self.timings: RequestTimings | None = None  # with --record-timings
        self.event = asyncio.Event()
        self.started = asyncio.Event()  # set when first admitted, or when it finishes

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def take(self) -> list[str]:
        out, self.outbox = self.outbox, []
        self.event.clear()
        return out


@dataclasses.dataclass
class Step:
    """One step's work: (sequence, tokens computed for it) and its modelled duration."""

    work: list[tuple[Sequence, int]]
    prefill_tokens: int
    decode_seqs: int
    seconds: float
