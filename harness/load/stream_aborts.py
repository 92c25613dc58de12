"""Client aborts: which streams of an LLM load hang up mid-stream, and after how many tokens.

The ``[llm]`` table of a scenario says it (``harness.load.llm_workload.config_from_table``):

- ``abort_share`` (0-1, default 0): the share of the streams sent in an abort stage that
  close their connection mid-stream;
- ``abort_after`` (a length spec, default ``"uniform:min=2,max=8"``): after how many
  token-bearing events such a stream hangs up (drawn per stream; a stream whose answer is
  over first ends normally);
- ``abort_stages`` (stage names, default: every stage): the stages whose streams may abort
  — a scenario's storm stage between a baseline and a recovery without aborts.

Each load process draws its streams' fates from its own seeded generator (the scenario's
seed and the process's slot), so a run is reproducible for a given process count. The
hang-up itself is ``harness.load.stream_http.exchange_stream``'s ``abort_after``: a real
close of the socket, which the server sees as its client disconnecting.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from harness.load.llm_workload_lengths import LengthSpec, parse_length

DEFAULT_AFTER = "uniform:min=2,max=8"


@dataclass(frozen=True)
class ClientAborts:
    """A validated abort plan (``share`` in (0, 1], ``after`` ≥ 1 token event)."""

    share: float
    after: LengthSpec = parse_length(DEFAULT_AFTER)
    stages: tuple[str, ...] = ()  # empty: every stage

    def applies_to(self, stage: str) -> bool:
        return not self.stages or stage in self.stages

    def picker(self, seed: int, slot: int) -> Callable[[str], int | None]:
        """For one load process: ``pick(stage)`` → the token events after which the next
        stream hangs up, or None (it reads its answer to the end)."""
        rng = random.Random(f"harness-llm-aborts/{seed}/{slot}")

        def pick(stage: str) -> int | None:
            if not self.applies_to(stage):
                return None
            if rng.random() >= self.share:
                return None
            return self.after.draw(rng)

        return pick


def client_aborts(share: float, after: LengthSpec, stages: tuple[str, ...]) -> ClientAborts | None:
    """The plan of ``[llm]``'s abort keys (validated there); None when ``share`` is 0."""
    return ClientAborts(share, after, stages) if share > 0 else None
