"""Weights in transparent huge pages (inflight/memory.py): the collapse of a tensor's whole 2 MiB
pages, the weight arena's mappings, the walk that finds a model's tensors. Real madvise calls
against the kernel's own accounting (/proc/self/smaps_rollup); skipped where the kernel has no THP."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

from inflight import memory

THP = memory.thp_mode() in ("always", "madvise") and memory._LIBC is not None
needs_thp = pytest.mark.skipif(not THP, reason="no transparent huge pages here")


def anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")), 0)


@needs_thp
def test_collapse_moves_a_tensors_whole_pages_into_huge_ones() -> None:
    t = torch.arange(5 << 20, dtype=torch.int32)  # 20 MiB, filled: the collapse must keep the values
    before = anon_huge_kib()
    done = memory.huge_pages([t, t[10:]])  # a view of the same bytes counts once
    assert done >= 16 << 20 and done % memory.HUGE_PAGE == 0
    assert anon_huge_kib() - before >= (done >> 10) // 2  # the kernel says so (others may free some meanwhile)
    assert torch.equal(t[::4099], torch.arange(0, 5 << 20, 4099, dtype=torch.int32))


def test_off_switch_and_small_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    small = torch.ones(1000)
    assert memory.huge_pages([small]) == 0  # no whole 2 MiB page inside
    monkeypatch.setenv("INFLIGHT_HUGE_PAGES", "0")
    assert memory.huge_pages([torch.ones(4 << 20)]) == 0
    assert memory.pack_into_huge_pages(torch.nn.Linear(512, 512)) == 0  # 1 MiB weight, left where it is
    arena = memory.WeightArena()
    t = arena.empty(8 << 20)
    assert t.untyped_storage().nbytes() == 8 << 20  # a plain allocation, no mapping of its own


@needs_thp
def test_arena_slices_are_aligned_disjoint_and_fault_in_huge_pages() -> None:
    arena = memory.WeightArena()
    before = anon_huge_kib()
    sizes = [1000, *[3 << 20] * 30, 5 << 20]  # 90 MiB of small ones over two chunks; the last a plain one
    slices = [arena.empty(n) for n in sizes]
    assert slices[-1].untyped_storage().nbytes() == 5 << 20  # 4 MiB and more: torch's (huge_pages() collapses it)
    for i, (s, n) in enumerate(zip(slices, sizes)):
        assert s.numel() == n and s.data_ptr() % 64 == 0
        s.fill_((i + 1) % 256)
    spans = sorted((s.data_ptr(), s.data_ptr() + s.numel()) for s in slices)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert all(int(s[0]) == int(s[-1]) == (i + 1) % 256 for i, s in enumerate(slices))  # nothing overwrote another
    assert anon_huge_kib() - before >= 64 << 10  # most of the 90 MiB touched faulted in 2 MiB pages
    arena.close()
    del slices, s
    gc.collect()
    assert anon_huge_kib() - before < 16 << 10  # the mappings went with their last slices


@dataclasses.dataclass
class Holder:  # stands for QuantWeight: an inflight dataclass holding tensors
    data: torch.Tensor


def test_owned_tensors_reaches_weights_wherever_layers_keep_them() -> None:
    Holder.__module__ = "inflight.testing.fake"  # the walk follows inflight's own objects only
    lin = torch.nn.Linear(4, 4)
    q = torch.ones(3)
    lin.method = Holder(q)  # type: ignore[assignment]
    lin.parts = [Holder(torch.zeros(2)), {"k": torch.ones(1)}]  # type: ignore[assignment]
    model = torch.nn.Sequential(torch.nn.Sequential(lin))
    found = {id(t) for t in memory.owned_tensors(model)}
    assert {id(lin.weight), id(lin.bias), id(q), id(lin.parts[0].data), id(lin.parts[1]["k"])} <= found
    assert memory.owned_tensors(object()) == []


@needs_thp
def test_the_kv_pool_is_left_alone() -> None:
    """weights_in_huge_pages collapses the weights a model owns but not the KV pool it also reaches
    (a copy of gigabytes at start-up for nothing)."""
    pool = torch.zeros(2, 5 << 20)  # 40 MiB, viewed per layer as the runner's kv_caches are
    kv = [pool[0], pool[1]]
    holder = torch.nn.Linear(4, 4)
    holder.weight = torch.nn.Parameter(torch.ones(3 << 20))  # 12 MiB of "weights"
    holder.caches = kv  # type: ignore[assignment]
    done = memory.weights_in_huge_pages(holder, skip=kv)
    assert 8 << 20 <= done <= 12 << 20  # the weight's whole pages, none of the pool's


@needs_thp
def test_pack_moves_small_weights_into_shared_huge_pages_keeping_views_and_values() -> None:
    Holder.__module__ = "inflight.testing.fake"
    small = torch.arange(300_000, dtype=torch.int32)  # 1.2 MB: no whole 2 MiB page of its own
    view = small[1000:2000]  # a second view of the same storage: re-pointed with it
    big = torch.ones(40 << 18)  # 40 MiB: over max_bytes, collapsed in place instead
    tiny = torch.ones(100)  # under 64 KiB: left alone
    model = torch.nn.Module()
    model.method = Holder(small)  # type: ignore[assignment]
    model.parts = [view, big, tiny]  # type: ignore[assignment]
    pool = torch.zeros(1 << 18)  # the KV pool: skipped
    model.pool = pool  # type: ignore[assignment]
    at = (small.data_ptr(), big.data_ptr(), tiny.data_ptr(), pool.data_ptr())
    assert memory.pack_into_huge_pages(model, skip=[pool]) == 1_200_000
    assert small.data_ptr() != at[0] and (big.data_ptr(), tiny.data_ptr(), pool.data_ptr()) == at[1:]
    assert view.data_ptr() == small.data_ptr() + 4000 and small.untyped_storage().data_ptr() % memory.HUGE_PAGE == 0
    assert torch.equal(small, torch.arange(300_000, dtype=torch.int32)) and torch.equal(view, small[1000:2000])
    with open("/proc/self/smaps") as f:  # the mapping that now holds it is in 2 MiB pages
        text = f.read()
    block = text[text.index(f"{small.untyped_storage().data_ptr():x}-") :].split("VmFlags")[0]
    assert int(block.split("AnonHugePages:")[1].split()[0]) >= 2048
    assert memory.pack_into_huge_pages(model, skip=[pool]) == 0  # packed once: nothing left to move
