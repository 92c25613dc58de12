"""The KV cache: fixed-size blocks with reference counts, and prefix caching by block hash.

A block holds ``block_size`` tokens of one or more sequences' keys and values. A full block
of prompt tokens is named by a chained hash (its tokens and every block before it), so
two prompts that share a prefix share its blocks. A block no sequence references is free
but keeps its contents until it is reused, least recently freed first: a later prompt with
the same prefix can still hit it (vLLM's scheme).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hash of each *full* block of ``token_ids``."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        prev = hashlib.blake2b(
            prev + struct.pack(f"<{block_size}I", *block), digest_size=16
        ).digest()
        out.append(prev)
    return out


class KVCache:
    """``num_blocks`` blocks; a block is in use while a sequence references it."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._refs = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[bytes, int] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        """The fraction of blocks in use (``vllm:kv_cache_usage_perc``)."""
        return self.used_blocks / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (not yet referenced)."""
        if not self.prefix_caching:
            return []
        hit: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (sharing them takes them off the free list)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def share(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks found by ``lookup``."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks, evicting the least recently freed; None if fewer are free."""
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                self._hash[b] = None
                if self._cached.get(h) == b:
                    del self._cached[h]
            self._refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; a block nobody references becomes free, its
        contents kept for a later prefix hit (the sequence's tail is evicted first)."""
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def publish(self, block: int, h: bytes) -> None:
        """Name a full block by its hash, so later prompts with that prefix hit it."""
        if self.prefix_caching and h not in self._cached:
            self._cached[h] = block
            self._hash[block] = h
