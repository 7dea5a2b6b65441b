"""The Triton paged-attention kernels against a float64 reference, on random paged layouts.

Runs on the test device: compiled on a GPU (--device cuda), in Triton's CPU interpreter otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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


def _decode_case(lens: list[int], heads: int, kv_heads: int, hd: int, dtype: torch.dtype, block_size: int = 16):  # noqa: ANN202
    """Decode rows (one query token each) over contexts `lens`, on a shuffled paged cache."""
    gen = torch.Generator().manual_seed(sum(lens) + heads)
    width = max(-(-n // block_size) for n in lens) + 1  # a spare column: the table is wider than any row
    num_blocks = len(lens) * width
    table = torch.randperm(num_blocks, generator=gen).view(len(lens), width).int()
    kv = torch.randn(2, kv_heads, num_blocks * block_size, hd, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, hd, generator=gen).to(dtype)
    starts = torch.arange(len(lens) + 1, dtype=torch.int32)
    return q, kv, starts, torch.tensor(lens, dtype=torch.int32), table


_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


# (row lengths, heads, kv heads, head_dim, window, splits): rows of very different lengths (one
# shorter than a partition, one of a single token, one a padding row of none), GQA groups of 3
# (not a power of 2) and 1, a sliding window, split counts from 2 to past the tiles of a row
SPLIT_CASES = [
    ([300, 5, 1, 0, 130], 6, 2, 24, None, 3),
    ([200, 64, 17], 4, 2, 16, None, 8),
    ([260, 40], 7, 1, 32, 70, 4),
    ([129], 8, 8, 16, None, 2),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: "n{}-h{}-kv{}-d{}-w{}-s{}".format(len(c[0]), *c[1:]))
def test_split_decode_matches_reference(case: tuple, dtype: torch.dtype, test_device: str) -> None:
    lens, heads, kv_heads, hd, window, splits = case
    q, kv, starts, seq_lens, table = _decode_case(lens, heads, kv_heads, hd, dtype)
    dev = torch.device(test_device)
    meta = ta.TritonMeta(starts.to(dev), seq_lens.to(dev), table.to(dev), 1, window)
    ref = _reference(q, kv, starts, lens, table, 16, hd**-0.5, window)
    ref[torch.tensor(lens) == 0] = 0.0  # a row with no context attends to nothing: 0 (the padding rows)
    out = torch.full_like(q, float("nan")).to(dev)
    ta.attention(q.to(dev), kv.to(dev), meta, 16, hd**-0.5, out=out, splits=splits)
    got = out.cpu().double()
    assert torch.isfinite(got).all()
    err = (got - ref).norm() / ref.norm()
    assert err < _TOL[dtype], float(err)
    unsplit = ta.attention(q.to(dev), kv.to(dev), meta, 16, hd**-0.5, splits=1).cpu().double()
    assert (got - unsplit).norm() / ref.norm() < _TOL[dtype]  # the same attention either way
    assert len(meta.scratch) == 1  # the partials: one buffer pair for the step, reused by its layers


def test_split_count_fills_the_gpu_and_honours_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ta.SPLITS_ENV, raising=False)
    # Llama-3-8B on an H100: a row alone fills 2 x 132 SMs (a long context) or stops at one 64-token
    # tile a partition (640 tokens); from 17 rows (136 programs) on no split: today's kernel
    assert ta.row_splits(8, 132) == 33 and ta.row_splits(2, 132) == ta.MAX_SPLITS
    assert ta.num_splits(1, 8, 32768, 132) == 33
    assert ta.num_splits(1, 8, 640, 132) == 10
    assert ta.num_splits(8, 8, 4096, 132) == 33
    assert ta.num_splits(17, 8, 4096, 132) == 1
    assert ta.num_splits(256, 8, 4096, 132) == 1
    assert ta.num_splits(1, 8, 32, 132) == 1  # a context within one tile
    monkeypatch.setenv(ta.SPLITS_ENV, "4")
    assert ta.num_splits(1, 8, 32768, 132) == 4 and ta.row_splits(8, 132) == 4
    for off in ("0", "1"):
        monkeypatch.setenv(ta.SPLITS_ENV, off)
        assert ta.num_splits(1, 8, 32768, 132) == 1
    monkeypatch.setenv(ta.SPLITS_ENV, "lots")
    with pytest.raises(ValueError, match=ta.SPLITS_ENV):
        ta.num_splits(1, 8, 640, 132)


def test_auto_split_decode_over_a_wide_table(test_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured graph's case: the split count follows the table's width (max_model_len), not the
    rows' lengths, so short rows leave most partitions empty and the merge must ignore them."""
    monkeypatch.delenv(ta.SPLITS_ENV, raising=False)
    lens = [70, 3]
    q, kv, starts, seq_lens, table = _decode_case(lens, 4, 2, 16, torch.float32)
    dev = torch.device(test_device)
    wide = torch.cat([table, torch.zeros(2, 60, dtype=torch.int32)], 1)  # 62 blocks of 16: 992 tokens
    meta = ta.TritonMeta(starts.to(dev), seq_lens.to(dev), wide.to(dev), 1)
    sms = ta.sm_count(dev)
    assert ta.num_splits(2, 2, 62 * 16, sms) > 2  # split (on the interpreter's pretend H100 too)
    out = ta.attention(q.to(dev), kv.to(dev), meta, 16, 0.25)
    assert meta.scratch  # it did split
    ref = _reference(q, kv, starts, lens, table, 16, 0.25, None)
    assert (out.cpu().double() - ref).norm() / ref.norm() < 1e-5
    monkeypatch.setenv(ta.SPLITS_ENV, "1")  # the A/B switch: the unsplit kernel, no partials
    off = ta.TritonMeta(starts.to(dev), seq_lens.to(dev), wide.to(dev), 1)
    out_off = ta.attention(q.to(dev), kv.to(dev), off, 16, 0.25)
    assert not off.scratch and (out_off.cpu().double() - ref).norm() / ref.norm() < 1e-5


def test_a_rows_split_result_does_not_depend_on_its_batch_or_table(test_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's partitions follow from its own length: alone with a table as wide as a graph's
    (max_model_len) and padding rows, or in an eager batch, its output is bitwise the same, so
    CUDA graphs give the eager tokens in bf16 too (tests/model/test_gpu_paths.py). A row with one
    partition gives the unsplit kernel's output exactly."""
    monkeypatch.delenv(ta.SPLITS_ENV, raising=False)
    lens = [300, 17, 130]
    q, kv, starts, seq_lens, table = _decode_case(lens, 4, 2, 16, torch.bfloat16)
    dev = torch.device(test_device)
    kv_d = kv.to(dev)
    batch = ta.TritonMeta(starts.to(dev), seq_lens.to(dev), table.to(dev), 1)
    together = ta.attention(q.to(dev), kv_d, batch, 16, 0.25).cpu()
    assert batch.scratch  # it split
    # row 0 alone in a padded "graph" of 2 rows, table 62 blocks wide
    wide = torch.zeros(2, 62, dtype=torch.int32)
    wide[0, : table.shape[1]] = table[0]
    graph = ta.TritonMeta(torch.arange(3, dtype=torch.int32, device=dev), torch.tensor([300, 0], dtype=torch.int32, device=dev), wide.to(dev), 1)
    alone = ta.attention(torch.stack([q[0], q[0]]).to(dev), kv_d, graph, 16, 0.25).cpu()
    assert ta.num_splits(2, 2, 62 * 16, ta.sm_count(dev)) != ta.num_splits(3, 2, table.shape[1] * 16, ta.sm_count(dev))
    assert torch.equal(alone[0], together[0])
    assert torch.equal(alone[1], torch.zeros_like(alone[1]))  # the padding row
    unsplit = ta.attention(q.to(dev), kv_d, batch, 16, 0.25, splits=1).cpu()
    assert torch.equal(together[1], unsplit[1])  # 17 keys: one partition
    assert not torch.equal(together[0], unsplit[0])  # 300 keys: five, rounded differently


_COMPILE = """
import inspect
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from inflight.models import triton_attention as ta

i32 = ("stride", "window", "row_splits", "num_splits")
kernels = [
    ("attention", dict(G=4, G_PAD=4, HEAD_DIM=128, HD_PAD=128, BLOCK_Q=4, BLOCK_N=64, PAGE=16, PRECISION="tf32", UPCAST=False, SPLIT=True)),
    ("merge", dict(HEAD_DIM=128, HD_PAD=128, SPLITS_PAD=64)),
]
for name, consts in kernels:
    fn = ta._kernel(name)
    names = list(inspect.signature(fn.fn).parameters)
    sig = {p: "constexpr" if p in consts else "i32" if p.startswith(i32) else "fp32" if p == "scale" else
           "*fp32" if p.startswith("PART") else "*i32" if p in ("QUERY_START", "SEQ_LENS", "BLOCK_TABLE") else "*bf16"
           for p in names}
    src = ASTSource(fn, sig, {(names.index(p),): v for p, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert compiled.asm["cubin"], name
print("compiled")
"""


def test_split_kernels_compile_for_an_h100(test_device: str) -> None:
    """The interpreter accepts more than Triton's compiler: the split path's two kernels (bf16, the
    8B shape) compiled for sm_90 down to a cubin with Triton's own ptxas, no GPU needed. In a
    process of its own: the interpreter patches triton.language in this one."""
    if test_device.startswith("cuda"):
        pytest.skip("on a GPU the other tests run them compiled")
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


def test_graph_metadata_keeps_one_set_of_split_partials_per_size(test_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a CUDA graph bakes in: the split partials a captured size's warm-up allocates are the
    ones every later call (the capture, each layer) writes, and the backend keeps them."""
    monkeypatch.delenv(ta.SPLITS_ENV, raising=False)
    dev = torch.device(test_device)
    backend = ta.TritonAttention(16, None, dev)
    q, kv, starts, seq_lens, table = _decode_case([150, 3], 4, 2, 16, torch.float32)
    q, kv = q.to(dev), kv.to(dev)

    def graph_meta() -> ta.TritonMeta:  # as DecodeGraphs.capture makes it for one size
        return backend.graph_meta(starts.to(dev), seq_lens.to(dev), table.to(dev), torch.full((2,), -1, device=dev))

    first = ta.attention(q, kv, graph_meta(), 16, 0.25)  # the warm-up
    assert len(backend.graph_scratch) == 1
    (part_o, part_lse), = backend.graph_scratch.values()
    pointers = part_o.data_ptr(), part_lse.data_ptr()
    for _ in range(2):  # the capture, and the next layer: the same buffers, nothing new
        again = ta.attention(q, kv, graph_meta(), 16, 0.25)
        assert torch.equal(again, first)
    (part_o, part_lse), = backend.graph_scratch.values()
    assert (part_o.data_ptr(), part_lse.data_ptr()) == pointers
    assert torch.isinf(part_lse[1, :, 1:]).all() and torch.isfinite(part_lse[0]).all()  # 3 keys: one partition; 150: three


def test_split_decode_through_the_model_matches_hf(
    tiny_model_dir: Callable[..., Path], test_device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split path inside the model: decode steps over contexts of 70-110 tokens (2 tiles), on
    Triton's kernels (CUDA graphs on a GPU), give HF's greedy tokens and logprobs in float32."""
    from test_hf_parity import _hf_run, _vocab

    from inflight import LLM, SamplingParams

    monkeypatch.delenv(ta.SPLITS_ENV, raising=False)
    chosen: list[int] = []
    real = ta.num_splits
    monkeypatch.setattr(ta, "num_splits", lambda *a, **k: chosen.append(real(*a, **k)) or chosen[-1])
    path = tiny_model_dir("llama")
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, _vocab(path), (n,), generator=gen).tolist() for n in (100, 70)]
    llm = LLM(model=str(path), device=test_device, dtype="float32", attention_backend="triton", max_num_seqs=4, progress=False)
    llm.engine.runner.decode_kernel = None  # CPU: decode steps through the model, not the C decode kernel
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.shutdown()
    assert max(chosen) > 1  # decode steps did split
    hf = _hf_run(path, prompts, max_tokens=5, device=test_device)
    for i, out in enumerate(outs):
        o = out.outputs[0]
        assert o.token_ids == hf.tokens[i]
        for step, tok in enumerate(o.token_ids):
            assert abs(o.logprobs[step][tok].logprob - float(hf.logprobs[i][step, tok])) < 1e-4
