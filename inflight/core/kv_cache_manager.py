"""KVCacheManager: per-request block tables over the BlockPool.

A request's block table maps token position p to slot
`block_ids[p // block_size] * block_size + p % block_size` of the device
cache. Full blocks are hashed (chained over the token prefix) and offered to
the prefix cache once their KV has been computed.
"""

from __future__ import annotations

from inflight.core.block_pool import BlockPool, hash_block
from inflight.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._hashes: dict[str, list[bytes]] = {}  # request id -> hashes of its full blocks
        self._num_cached: dict[str, int] = {}  # request id -> blocks already offered to the cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def num_tracked(self) -> dict[str, int]:
        """How many requests each per-request map holds ("block hashes", "cached counts"): both 0
        once every request is `forget`-ten (tests of the soak's flat memory)."""
        return {"block hashes": len(self._hashes), "cached counts": len(self._num_cached)}

    def _block_hashes(self, request: Request, num_full_blocks: int) -> list[bytes]:
        hashes = self._hashes.setdefault(request.request_id, [])
        bs = self.block_size
        tokens = request.all_token_ids
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tokens[i * bs : (i + 1) * bs], self._extra_key(request, i)))
        return hashes

    def _extra_key(self, request: Request, block: int) -> bytes:
        """Anything besides token ids that changes block `block`'s KV: the request's salt (p-tuning
        table), its LoRA adapter, and the hash of every image / video whose placeholders start in
        it (the chain carries it to every later block): the same image + prompt reuses KV, a
        different image behind the same placeholder ids never does; text before it still shares."""
        lora = request.lora
        key = request.cache_salt if lora is None else request.cache_salt + lora.cache_key
        lo, hi = block * self.block_size, (block + 1) * self.block_size
        for item in request.mm_items:
            if lo <= item.offset < hi:
                key += item.hash
        return key

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest cached prefix of a request that has computed nothing.

        At least one token is always left to compute, so the last step yields logits.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for h in self._block_hashes(request, max_blocks):
            block_id = self.pool.lookup(h)
            if block_id is None:
                break
            hits.append(block_id)
        self.pool.num_query_tokens += request.num_tokens  # hits can cover generated tokens too
        self.pool.num_hit_tokens += len(hits) * self.block_size
        return hits

    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_hits: int = 0) -> int:
        """New blocks to hold num_new_tokens after what is computed (or after num_hits cached blocks)."""
        computed = num_hits * self.block_size if num_hits else request.num_computed_tokens
        needed = -(-(computed + num_new_tokens) // self.block_size)
        return max(0, needed - len(request.block_ids) - num_hits)

    def can_allocate(self, request: Request, num_new_tokens: int, hits: list[int] = ()) -> bool:  # type: ignore[assignment]
        # cached-free hits leave the free queue when touched, so they don't count as free
        evictable_hits = sum(1 for b in hits if self.pool.blocks[b].ref_cnt == 0)
        needed = self.num_blocks_needed(request, num_new_tokens, len(hits))
        return needed <= self.pool.num_free_blocks - evictable_hits

    def allocate(self, request: Request, num_new_tokens: int, hits: list[int] = ()) -> bool:  # type: ignore[assignment]
        """Grow the request's table to hold num_computed + num_new_tokens. False if no room."""
        if not hits:  # every running request, every step: one count, not can_allocate's two
            needed = self.num_blocks_needed(request, num_new_tokens)
            if needed > self.pool.num_free_blocks:
                return False
            if needed:
                request.block_ids.extend(self.pool.allocate(needed))
            return True
        if not self.can_allocate(request, num_new_tokens, hits):
            return False
        if hits:
            self.pool.touch(list(hits))
            request.block_ids.extend(hits)
            request.num_computed_tokens = len(hits) * self.block_size
            self._num_cached[request.request_id] = len(hits)
        needed = self.num_blocks_needed(request, num_new_tokens)
        if needed:
            request.block_ids.extend(self.pool.allocate(needed))
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` (same prompt, nothing computed) references on the parent's full prompt blocks.

        Shared blocks are full and never written again (new tokens go to fresh blocks), so
        sharing needs no copy; the child recomputes only the prompt's partial tail block.
        """
        n_full = min((child.num_tokens - 1) // self.block_size, parent.num_computed_tokens // self.block_size)
        shared = parent.block_ids[:n_full]
        self.pool.touch(shared)
        child.block_ids = list(shared)
        child.num_computed_tokens = n_full * self.block_size
        self._num_cached[child.request_id] = n_full  # already offered to the cache by the parent

    def fork_beam(self, origin: Request, child: Request) -> tuple[int, int] | None:
        """`child` continues `origin`: it shares origin's full computed blocks by reference and
        gets its own copy of the partial last block. Returns the (src, dst) block pair the device
        must copy, or None when there is nothing to copy or no free block (the partial tokens are
        then recomputed instead)."""
        bs = self.block_size
        computed = origin.num_computed_tokens
        n_full = computed // bs
        shared = origin.block_ids[:n_full]
        self.pool.touch(shared)
        child.block_ids = list(shared)
        child.num_computed_tokens = n_full * bs
        self._num_cached[child.request_id] = min(n_full, self._num_cached.get(origin.request_id, 0))
        if computed % bs == 0 or self.pool.num_free_blocks == 0:
            return None
        dst = self.pool.allocate(1)[0]
        child.block_ids.append(dst)
        child.num_computed_tokens = computed
        return origin.block_ids[n_full], dst

    def cache_computed_blocks(self, request: Request) -> None:
        """Offer the request's newly full and computed blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        # computed may count a piece still running (async scheduling) whose last token is not
        # known yet: only blocks of known tokens are hashed (the runner writes in step order)
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        done = self._num_cached.get(request.request_id, 0)
        if num_full <= done:
            return
        hashes = self._block_hashes(request, num_full)
        for i in range(done, num_full):
            self.pool.cache(request.block_ids[i], hashes[i])
        self._num_cached[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks (tail first, so its tail is evicted first)."""
        if request.block_ids:
            self.pool.free(request.block_ids[::-1])
        request.block_ids = []
        self._num_cached.pop(request.request_id, None)

    def forget(self, request: Request) -> None:
        """Drop per-request bookkeeping once the request is gone for good."""
        self.free(request)
        self._hashes.pop(request.request_id, None)
