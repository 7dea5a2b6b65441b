"""BlockPool and KVCacheManager: ref counts, LRU eviction, prefix-cache hits. No model."""

from __future__ import annotations

import pytest

from inflight.core.block_pool import BlockPool, hash_block
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.request import Request
from inflight.sampling_params import SamplingParams

BS = 4  # tokens per block in these tests


def make_req(rid: str, prompt: list[int]) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=8), arrival_time=0.0, max_tokens=8)


def compute(kv: KVCacheManager, req: Request, num_tokens: int | None = None) -> None:
    """Pretend the runner computed the request up to num_tokens (default: all), then cache."""
    req.num_computed_tokens = req.num_tokens if num_tokens is None else num_tokens
    kv.cache_computed_blocks(req)


def admit(kv: KVCacheManager, req: Request) -> list[int]:
    """What the scheduler does for a fresh request: look up hits, allocate the rest."""
    hits = kv.find_cached_prefix(req)
    assert kv.allocate(req, req.num_tokens - len(hits) * BS, hits)
    return hits


def chain(tokens: list[int], num_blocks: int) -> list[bytes]:
    out: list[bytes] = []
    for i in range(num_blocks):
        out.append(hash_block(out[-1] if out else None, tokens[i * BS : (i + 1) * BS]))
    return out


# ------------------------------------------------------------------------------- BlockPool
def test_allocate_and_free_ref_counting() -> None:
    pool = BlockPool(8)
    ids = pool.allocate(3)
    assert ids == [0, 1, 2]
    assert [pool.blocks[i].ref_cnt for i in ids] == [1, 1, 1]
    assert pool.num_free_blocks == 5
    assert pool.usage == pytest.approx(3 / 8)

    pool.touch([1])  # a second holder
    assert pool.blocks[1].ref_cnt == 2
    pool.free(ids)
    assert [pool.blocks[i].ref_cnt for i in ids] == [0, 1, 0]
    assert pool.num_free_blocks == 7
    assert 1 not in pool.free_queue
    pool.free([1])
    assert pool.blocks[1].ref_cnt == 0 and 1 in pool.free_queue
    pool.check_idle()


def test_double_free_raises() -> None:
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([b])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([3])  # never allocated
    pool.check_idle()


def test_allocate_more_than_free_raises_and_takes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    assert pool.num_free_blocks == 1


def test_freed_blocks_go_to_back_of_queue() -> None:
    pool = BlockPool(6)
    a = pool.allocate(3)  # 0, 1, 2
    pool.free([a[1]])
    pool.free([a[0]])
    assert list(pool.free_queue) == [3, 4, 5, 1, 0]
    assert pool.allocate(3) == [3, 4, 5]  # never-used blocks first
    assert pool.allocate(2) == [1, 0]  # then in the order they were freed


def test_allocation_evicts_cached_blocks_from_front_and_removes_hash() -> None:
    pool = BlockPool(3)
    ids = pool.allocate(3)
    hashes = [bytes([i]) * 16 for i in range(3)]
    for b, h in zip(ids, hashes):
        pool.cache(b, h)
    pool.free([ids[2], ids[0], ids[1]])  # eviction order 2, 0, 1
    assert all(pool.lookup(h) == b for b, h in zip(ids, hashes))  # cached-free still hit
    assert pool.num_free_blocks == 3

    assert pool.allocate(1) == [ids[2]]
    assert pool.lookup(hashes[2]) is None and pool.blocks[ids[2]].block_hash is None
    assert pool.lookup(hashes[0]) == ids[0] and pool.lookup(hashes[1]) == ids[1]
    assert pool.allocate(1) == [ids[0]]
    assert pool.lookup(hashes[0]) is None and pool.lookup(hashes[1]) == ids[1]
    assert set(pool.cached) == {hashes[1]}


def test_cache_first_writer_wins_and_disabled_pool_never_caches() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    h = b"x" * 16
    pool.cache(a, h)
    pool.cache(b, h)  # same content computed twice: the first block keeps the entry
    assert pool.lookup(h) == a and pool.blocks[b].block_hash is None
    pool.cache(a, b"y" * 16)  # a block keeps its first hash
    assert pool.blocks[a].block_hash == h and pool.lookup(b"y" * 16) is None

    off = BlockPool(4, enable_caching=False)
    (c,) = off.allocate(1)
    off.cache(c, h)
    assert off.lookup(h) is None and off.cached == {} and off.blocks[c].block_hash is None


def test_check_idle_detects_leaks_and_stale_entries() -> None:
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    with pytest.raises(AssertionError, match="leak"):
        pool.check_idle()
    pool.cache(b, b"h" * 16)
    pool.free([b])
    pool.check_idle()
    pool.blocks[b].block_hash = None  # simulate a bug: block lost its hash, map still points at it
    with pytest.raises(AssertionError, match="stale"):
        pool.check_idle()


def test_hash_block_chains_on_parent() -> None:
    h0 = hash_block(None, [1, 2, 3, 4])
    assert h0 == hash_block(None, [1, 2, 3, 4])
    assert h0 != hash_block(None, [1, 2, 3, 5])
    # same block content under different parents hashes differently
    assert hash_block(h0, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert hash_block(h0, [5, 6, 7, 8], b"lora") != hash_block(h0, [5, 6, 7, 8])


# ------------------------------------------------------------------------ KVCacheManager
def test_request_free_evicts_tail_before_head() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    req = make_req("a", list(range(100, 112)))  # 3 full blocks
    admit(kv, req)
    compute(kv, req)
    table = list(req.block_ids)
    assert [kv.pool.blocks[b].block_hash for b in table] == chain(req.all_token_ids, 3)
    kv.forget(req)
    assert req.block_ids == []
    kv.pool.check_idle()
    # the untouched block 3 first, then the freed request's blocks tail first
    assert list(kv.pool.free_queue) == [3, table[2], table[1], table[0]]
    kv.pool.allocate(2)
    assert kv.pool.blocks[table[2]].block_hash is None
    assert kv.pool.blocks[table[0]].block_hash is not None
    # the head of the prompt is still served from the cache
    again = make_req("b", list(range(100, 112)) + [7])
    assert kv.find_cached_prefix(again) == table[:2]


def test_shared_prefix_hits_only_after_blocks_are_computed() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    prefix = list(range(200, 212))  # 3 full blocks
    a = make_req("a", prefix + [1, 2])
    b = make_req("b", prefix + [3, 4, 5])
    assert admit(kv, a) == []
    assert kv.find_cached_prefix(b) == []  # allocated but not computed: nothing cached yet

    compute(kv, a, 8)  # first two blocks computed
    assert kv.find_cached_prefix(b) == a.block_ids[:2]
    compute(kv, a)  # all 14 tokens: 3 full blocks cached, the partial one is not
    assert len(kv.pool.cached) == 3
    assert kv.pool.blocks[a.block_ids[3]].block_hash is None

    hits = admit(kv, b)
    assert hits == a.block_ids[:3]
    assert b.block_ids[:3] == a.block_ids[:3]
    assert len(b.block_ids) == 4 and b.block_ids[3] != a.block_ids[3]
    assert b.num_computed_tokens == 12
    assert [kv.pool.blocks[x].ref_cnt for x in b.block_ids] == [2, 2, 2, 1]
    assert kv.pool.num_hit_tokens == 2 * BS + 3 * BS

    kv.forget(a)
    assert [kv.pool.blocks[x].ref_cnt for x in b.block_ids] == [1, 1, 1, 1]
    kv.forget(b)
    kv.pool.check_idle()


def test_last_token_is_never_served_from_cache() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    tokens = list(range(300, 308))  # exactly 2 full blocks
    a = make_req("a", tokens)
    admit(kv, a)
    compute(kv, a)
    assert len(kv.pool.cached) == 2

    same = make_req("same", tokens)
    hits = kv.find_cached_prefix(same)  # (8 - 1) // 4 = 1 block
    assert hits == a.block_ids[:1]
    assert kv.allocate(same, same.num_tokens - len(hits) * BS, hits)
    assert same.num_computed_tokens == 4 and len(same.block_ids) == 2
    assert same.block_ids[1] != a.block_ids[1]  # block 1 is recomputed into a fresh block

    longer = make_req("longer", tokens + [9])
    assert kv.find_cached_prefix(longer) == a.block_ids[:2]
    shorter = make_req("shorter", tokens[:4])  # one full block: (4 - 1) // 4 = 0
    assert kv.find_cached_prefix(shorter) == []
    for r in (a, same):
        kv.forget(r)
    kv.pool.check_idle()


def test_hits_on_cached_free_blocks_leave_the_free_queue() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    prefix = list(range(400, 412))
    a = make_req("a", prefix + [1])
    admit(kv, a)
    compute(kv, a)
    a_table = list(a.block_ids)
    kv.forget(a)
    assert kv.pool.num_free_blocks == 8
    assert all(b in kv.pool.free_queue for b in a_table)

    b = make_req("b", prefix + [2, 3])
    hits = admit(kv, b)
    assert hits == a_table[:3]
    for x in hits:
        assert x not in kv.pool.free_queue and kv.pool.blocks[x].ref_cnt == 1
    assert kv.pool.num_free_blocks == 8 - 4
    kv.forget(b)
    kv.pool.check_idle()


def test_different_first_block_means_no_hits_in_later_blocks() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    a = make_req("a", list(range(500, 513)))
    admit(kv, a)
    compute(kv, a)
    # identical blocks 1 and 2, different block 0: the chained hashes differ everywhere
    other = list(range(500, 513))
    other[0] = 999
    b = make_req("b", other)
    assert kv.find_cached_prefix(b) == []
    # a difference in block 1 keeps the block-0 hit only
    other = list(range(500, 513))
    other[5] = 999
    c = make_req("c", other)
    assert kv.find_cached_prefix(c) == a.block_ids[:1]
    kv.forget(a)
    kv.pool.check_idle()


def test_prefix_caching_disabled_gives_no_hits() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    tokens = list(range(600, 613))
    a = make_req("a", tokens)
    admit(kv, a)
    compute(kv, a)
    assert kv.pool.cached == {}
    assert all(kv.pool.blocks[x].block_hash is None for x in a.block_ids)
    b = make_req("b", tokens)
    assert admit(kv, b) == []
    assert set(a.block_ids).isdisjoint(b.block_ids)
    for r in (a, b):
        kv.forget(r)
    kv.pool.check_idle()


def test_can_allocate_counts_evictable_hits_as_used() -> None:
    prefix = list(range(700, 712))  # 3 full blocks
    for num_blocks, fits in ((4, False), (5, True)):
        kv = KVCacheManager(num_blocks=num_blocks, block_size=BS)
        a = make_req("a", prefix + [1])
        admit(kv, a)
        compute(kv, a)
        kv.forget(a)  # 3 cached-free blocks + the rest free
        assert kv.pool.num_free_blocks == num_blocks
        b = make_req("b", prefix + [2, 3, 4, 5, 6])  # 17 tokens: 5 blocks, 3 of them hits
        hits = kv.find_cached_prefix(b)
        assert len(hits) == 3
        n = b.num_tokens - 3 * BS
        assert kv.num_blocks_needed(b, n, len(hits)) == 2
        # touching the 3 hits takes them out of the free queue: num_blocks - 3 left for 2 new
        assert kv.can_allocate(b, n, hits) is fits
        assert kv.allocate(b, n, hits) is fits
        if fits:
            assert b.block_ids[:3] == hits and len(b.block_ids) == 5
            assert kv.pool.num_free_blocks == 0
        else:
            assert b.block_ids == [] and b.num_computed_tokens == 0
            assert kv.pool.num_free_blocks == num_blocks  # nothing was touched
        kv.forget(b)
        kv.pool.check_idle()


def test_can_allocate_does_not_discount_hits_held_by_running_requests() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BS)
    prefix = list(range(800, 812))
    a = make_req("a", prefix + [1])  # 4 blocks, 3 cached, still running
    admit(kv, a)
    compute(kv, a)
    assert kv.pool.num_free_blocks == 2
    b = make_req("b", prefix + [2, 3, 4, 5, 6])  # needs 2 new blocks beyond 3 shared hits
    hits = kv.find_cached_prefix(b)
    assert hits == a.block_ids[:3]
    assert kv.can_allocate(b, b.num_tokens - 12, hits)
    assert kv.allocate(b, b.num_tokens - 12, hits)
    assert kv.pool.num_free_blocks == 0
    c = make_req("c", prefix + [9, 9])
    hits_c = kv.find_cached_prefix(c)
    assert len(hits_c) == 3 and not kv.can_allocate(c, 2, hits_c)  # needs 1 new, none free
    for r in (a, b):
        kv.forget(r)
    kv.pool.check_idle()


def test_growing_a_request_allocates_only_missing_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    r = make_req("r", list(range(10)))
    assert kv.num_blocks_needed(r, 10) == 3
    assert kv.allocate(r, 4)  # a first chunk
    assert len(r.block_ids) == 1
    r.num_computed_tokens = 4
    assert kv.allocate(r, 6)
    assert len(r.block_ids) == 3
    r.num_computed_tokens = 10
    r.append_token(1)
    assert kv.num_blocks_needed(r, 1) == 0  # slot 10 is in block 2
    r.append_token(2)
    r.num_computed_tokens = 12
    assert kv.num_blocks_needed(r, 1) == 1
    assert kv.pool.num_free_blocks == 5
    assert kv.can_allocate(r, 5 * BS)  # 12 + 20 tokens: 8 blocks, 5 of them new
    assert not kv.can_allocate(r, 5 * BS + 1)  # one token more needs a 6th new block
    kv.forget(r)
    kv.pool.check_idle()
