"""BlockPool: reference-counted KV blocks with a prefix cache and LRU eviction.

Every block is in exactly one of three states:

    in use        ref_cnt > 0            (in some request's block table)
    cached-free   ref_cnt == 0, hashed   (in free_queue AND in cached; reusable by hash)
    free          ref_cnt == 0, no hash  (in free_queue only)

`free_queue` is ordered by eviction priority: new blocks are taken from the
front; a freed block goes to the back, so the least recently used cached
block is the first to lose its hash. Pure Python; no device code.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass


def hash_block(parent: bytes | None, token_ids: list[int], extra: bytes = b"") -> bytes:
    """Hash of a full block, chained on its parent so equal hashes mean equal prefixes.

    blake2b (128 bits) rather than Python's hash(): a collision would silently
    serve another prompt's KV, and hashing 16 ints costs about a microsecond.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    h.update(extra)
    return h.digest()


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}
        # prefix-cache statistics, in tokens queried / hit (for metrics)
        self.num_query_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free or cached-free)."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def lookup(self, block_hash: bytes) -> int | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def allocate(self, n: int) -> list[int]:
        """Take n blocks from the front of the free queue (evicting their hashes)."""
        if n > len(self.free_queue):
            raise RuntimeError(f"BlockPool: asked for {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block_id)
        return out

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on blocks found in the prefix cache."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self.free_queue[block_id]
            block.ref_cnt += 1

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block; pass a table tail-first so tails evict first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0:
                raise RuntimeError(f"BlockPool: double free of block {block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Register a full, computed block under its prefix hash (first writer wins)."""
        if not self.enable_caching:
            return
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block_id

    def check_idle(self) -> None:
        """Invariant when no request holds blocks: every block free or cached-free."""
        held = [b.block_id for b in self.blocks if b.ref_cnt != 0]
        if held or len(self.free_queue) != self.num_blocks:
            raise AssertionError(f"BlockPool leak: blocks still referenced: {held[:16]}")
        for h, block_id in self.cached.items():
            if self.blocks[block_id].block_hash != h:
                raise AssertionError(f"BlockPool: cache entry for block {block_id} is stale")
