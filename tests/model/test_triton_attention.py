"""The Triton paged-attention kernels against a float64 reference, on random paged layouts.

Runs on the test device: compiled on a GPU (--device cuda), in Triton's CPU interpreter otherwise.
"""

from __future__ import annotations

import pytest
import torch

from inflight.models import triton_attention as ta


def _reference(q, kv, query_start, seq_lens, table, block_size, scale, window):  # noqa: ANN001, ANN202
    out = torch.empty(q.shape, dtype=torch.float64)
    group = q.shape[1] // kv.shape[1]
    for s in range(len(seq_lens)):
        a, b, ctx_len = int(query_start[s]), int(query_start[s + 1]), int(seq_lens[s])
        pos = torch.arange(ctx_len)
        slots = table[s][pos // block_size].long() * block_size + pos % block_size
        k = kv[0][:, slots].double().repeat_interleave(group, 0)  # (H, L, hd)
        v = kv[1][:, slots].double().repeat_interleave(group, 0)
        scores = q[a:b].double().transpose(0, 1) @ k.transpose(1, 2) * scale  # (H, n, L)
        q_pos = ctx_len - (b - a) + torch.arange(b - a)
        seen = pos[None, :] <= q_pos[:, None]
        if window:
            seen &= pos[None, :] > q_pos[:, None] - window
        out[a:b] = (scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v).transpose(0, 1)
    return out


# (heads, kv heads, head_dim, window): GQA groups of 2 / 3 (not a power of 2) / 1 / 7, head_dim
# not a power of 2, a sliding window shorter than the context
SHAPES = [(4, 2, 16, None), (6, 2, 24, 5), (8, 8, 32, None), (7, 1, 64, None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-kv{}-d{}-w{}".format(*s))
def test_write_and_attend_match_reference(shape: tuple, dtype: torch.dtype, test_device: str) -> None:
    heads, kv_heads, hd, window = shape
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    block_size, num_blocks = 4, 40
    # decodes (one token, with and without context), fresh prefills and continuation chunks
    q_lens, ctx = [1, 1, 5, 3, 1, 9], [7, 0, 0, 6, 20, 2]
    seq_lens = [a + b for a, b in zip(q_lens, ctx)]
    width = max(-(-n // block_size) for n in seq_lens)
    table = torch.randperm(num_blocks, generator=gen)[: len(seq_lens) * width].view(-1, width).int()
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    t = sum(q_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    kv = rand(2, kv_heads, num_blocks * block_size, hd)
    q, k, v = rand(t, heads, hd), rand(t + 1, kv_heads, hd), rand(t + 1, kv_heads, hd)
    slots = [int(table[s][p // block_size]) * block_size + p % block_size for s in range(len(q_lens)) for p in range(ctx[s], seq_lens[s])]
    slots = torch.tensor([*slots, -1])  # the last row is padding: written nowhere
    before = kv.clone()
    dev = torch.device(test_device)
    kv_d = kv.to(dev)
    ta.write_kv(k.to(dev), v.to(dev), kv_d, slots.to(dev))
    kv_after = kv_d.cpu()
    expected = before.clone()
    expected[0][:, slots[:-1]] = k[:-1].transpose(0, 1)
    expected[1][:, slots[:-1]] = v[:-1].transpose(0, 1)
    assert torch.equal(kv_after, expected)  # every real row written, the padding row nowhere

    meta = ta.TritonMeta(starts.to(dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev), table.to(dev), max(q_lens), window)
    out = torch.full_like(q, float("nan")).to(dev)  # poisoned: every element must be written
    ta.attention(q.to(dev), kv_d, meta, block_size, hd**-0.5, out=out)
    ref = _reference(q, kv_after, starts, seq_lens, table, block_size, hd**-0.5, window)
    got = out.cpu().double()
    assert torch.isfinite(got).all()
    err = (got - ref).norm() / ref.norm()
    # float32: exact products (ieee dots); bf16 / fp16: the output's own rounding dominates
    assert err < {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype], float(err)


def test_decode_rows_with_no_context_write_zeros(test_device: str) -> None:
    """CUDA-graph padding rows: context length 0 attends to nothing and yields 0, not NaN."""
    dev = torch.device(test_device)
    kv = torch.randn(2, 2, 64, 16, device=dev)
    q = torch.randn(3, 4, 16, device=dev)
    meta = ta.TritonMeta(
        torch.arange(4, dtype=torch.int32, device=dev),
        torch.tensor([5, 0, 0], dtype=torch.int32, device=dev),
        torch.zeros(3, 4, dtype=torch.int32, device=dev),
        1,
    )
    out = ta.attention(q, kv, meta, 16, 0.25)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    assert out[0].abs().sum() > 0
