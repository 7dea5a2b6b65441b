"""The fused C decode kernel on a model whose linear methods hold QuantWeights (`method.quant`).

Each linear layer of a tiny float32 / bf16 model gets a QuantWeight (gguf.quants.quantize of its
own weight for q8_0 / q4_0 / q5_0, random valid K-quant blocks of a realistic size for q4_k /
q6_k) and a method that multiplies by dequantize(w) in float (the reference). The kernel reads
the quantized bytes and rounds activations to int8 per 32 (quant_kernels.h): one decode step's
log-probabilities stay within 3 % of their spread of the reference's (0.2-1.8 % measured), the
argmax the same wherever the reference's top two are further apart than that error, and whole
float32 greedy generations are token-identical to the PyTorch path's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from inflight import LLM, SamplingParams
from inflight.models import cpu_kernel
from inflight.models.attention import AttentionMetadata
from inflight.models.linear import LinearBase, LinearMethod, linear_layers
from inflight.quant.weight import QTYPES, QuantWeight, dequantize

BS = 16


class DequantLinear(LinearMethod):
    """The reference: x @ dequantize(quant)^T in the activations' dtype."""

    def __init__(self, quant: QuantWeight) -> None:
        super().__init__()
        self.quant = quant
        self.w = dequantize(quant)

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype), layer.bias)


def _quantize(w: torch.Tensor, qtype: str, gen: torch.Generator) -> QuantWeight:
    n, k = w.shape
    if qtype in ("q8_0", "q4_0", "q5_0"):
        import gguf

        data = gguf.quants.quantize(w.float().numpy(), getattr(gguf.GGMLQuantizationType, qtype.upper()))
        return QuantWeight(qtype, (n, k), torch.from_numpy(np.ascontiguousarray(data)))
    elems, nbytes = QTYPES[qtype]  # K-quants: random valid blocks, |w| <~ 0.1 like the model's
    blocks = torch.randint(0, 256, (n, k // elems, nbytes), generator=gen, dtype=torch.uint8)
    size = {"q4_k": 5e-5, "q6_k": 1e-5}[qtype]  # |w| <= 945 d (q4_k), 4096 d (q6_k)
    for off in {"q4_k": (0, 2), "q6_k": (208,)}[qtype]:
        half = (torch.rand(n, k // elems, generator=gen) * size + size).half()
        blocks[:, :, off : off + 2] = half.view(torch.uint8).view(n, k // elems, 2)
    return QuantWeight(qtype, (n, k), blocks.reshape(n, -1).contiguous())


def _quantized_llm(path: Path, dtype: str, qtype: str) -> LLM:
    llm = LLM(model=str(path), dtype=dtype, device="cpu", block_size=BS, num_kv_blocks=32,
              enable_prefix_caching=False, progress=False, cpu_fast_path=False)  # fmt: skip  # plain weights
    runner = llm.engine.runner
    gen = torch.Generator().manual_seed(0)
    for layer in linear_layers(runner.model):
        layer.method = DequantLinear(_quantize(layer.weight.detach(), qtype, gen))
    runner.decode_kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS)
    assert runner.decode_kernel is not None and runner.decode_kernel.quant
    return llm


def _step(llm: LLM, ids: list[int], positions: list[int], kernel: bool) -> torch.Tensor:
    """Log-probabilities of one decode step of len(ids) rows (row i on blocks 2i+1, 2i+2)."""
    runner = llm.engine.runner
    tables = [[2 * i + 1, 2 * i + 2] for i in range(len(ids))]
    slots = [t[p // BS] * BS + p % BS for t, p in zip(tables, positions)]
    if kernel:
        k = runner.decode_kernel
        return torch.log_softmax(k.logits(k.forward(ids, positions, slots, tables)), -1)
    mask = torch.arange(2 * BS)[None, :] <= torch.tensor(positions)[:, None]
    bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))[None, :, None, :]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), num_decodes=len(ids), decode_blocks=torch.tensor(tables),
                             decode_bias=bias, block_size=BS)  # fmt: skip
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(ids), torch.tensor(positions), runner.kv_caches, meta)
        return torch.log_softmax(runner.model.compute_logits(hidden).float(), -1)


@pytest.mark.parametrize(("qtype", "dtype", "dims"), [
    ("q8_0", "float32", {}), ("q4_0", "bfloat16", {}), ("q5_0", "float32", {}),
    ("q4_k", "float32", {"hidden_size": 256, "intermediate_size": 512}),
    ("q6_k", "bfloat16", {"hidden_size": 256, "intermediate_size": 512}),
])  # fmt: skip
def test_quantized_step_matches_dequantized_reference(qtype: str, dtype: str, dims: dict[str, Any],
                                                      tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    llm = _quantized_llm(tiny_model_dir("qwen2", **dims), dtype, qtype)
    pool = llm.engine.runner.kv_pool
    gen = torch.Generator().manual_seed(1)
    pool.copy_(torch.randn(pool.shape, generator=gen).to(pool.dtype))
    start = pool.clone()
    ids, positions = [5, 77, 301], [20, 3, 31]
    ref = _step(llm, ids, positions, kernel=False)
    ref_kv = pool.clone()
    pool.copy_(start)
    got = _step(llm, ids, positions, kernel=True)
    err = (got - ref).abs().max(-1).values
    spread = ref.max(-1).values - ref.min(-1).values
    assert (err <= 0.03 * spread).all(), (err, spread)  # int8 activations: 0.2-1.8 % measured
    top2 = ref.topk(2, -1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * err  # rows whose best token is not within the error of a tie
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])
    assert (pool.float() - ref_kv.float()).abs().max() <= 0.05 * ref_kv.float().abs().max()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_generation_identical_to_pytorch_path(arch: str, tiny_model_dir: Callable[..., Path]) -> None:
    llm = _quantized_llm(tiny_model_dir(arch), "float32", "q8_0")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[3, 17, 99, 250, 7], [11, 12]]
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    llm.engine.runner.decode_kernel = None
    eager = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert fused == eager
