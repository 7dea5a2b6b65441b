"""The decode kernel's vectorised attention and SiLU (inflight/csrc/attend_vec.h, silu_vec.h) give
the bits of their scalar loops (the same build with -DIFL_ATTN_REF -DIFL_SILU_REF): each score,
softmax, P.V output and SiLU product is computed with the same float32 operations in the same
order, only several at once. The other tests compare with a tolerance, so a changed summation order
(a reassociated dot product, lanes summed in a tree, an unfused multiply-add) passes them; it fails
here. Both one-row paths (a task per key head, M = 1; a task per query head, M > 1), a context of
several 16-position passes and a partial one, bf16 and float32 models and a Q8_0 GGUF (the SiLU
block's int8 rounding), an odd number of query heads per key head (P.V's single-head pass), a
sliding window and an intermediate size with a partial 32-element block.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from inflight import LLM, platform
from inflight.models import cpu_kernel
from inflight.testing.gguf import hf_to_gguf

BS = 16
FLAVOURS = [f for f in ("avx512bf16", "avx2") if platform.current().can_run(f)]  # the portable build has no vector path


def _run(llm: LLM, lib: Any, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and the K/V pool after a step of `rows` rows of one sequence at positions 37.. (blocks
    5, 1, 3, 0, 2: not in order), from the same random cache."""
    runner = llm.engine.runner
    kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS, lib=lib)
    assert kernel is not None
    gen = torch.Generator().manual_seed(rows)
    pool = runner.kv_pool
    pool.copy_((torch.randn(pool.shape, generator=gen) * 3).to(pool.dtype))  # * 3: a peaked softmax
    blocks, positions = [5, 1, 3, 0, 2], list(range(37, 37 + rows))
    ids = torch.randint(3, kernel.vocab, (rows,), generator=gen).tolist()
    slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in positions])
    table = torch.tensor([blocks] * rows, dtype=torch.int32)
    with torch.inference_mode():
        logits = kernel.logits(kernel.forward(ids, positions, slots, table))
    return logits, pool.clone()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(("arch", "dtype", "config"), [
    ("qwen3", torch.float32, {"num_attention_heads": 6, "head_dim": 64}),  # 3 query heads a key head
    ("qwen3", torch.bfloat16, {"intermediate_size": 144}),  # head_dim 32 (bf16 roundings hide most one-ulp slips: float32 catches them)
    ("qwen3", torch.bfloat16, {"num_attention_heads": 10, "head_dim": 96}),  # P.V 4 + 1 heads a pass, 64 + 32 elements
    ("mistral", torch.float32, {}),  # head_dim 16, a 16-position window
    ("qwen2", "q8_0", {}),
])  # fmt: skip
def test_vector_attention_and_silu_have_the_scalar_bits(flavour: str, arch: str, dtype: torch.dtype | str,
                                                        config: dict[str, Any],
                                                        tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:  # fmt: skip
    if dtype == "q8_0":  # served in float32, as the GGUF benchmarks
        path, dtype = hf_to_gguf(tiny_model_dir(arch, **config), tmp_path / "m.gguf", "q8_0"), torch.float32
    else:
        path = tiny_model_dir(arch, dtype=dtype, **config)
    assert isinstance(dtype, torch.dtype)
    llm = LLM(model=str(path), dtype=str(dtype).removeprefix("torch."), device="cpu", block_size=BS,
              num_kv_blocks=8, enable_prefix_caching=False, progress=False)  # fmt: skip
    variant = cpu_kernel.Variant(flavour, dtype, dtype)
    vec, ref = cpu_kernel.load_library(variant), cpu_kernel.load_library(variant, ("IFL_ATTN_REF", "IFL_SILU_REF"))
    for rows in (1, 3):
        (a, kv_a), (b, kv_b) = _run(llm, vec, rows), _run(llm, ref, rows)
        assert torch.equal(kv_a, kv_b)
        assert torch.equal(a, b), f"{rows} rows: logits differ by up to {(a - b).abs().max().item()}"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_gemv_tiles_and_claims_do_not_change_the_bits(flavour: str,
                                                      tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:  # fmt: skip
    """qgemv's tile rows (qg_rows: 8-row tiles where a row is wide, QG_TILE_BYTES) and the tile
    queue's tapering claims (TQ_TAPER) move work between threads, never a row's sum: a build with
    8-row tiles everywhere and untapered claims gives the same logits and K / V bit for bit."""
    path = hf_to_gguf(tiny_model_dir("qwen2"), tmp_path / "m.gguf", "q8_0")
    llm = LLM(model=str(path), dtype="float32", device="cpu", block_size=BS, num_kv_blocks=8,
              enable_prefix_caching=False, progress=False)  # fmt: skip
    variant = cpu_kernel.Variant(flavour, torch.float32, torch.float32)
    now, other = cpu_kernel.load_library(variant), cpu_kernel.load_library(variant, ("QG_TILE_BYTES=1", "TQ_TAPER=0"))
    for rows in (1, 3):
        (a, kv_a), (b, kv_b) = _run(llm, now, rows), _run(llm, other, rows)
        assert torch.equal(kv_a, kv_b)
        assert torch.equal(a, b), f"{rows} rows: logits differ by up to {(a - b).abs().max().item()}"
