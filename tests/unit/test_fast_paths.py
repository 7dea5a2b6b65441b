"""CPU fast paths that must return exactly what the plain torch op returns."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from inflight.models.attention import block_rows, gather_blocks
from inflight.quant import kernels
from inflight.sample.sampler import Sampler, SamplingBatch, row_argmax


@pytest.mark.parametrize("shape", [(1, 151936), (32, 1000), (5, 1003), (4, 100), (2, 128), (7, 129)])
@pytest.mark.parametrize("case", ["random", "ties", "max_in_tail", "nan", "nan_first", "all_-inf", "signed_zeros"])
@pytest.mark.parametrize("c_kernel", ["1", "0"])  # inflight/csrc/quant_kernels.c ifl_row_argmax, or torch ops
def test_row_argmax_equals_torch_argmax(shape: tuple[int, int], case: str, c_kernel: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", c_kernel)
    if c_kernel == "1":
        assert kernels._library() is not None  # loaded, as a quantized model's start-up does
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, case)).encode()) % 1000)
    x = torch.randn(*shape, generator=g)
    if case == "ties":  # the first maximum must win, inside a chunk and across chunks
        x = torch.randint(0, 3, shape, generator=g).float()
    elif case == "max_in_tail":
        x[:, -1] = x.max() + 1
    elif case == "nan":  # torch treats NaN as the maximum
        x[0, shape[1] // 2] = float("nan")
        x[-1, -1] = float("nan")
    elif case == "nan_first":
        x[:, 0] = float("nan")
    elif case == "all_-inf":
        x[:] = float("-inf")
    elif case == "signed_zeros":  # -0 == 0: the first of them is the maximum
        x = -x.abs()
        x[:, shape[1] // 3] = -0.0
        x[:, shape[1] // 2] = 0.0
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))


def test_row_argmax_of_a_non_contiguous_view() -> None:
    x = torch.randn(6, 300)[::2]  # rows with a stride of 600
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
    t = torch.randn(300, 4).T  # columns: stride(1) != 1 falls back
    assert torch.equal(row_argmax(t), t.argmax(dim=-1))


def test_gather_blocks_matches_per_slot_indexing() -> None:
    kv_heads, hd, bs, num_blocks = 2, 8, 4, 10
    cache = torch.randn(2, kv_heads, num_blocks * bs, hd)
    blocks = torch.tensor([[3, 0, 7], [9, 9, 1]])  # (D, n), block 0 as padding, a repeat
    slots = (blocks[..., None] * bs + torch.arange(bs)).reshape(2, -1)  # (D, n * bs)
    want = cache[:, :, slots]  # (2, KV, D, n * bs, hd)
    assert torch.equal(gather_blocks(cache, blocks, bs), want)
    rows = block_rows(blocks, cache, bs)
    assert rows.shape == (2 * kv_heads * blocks.numel(),)
    assert torch.equal(gather_blocks(cache, blocks, bs, rows), want)
    one = torch.tensor([5, 2])  # a prefill piece's table: (n,) -> (2, KV, n * bs, hd)
    assert torch.equal(gather_blocks(cache, one, bs), cache[:, :, (one[:, None] * bs + torch.arange(bs)).reshape(-1)])


@pytest.mark.parametrize("c_kernel", ["1", "0"])  # greedy token + logprob: quant_kernels.c ifl_row_stats, or torch ops
def test_the_sampler_skips_logprobs_no_row_reads_and_keeps_its_tokens(c_kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """chosen_logprobs=False (no row reports a logprob): no log-softmax, NaN logprobs, the same
    tokens as with logprobs, greedy and seeded alike; greedy rows are the raw logits' argmax."""
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", c_kernel)
    if c_kernel == "1":
        assert kernels._library() is not None  # loaded, as a quantized model's start-up does
    logits = torch.randn(6, 50_000, generator=torch.Generator().manual_seed(3))
    greedy = {on: Sampler()(logits, SamplingBatch.greedy(6, chosen_logprobs=on)) for on in (True, False)}
    assert [s.token_id for s in greedy[False]] == [s.token_id for s in greedy[True]] == logits.argmax(-1).tolist()
    assert all(math.isnan(s.logprob) for s in greedy[False])
    lse = torch.logsumexp(logits.double(), -1)
    assert [s.logprob for s in greedy[True]] == pytest.approx((logits.double().amax(-1) - lse).tolist(), abs=1e-5)

    def seeded(on: bool) -> list[int]:
        gens = {r: torch.Generator().manual_seed(r) for r in range(6)}
        batch = SamplingBatch.build([0.0, 0.7, 1.0, 0.0, 1.3, 0.9], [0, 40, 0, 0, 0, 5], [1.0, 0.9, 1.0, 1.0, 0.8, 1.0],
                                    gens, [None] * 6, torch.device("cpu"))  # fmt: skip
        batch.chosen_logprobs = on
        return [s.token_id for s in Sampler()(logits, batch)]

    assert seeded(False) == seeded(True)
