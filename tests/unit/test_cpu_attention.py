"""The C decode attention (inflight/csrc/attention_kernels.c) against a float64 reference on random
paged layouts, in every flavour this CPU runs, and its place in attention.py's decode path."""

from __future__ import annotations

import zlib

import pytest
import torch

from inflight import platform
from inflight.models import attention, cpu_attention

FLAVOURS = [f for f in platform.QUANT_FLAVOURS if platform.current().can_run_quant(f)]


def _reference(q, kv, table, lens, block_size, scale, window):  # noqa: ANN001, ANN202
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // kv.shape[1]
    for d, n in enumerate(lens.tolist()):
        pos = torch.arange(max(0, n - window) if window else 0, n)
        slots = table[d][pos // block_size] * block_size + pos % block_size
        k = kv[0][:, slots].double().repeat_interleave(group, 0)  # (H, L, hd)
        v = kv[1][:, slots].double().repeat_interleave(group, 0)
        scores = (k @ q[d].double()[:, :, None])[..., 0] * scale  # (H, L)
        out[d] = (scores.softmax(-1)[:, None, :] @ v)[:, 0]
    return out


# (heads, kv heads, head_dim, block size, window): Qwen2.5-0.5B's 14 / 2 / 64 / 16; a group of 3
# with a head_dim off the 8-lane and 64-float steps (the scalar tails); 128 and 96 (two 64-float
# chunks, one and a tail); a sliding window shorter than most contexts
SHAPES = [(14, 2, 64, 16, None), (6, 2, 20, 4, None), (8, 8, 128, 16, 9), (4, 1, 96, 8, None), (14, 2, 64, 16, 37)]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}-b{}-w{}".format(*s))
def test_decode_attention_matches_reference(shape: tuple, flavour: str) -> None:
    heads, kv_heads, hd, bs, window = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr(shape).encode()))
    lens = torch.tensor([1, 7, bs, bs + 1, 150, 61])  # one position; inside, at and past a block's end
    width = -(-int(lens.max()) // bs) + 2  # a wider table than the rows use (its padding unread)
    num_blocks = len(lens) * width + 3
    table = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width)
    kv = torch.randn(2, kv_heads, num_blocks * bs, hd, generator=gen) * 2  # scores of a few units
    q = torch.randn(len(lens), heads, hd, generator=gen)
    lib = cpu_attention.load(flavour)
    got = cpu_attention.decode_attention(q, kv, table[:, : width - 1], lens, bs, window, hd**-0.5, lib=lib)
    want = _reference(q, kv, table, lens, bs, hd**-0.5, window)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)


def test_the_decode_path_takes_it_for_float32_only() -> None:
    """attention.py's decode rows go through the C kernel where available (the same outputs as the
    gather + batched matmul path within float32 rounding), never for a bf16 cache."""
    gen = torch.Generator().manual_seed(3)
    bs, lens = 16, [40, 3, 17]
    backend = attention.TorchAttention(bs, None, torch.device("cpu"))
    kv = torch.randn(2, 2, 12 * bs, 64, generator=gen)
    q = torch.randn(3, 14, 64, generator=gen)
    meta = attention.AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.int64), num_decodes=3, block_size=bs)
    meta.decode_bias = backend._decode_bias(lens)
    meta.decode_blocks = torch.tensor([[4, 9, 0], [7, 0, 0], [1, 2, 0]])
    torch_path = attention._decode_attention(q, kv, meta, 0.125)
    meta.decode_lens = torch.tensor(lens)
    c_path = attention._decode_attention(q, kv, meta, 0.125)
    torch.testing.assert_close(c_path, torch_path, rtol=1e-5, atol=1e-6)
    native = platform.current().quant_flavour() != "portable"
    assert cpu_attention.available(q, kv, bs) is native
    assert not cpu_attention.available(q.bfloat16(), kv.bfloat16(), bs)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_nan_key_gives_nan_rows_as_torch_does(flavour: str) -> None:
    """A NaN in the cache (a broken checkpoint, an overflowed activation) must show, not vanish:
    the vector exp once clamped NaN to its lower bound, so the NaN score weighed 0 and the row
    looked healthy. Rows whose heads read the NaN key are NaN as in torch; the others unchanged."""
    gen = torch.Generator().manual_seed(5)
    bs, lens = 16, torch.tensor([40, 17])
    table = torch.tensor([[0, 1, 2], [3, 4, 5]])
    kv = torch.randn(2, 2, 6 * bs, 64, generator=gen)
    kv[0, 1, 3 * bs + 5] = float("nan")  # row 1, position 5, kv head 1: query heads 7..13
    q = torch.randn(2, 14, 64, generator=gen)
    got = cpu_attention.decode_attention(q, kv, table, lens, bs, None, 0.125, lib=cpu_attention.load(flavour))
    want = _reference(q, kv, table, lens, bs, 0.125, None)
    assert torch.equal(got.isnan(), want.isnan()) and bool(want[1, 7:].isnan().all())
    torch.testing.assert_close(got[~want.isnan()].double(), want[~want.isnan()], rtol=1e-5, atol=2e-6)


def test_a_failed_build_is_not_remembered_after_its_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """cbuild.platform_library: under CC=false (a test of the no-compiler fallback) the build fails
    and the torch path runs; once CC is back the same call builds and loads the library (a cache of
    the first answer made later tests in the process silently run the torch path)."""
    from inflight.models import cbuild

    flavour = FLAVOURS[-1]
    flags = cbuild.quant_compile_flags(flavour)
    build = lambda f: __import__("ctypes").CDLL(str(cbuild.compile_cached(cpu_attention.SOURCE, f"attn-{f}", flags)))  # noqa: E731
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # exists, exits 1
    assert cbuild.platform_library(build, flavour, "test attention") is None
    monkeypatch.delenv("CC")
    lib = cbuild.platform_library(build, flavour, "test attention")
    assert lib is not None and lib.ifl_attn_abi_version() == cpu_attention.ABI_VERSION
    assert cbuild.library_asked(build) and not cbuild.library_asked(lambda f: None)
