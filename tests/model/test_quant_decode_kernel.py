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

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from inflight import LLM, SamplingParams, platform
from inflight.models import cpu_kernel
from inflight.models.attention import AttentionMetadata
from inflight.models.linear import LinearBase, LinearMethod, linear_layers
from inflight.quant import kernels as quant_kernels
from inflight.quant.linear import quantize_rtn
from inflight.quant.weight import QTYPES, QuantWeight, dequantize, regroup

BS = 16


class DequantLinear(LinearMethod):
    """The reference: x @ dequantize(weights)^T in the activations' dtype. `weights`: runs of rows
    stacked along N, as inflight/quant/linear.py's QuantLinear keeps them."""

    quantized = True

    def __init__(self, weights: list[QuantWeight]) -> None:
        super().__init__()
        self.weights = weights
        self.w = torch.cat([dequantize(w) for w in weights])

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype), layer.bias)


def _quantize(w: torch.Tensor, qtype: str, gen: torch.Generator) -> QuantWeight:
    n, k = w.shape
    if qtype == "f8c":  # FP8 e4m3 per output channel, as --quantization fp8 writes it
        return quantize_rtn(w, "f8c")
    if qtype in ("f16", "bf16"):  # a GGUF's F16 / BF16 layer beside quantized ones
        return QuantWeight(qtype, (n, k), w.to(torch.float16 if qtype == "f16" else torch.bfloat16).contiguous())
    if qtype in ("q5_0g", "q4_0g"):  # regrouped at load where the AVX-512 VNNI kernels run (quant/linear.py)
        return regroup(_quantize(w, qtype[:-1], gen))
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


def _quantized_llm(path: Path, dtype: str, qtype: str, lm_head: bool = True, mixed: bool = False) -> LLM:
    """`lm_head`: quantize it too (else it stays float, as a GGUF's tied embedding does, and the
    kernel multiplies it as Q8_0 blocks of its own); `mixed`:
    each fused layer's first partition q8_0, the rest `qtype` (a Q4_K_M file's q / k / v)."""
    llm = LLM(model=str(path), dtype=dtype, device="cpu", block_size=BS, num_kv_blocks=32,
              enable_prefix_caching=False, progress=False, cpu_fast_path=False)  # fmt: skip  # plain weights
    runner = llm.engine.runner
    gen = torch.Generator().manual_seed(0)
    for layer in linear_layers(runner.model):
        if layer is runner.model.lm_head and not lm_head:
            continue
        w = layer.weight.detach()
        if mixed and len(layer.output_sizes) > 1:
            first = layer.output_sizes[0]
            parts = [_quantize(w[:first], "q8_0", gen), _quantize(w[first:], qtype, gen)]
        else:
            parts = [_quantize(w, qtype, gen)]
        layer.method = DequantLinear(parts)
    runner.decode_kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS)
    assert runner.decode_kernel is not None and runner.decode_kernel.quant
    # a float lm_head is multiplied as Q8_0 blocks, unless INFLIGHT_QUANT_LM_HEAD=0 keeps the model's own
    assert (runner.decode_kernel.lm_head is None) == (not lm_head and os.environ.get("INFLIGHT_QUANT_LM_HEAD") == "0")
    return llm


def _step(llm: LLM, ids: list[int], positions: list[int], kernel: bool) -> torch.Tensor:
    """Log-probabilities of one decode step of len(ids) rows (row i on blocks 2i+1, 2i+2)."""
    runner = llm.engine.runner
    tables = [[2 * i + 1, 2 * i + 2] for i in range(len(ids))]
    slots = [t[p // BS] * BS + p % BS for t, p in zip(tables, positions)]
    if kernel:
        k = runner.decode_kernel
        return torch.log_softmax(k.logits(k.forward(ids, positions, torch.tensor(slots), torch.tensor(tables))), -1)
    mask = torch.arange(2 * BS)[None, :] <= torch.tensor(positions)[:, None]
    bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))[None, :, None, :]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), num_decodes=len(ids), decode_blocks=torch.tensor(tables),
                             decode_bias=bias, block_size=BS)  # fmt: skip
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(ids), torch.tensor(positions), runner.kv_caches, meta)
        return torch.log_softmax(runner.model.compute_logits(hidden).float(), -1)


K256 = {"hidden_size": 256, "intermediate_size": 512}


@pytest.mark.parametrize(("qtype", "dtype", "dims", "options"), [
    ("q8_0", "float32", {}, {}), ("q4_0", "bfloat16", {}, {"lm_head": False}),
    ("q5_0", "float32", {}, {"mixed": True}), ("q4_k", "float32", K256, {"mixed": True, "lm_head": False, "env": True}),
    ("q5_0g", "float32", K256, {"mixed": True}), ("q4_0g", "bfloat16", K256, {}),
    ("q6_k", "bfloat16", K256, {}),
])  # fmt: skip
def test_quantized_step_matches_dequantized_reference(qtype: str, dtype: str, dims: dict[str, Any],
                                                      options: dict[str, bool], monkeypatch: pytest.MonkeyPatch,
                                                      tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    if options.pop("env", False):
        monkeypatch.setenv("INFLIGHT_QUANT_LM_HEAD", "0")
    llm = _quantized_llm(tiny_model_dir("qwen2", **dims), dtype, qtype, **options)
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


@pytest.mark.parametrize("flavour", list(platform.KERNEL_FLAVOURS))
@pytest.mark.parametrize(("qtype", "dtype", "lm_head"), [("f8c", "float32", False), ("f16", "float32", True),
                                                     ("bf16", "bfloat16", False)])  # fmt: skip
def test_float_layouts_step_matches_dequantized_reference(qtype: str, dtype: str, lm_head: bool, flavour: str,
                                                          tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """f8c (FP8 e4m3, `--quantization fp8`), f16 and bf16 QuantWeights in the fused step, every
    instruction-set flavour (forced: the libraries are built per flavour): widened in registers
    against float activations, so the step is the reference's up to summation order (float32) or
    the bf16 rounding both sides share. A float lm_head beside float layouts is multiplied by its
    own rows (no Q8_0 copy: float activations throughout)."""
    if not platform.current().can_run(flavour):
        pytest.skip(f"{flavour} does not run here")
    llm = _quantized_llm(tiny_model_dir("qwen2"), dtype, qtype, lm_head=lm_head)
    runner = llm.engine.runner
    storage = getattr(torch, dtype)
    lib = cpu_kernel.load_library(cpu_kernel.Variant(flavour, storage, storage))
    runner.decode_kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS, lib=lib)
    pool = runner.kv_pool
    pool.copy_(torch.randn(pool.shape, generator=torch.Generator().manual_seed(1)).to(pool.dtype))
    start = pool.clone()
    ids, positions = [5, 77, 301], [20, 3, 31]
    ref = _step(llm, ids, positions, kernel=False)
    ref_kv = pool.clone()
    pool.copy_(start)
    got = _step(llm, ids, positions, kernel=True)
    if dtype == "float32":
        assert (got - ref).abs().max().item() <= 1e-4
        assert (pool - ref_kv).abs().max().item() <= 1e-5
    else:  # both round activations to bf16 at the same points; products summed in another order
        spread = ref.max(-1).values - ref.min(-1).values
        assert ((got - ref).abs().max(-1).values <= 0.01 * spread).all()
        assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_fp8_layers_beside_q8_0_ones_in_one_fused_layer(tiny_model_dir: Callable[..., Path]) -> None:
    """A fused layer of an integer part (int8 activations) and an f8c part (float activations)."""
    llm = _quantized_llm(tiny_model_dir("qwen2"), "float32", "f8c", mixed=True)
    ids, positions = [5, 77], [20, 3]
    llm.engine.runner.kv_pool.zero_()
    ref = _step(llm, ids, positions, kernel=False)
    llm.engine.runner.kv_pool.zero_()
    got = _step(llm, ids, positions, kernel=True)
    spread = ref.max(-1).values - ref.min(-1).values
    assert ((got - ref).abs().max(-1).values <= 0.03 * spread).all()  # the q8_0 parts' int8 activations


@pytest.mark.parametrize("arch", ["qwen3"])  # q/k norms, tied embedding
def test_greedy_generation_identical_to_pytorch_path(arch: str, tiny_model_dir: Callable[..., Path]) -> None:
    llm = _quantized_llm(tiny_model_dir(arch), "float32", "q8_0")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[3, 17, 99, 250, 7], [11, 12]]
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    llm.engine.runner.decode_kernel = None
    eager = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert fused == eager


@pytest.mark.parametrize(("arch", "qtype", "types"), [
    ("qwen2", "q8_0", None),  # tied embedding: the lm_head stays the model's float one
    ("llama", "q4_k", {"attn_v": "q6_k", "ffn_down": "q6_k"}),  # Q4_K_M-like: q / k / v of two types
    ("qwen2", "q5_0", {"attn_v": "q8_0"}),  # K = 256: regrouped (q5_0g) where the VNNI kernels run
    ("qwen2", "q4_0", None),  # likewise q4_0g
])  # fmt: skip
def test_gguf_batch1_decodes_fused_and_matches_transformers(arch: str, qtype: str, types: dict[str, str] | None,
                                                            tiny_model_dir: Callable[..., Path],
                                                            tmp_path: Path) -> None:  # fmt: skip
    """A GGUF file served batch-1 takes the fused kernel (the paths line says so) and its greedy
    tokens are transformers' (whose GGUF loader dequantizes to float32)."""
    from transformers import AutoModelForCausalLM

    from inflight.testing.gguf import hf_to_gguf

    src = tiny_model_dir(arch, **(K256 if qtype in ("q4_k", "q5_0", "q4_0") else {}))
    for f in ("config.json", "generation_config.json"):
        (tmp_path / f).write_text((src / f).read_text())
    path = hf_to_gguf(src, tmp_path / "model.gguf", qtype, types=types)
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, max_num_seqs=1, progress=False)
    runner = llm.engine.executor.runner
    assert runner.decode_kernel is not None and runner.decode_kernel.quant
    assert "quantized weights" in runner.model.cpu_paths.summary
    qtypes = {w.qtype for layer in linear_layers(runner.model) for w in getattr(layer.method, "weights", [])}
    assert (qtype + "g" in qtypes) == (qtype in ("q5_0", "q4_0") and quant_kernels.regroups()), qtypes
    if qtype in ("q5_0", "q4_0"):  # the tied lm_head and the embedding share one (regrouped) copy
        assert runner.model.model.embed_tokens.qweight is runner.model.lm_head.method.weights[0]
    prompt = torch.randint(3, 1000, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    tokens = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                          do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    assert tokens == ref


def test_cpu_kernel_off_applies_to_quantized_models(tiny_model_dir: Callable[..., Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """INFLIGHT_CPU_KERNEL=0 means no fused kernel, whatever the weights (the loader's log says
    "off"; a quantized model used to get one anyway)."""
    llm = _quantized_llm(tiny_model_dir("qwen2"), "float32", "q8_0")
    runner = llm.engine.runner
    monkeypatch.setenv("INFLIGHT_CPU_KERNEL", "0")
    assert cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS) is None


# the embedding row dequantized in C (float32, or rounded to bf16); the model's own rows
@pytest.mark.parametrize(("file", "dtype"), [("q8_0", "float32"), ("q8_0", "bfloat16"), ("bf16", "bfloat16")])
def test_lone_greedy_stream_in_one_call_is_the_step_bit_for_bit(file: str, dtype: str, tiny_model_dir: Callable[..., Path],
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A lone greedy stream's decode steps run as one C call each (worker/one_decode.py): the same
    tokens and logprobs, to the bit, as the runner's general step over the same kernel."""
    from inflight.testing.gguf import hf_to_gguf
    from inflight.worker import model_runner, one_decode

    src = tiny_model_dir("qwen2", dtype=torch.bfloat16)
    path = src if file == "bf16" else hf_to_gguf(src, tmp_path / "model.gguf", file)
    llm = LLM(model=str(path), tokenizer=str(src), dtype=dtype, device="cpu", num_kv_blocks=32, max_num_seqs=1,
              enable_prefix_caching=False, progress=False)  # fmt: skip
    calls: list[int] = []
    run = one_decode.OneDecode.__call__
    monkeypatch.setattr(one_decode.OneDecode, "__call__", lambda self, *a: calls.append(1) or run(self, *a))
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)  # cumulative_logprob: the chosen token's

    def generate() -> list[tuple[list[int], float | None, str]]:
        outs = llm.generate([{"prompt_token_ids": [5, 9, 200, 31]}, {"prompt_token_ids": [7] * 19}], params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob, o.outputs[0].text) for o in outs]

    lane = generate()
    assert len(calls) == 2 * 19  # every decode step after each prefill
    monkeypatch.setattr(model_runner, "decode_one", lambda *a: False)
    assert generate() == lane and len(calls) == 2 * 19
    llm.engine.kv.pool.check_idle()


@pytest.mark.parametrize("flavour", list(platform.KERNEL_FLAVOURS))
def test_prefetch_and_spin_barrier_build_gives_the_same_bits(flavour: str,
                                                            tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """decode_kernel.c's own barrier (the default build) and prefetch_ahead.h's prefetch (the next
    GEMV's rows in the norms, SiLU and barrier waits and at the step's end; the barrier made to sleep
    on its futex as soon as its plan is done) compute an OpenMP-barrier build's logits and KV bit for
    bit: one row (a task per key head) and three."""
    if not platform.current().can_run(flavour):
        pytest.skip(f"{flavour} does not run here")
    llm = _quantized_llm(tiny_model_dir("qwen2"), "float32", "q8_0")
    runner, variant = llm.engine.runner, cpu_kernel.Variant(flavour, torch.float32, torch.float32)
    libs = [cpu_kernel.load_library(variant, extra) for extra in
            ((), ("IFL_SPIN_BARRIER=0",), ("IFL_PF=1", "IFL_PF_BYTES=8192", "IFL_PF_TAIL=8192", "PF_SPINS=0"))]  # fmt: skip
    pool = runner.kv_pool
    pool.copy_(torch.randn(pool.shape, generator=torch.Generator().manual_seed(1)).to(pool.dtype))
    start = pool.clone()
    for ids, positions in (([5], [20]), ([5, 77, 301], [20, 3, 31])):
        got = []
        for lib in libs:
            runner.decode_kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS, lib=lib)
            pool.copy_(start)
            for _ in range(3):  # barriers reused across steps
                logits = _step(llm, ids, positions, kernel=True)
            got.append((logits, pool.clone()))
        for logits, kv in got[::2]:  # the default build and the prefetching one against OpenMP's barrier
            assert torch.equal(logits, got[1][0]) and torch.equal(kv, got[1][1])
