"""The C decode kernel (inflight/csrc/decode_kernel.c) against the eager PyTorch model and HF.

One decode step from the same KV cache state is run three ways: the kernel, the eager model in
the same dtype, and the eager model in float32 on the same weights and cache (the exact-math
reference). A bf16 kernel must be at least about as close to the reference as the eager bf16
path is and write the same K/V; a float32 kernel (float32 or bf16 GEMV weights) must match the
eager float32 model to float32 rounding. Whole bf16 generations must agree with Hugging Face
bf16. Every variant runs in the flavour the platform module picks for this CPU (and the portable
C build beside it); tests/model/test_cpu_dispatch.py forces the other flavours.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams, platform
from inflight.models import cpu_kernel
from inflight.models.attention import AttentionMetadata
from inflight.testing import ARCHS
from inflight.worker.one_decode import OneDecode

BS = 16
CONTEXTS = [40, 5, 17, 33]  # one per decode row; > 16 crosses mistral's sliding window


def _llm(path: Path, dtype: str, **kwargs: Any) -> LLM:
    return LLM(model=str(path), dtype=dtype, device="cpu", block_size=BS, num_kv_blocks=32,
               enable_prefix_caching=False, progress=False, **kwargs)  # fmt: skip


def _lib(storage: torch.dtype = torch.bfloat16, weights: torch.dtype = torch.bfloat16, flavour: str | None = None) -> Any:
    """The kernel build for this CPU (gcc is part of the machines the suite runs on)."""
    flavour = flavour or platform.current().kernel_flavour()
    return cpu_kernel.load_library(cpu_kernel.Variant(flavour, storage, weights))


@pytest.fixture(scope="module")
def native() -> Any:
    return _lib()


def _rows(m: int) -> tuple[list[int], list[int], list[list[int]]]:
    """positions, slots and block tables of m decode rows on disjoint blocks."""
    positions, slots, tables, nxt = [], [], [], 1
    for ctx in CONTEXTS[:m]:
        n = ctx // BS + 1
        blocks = list(range(nxt, nxt + n))
        nxt += n
        positions.append(ctx)
        slots.append(blocks[ctx // BS] * BS + ctx % BS)
        tables.append(blocks)
    return positions, slots, tables


def _eager_step(llm: LLM, ids: list[int], positions: list[int], slots: list[int],
                tables: list[list[int]]) -> torch.Tensor:  # fmt: skip
    runner = llm.engine.runner
    width = max(len(t) for t in tables)
    table = torch.tensor([(t + [0] * width)[:width] for t in tables])
    key = torch.arange(width * BS)
    lens = torch.tensor(positions)[:, None] + 1
    mask = key[None, :] < lens
    if runner.window is not None:
        mask &= key[None, :] > lens - 1 - runner.window
    bias = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))[None, :, None, :]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots), num_decodes=len(ids), decode_blocks=table,
                             decode_bias=bias, block_size=BS)  # fmt: skip
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(ids), torch.tensor(positions), runner.kv_caches, meta)
        return runner.model.compute_logits(hidden)


def _kernel_step(kernel: cpu_kernel.DecodeKernel, ids: list[int], positions: list[int], slots: list[int],
                 tables: list[list[int]]) -> torch.Tensor:  # fmt: skip
    width = max(len(t) for t in tables)
    table = torch.tensor([(t + [0] * width)[:width] for t in tables], dtype=torch.int32)
    return kernel.logits(kernel.forward(ids, positions, torch.tensor(slots), table))


def _step_errors(path: Path, m: int, lib: Any, dtype: str = "bfloat16") -> dict[str, Any]:
    bf, ref = _llm(path, dtype), _llm(path, "float32")
    kernel = cpu_kernel.DecodeKernel.build(bf.engine.runner.model, bf.engine.runner.kv_caches, BS, lib=lib)
    assert kernel is not None
    gen = torch.Generator().manual_seed(m)
    pool = bf.engine.runner.kv_pool
    pool.copy_(torch.randn(pool.shape, generator=gen).to(pool.dtype))
    ref.engine.runner.kv_pool.copy_(pool.float())
    start = pool.clone()
    ids = torch.randint(3, kernel.vocab, (m,), generator=gen).tolist()
    positions, slots, tables = _rows(m)
    exact = torch.log_softmax(_eager_step(ref, ids, positions, slots, tables), -1)
    eager = torch.log_softmax(_eager_step(bf, ids, positions, slots, tables), -1)
    eager_kv = pool.clone()
    pool.copy_(start)
    got = torch.log_softmax(_kernel_step(kernel, ids, positions, slots, tables), -1)
    return {"kernel": (got - exact).abs().max().item(), "eager": (eager - exact).abs().max().item(),
            "kernel_vs_eager_argmax": (got.argmax(-1) == eager.argmax(-1)).all().item(),
            # per layer: largest |kernel - eager| over the largest |value| (2^-8: one bf16 ulp at the top)
            "kv": ((pool.float() - eager_kv.float()).abs().amax((1, 2, 3, 4))
                   / eager_kv.float().abs().amax((1, 2, 3, 4))).tolist(),
            "kv_changed": (pool != start).any().item(), "got": got}  # fmt: skip


@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("arch", ARCHS)
def test_step_is_as_exact_as_eager_bf16(arch: str, m: int, native: Any,
                                        tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    e = _step_errors(tiny_model_dir(arch, dtype=torch.bfloat16), m, native)
    assert e["kv_changed"]
    # layer 0 sees identical inputs; deeper layers inherit the last-ulp differences above them
    assert e["kv"][0] <= 2**-7 and max(e["kv"]) <= 2**-5, f"K/V written differ from eager: {e['kv']}"
    assert e["kernel"] <= 1.5 * e["eager"] + 0.02, e
    assert e["kernel_vs_eager_argmax"]


def test_odd_shapes_take_the_masked_paths(native: Any, tiny_model_dir: Callable[..., Path]) -> None:
    """hidden 56 (not a multiple of 32) and an odd vocabulary: masked loads and a short last block."""
    path = tiny_model_dir("qwen2", dtype=torch.bfloat16, hidden_size=56, vocab_size=1031)
    e = _step_errors(path, 3, native)
    assert e["kernel"] <= 1.5 * e["eager"] + 0.02, e
    assert e["got"].shape[-1] == 1031 and torch.isfinite(e["got"]).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("checkpoint", [torch.bfloat16, torch.float32], ids=["bf16-weights", "fp32-weights"])
def test_float32_step_matches_eager_float32(arch: str, checkpoint: torch.dtype,
                                            tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """A float32 model: from a bf16 checkpoint the kernel reads bf16 copies of the weights (exact),
    from a float32 one the float32 weights; either way the step is the float32 step."""
    path = tiny_model_dir(arch, dtype=checkpoint)
    e = _step_errors(path, 3, _lib(torch.float32, checkpoint), "float32")
    assert e["eager"] == 0.0  # the model is the reference
    assert e["kernel"] <= 1e-4, e
    assert max(e["kv"]) <= 1e-5, f"K/V written differ from eager: {e['kv']}"
    assert e["kernel_vs_eager_argmax"]


@pytest.mark.parametrize("flavour", ["avx2", "portable"])
def test_f16_weights_step_matches_eager_float32(flavour: str, monkeypatch: pytest.MonkeyPatch,
                                                tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """An f16 checkpoint with dtype auto on AVX2 (forced): a float32 model whose weights stay f16
    (config.resolve_weight_dtype); the kernel widens them (F16C, or C in the portable build) and
    its step is the float32 step on the same values."""
    if not platform.current().can_run(flavour):
        pytest.skip(f"{flavour} does not run here")
    monkeypatch.setenv(platform.ENV, "avx2")
    e = _step_errors(tiny_model_dir("qwen2", dtype=torch.float16), 3, _lib(torch.float32, torch.float16, flavour), "auto")
    assert e["kernel"] <= 1e-4 and e["eager"] <= 1e-4, e
    assert max(e["kv"]) <= 1e-5, f"K/V written differ from eager: {e['kv']}"


@pytest.mark.parametrize("flavour", list(platform.KERNEL_FLAVOURS))
def test_silu_to_float32_rounding(flavour: str) -> None:
    """The step's SiLU (vectorised exp in the AVX-512 / AVX2 builds, expf in the portable one) is
    within 4 float32 ulps of the exact value and of torch's silu (measured: 1.1), tails and odd
    lengths included; the exact SiLU of x < -88.7 (under 1e-36) may be 0, as with expf."""
    import ctypes

    if not platform.current().can_run(flavour):
        pytest.skip(f"{flavour} does not run here")
    lib = _lib(torch.float32, torch.float32, flavour)
    lib.ifl_silu.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    x = torch.cat([torch.randn(4000, generator=torch.Generator().manual_seed(0)) * 6,
                   torch.linspace(-120, 120, 997), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 89.0, -104.0])])
    out = torch.empty_like(x)
    assert lib.ifl_silu(x.data_ptr(), x.numel(), out.data_ptr()) == 0
    exact = torch.nn.functional.silu(x.double())
    tol = lambda ref: 4 * torch.finfo(torch.float32).eps * ref.abs() + 2.0**-120  # 4 ulps; + 1e-36 where expf overflows (x < -88.7)  # noqa: E731
    assert ((out.double() - exact).abs() <= tol(exact)).all()
    torch_silu = torch.nn.functional.silu(x).double()
    assert ((out.double() - torch_silu).abs() <= tol(torch_silu)).all()


def test_portable_build_matches_native(native: Any, tiny_model_dir: Callable[..., Path]) -> None:
    """The plain-C code paths (ARM, x86 below AVX2) compute the same step."""
    portable = _lib(flavour="portable")
    assert portable.ifl_gemv_path() == 0
    path = tiny_model_dir("qwen3", dtype=torch.bfloat16)
    a, b = _step_errors(path, 3, native), _step_errors(path, 3, portable)
    assert b["kernel"] <= 1.5 * b["eager"] + 0.02, b
    assert (a["got"] - b["got"]).abs().max().item() <= 0.05


# ------------------------------------------------------------------ whole generations
def _hf_greedy(path: Path, prompts: list[list[int]], n: int) -> list[tuple[list[int], torch.Tensor]]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True).eval()
    runs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True,
                                 eos_token_id=None, pad_token_id=0)  # fmt: skip
            runs.append((out.sequences[0, len(p) :].tolist(), torch.log_softmax(torch.stack(out.logits)[:, 0].float(), -1)))
    return runs


@pytest.fixture
def count_kernel_steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Row counts of every step the kernel ran."""
    rows: list[int] = []
    forward = cpu_kernel.DecodeKernel.forward

    def spy(self: cpu_kernel.DecodeKernel, ids: list[int], *args: Any) -> torch.Tensor:
        rows.append(len(ids))
        return forward(self, ids, *args)

    one = OneDecode.__call__

    def spy_one(self: OneDecode, *args: Any) -> None:
        rows.append(1)  # a batch-1 plain greedy step (worker/one_decode.py)
        one(self, *args)

    monkeypatch.setattr(cpu_kernel.DecodeKernel, "forward", spy)
    monkeypatch.setattr(OneDecode, "__call__", spy_one)
    yield rows


@pytest.mark.parametrize("arch", ARCHS)
def test_generation_agrees_with_hf_bf16(arch: str, native: Any, count_kernel_steps: list[int],
                                        tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    path = tiny_model_dir(arch, dtype=torch.bfloat16)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 23, 40)]
    n = 12
    llm = _llm(path, "bfloat16")
    assert llm.engine.runner.decode_kernel is not None
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=1)
    # one at a time: batch-1 decode steps are the ones the runner gives the kernel
    outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in prompts]
    # every decode step after the prefill, and the one prompt short enough for the kernel (5 rows)
    assert sorted(count_kernel_steps) == [1] * 3 * (n - 1) + [5]
    llm.engine.kv.pool.check_idle()
    first_ok, worst = 0, 0.0
    for out, (hf_tokens, hf_lp) in zip(outs, _hf_greedy(path, prompts, n)):
        tokens = out.outputs[0].token_ids
        assert len(tokens) == n
        first_ok += tokens[0] == hf_tokens[0]
        for s, t in enumerate(tokens):
            if t != hf_tokens[s]:
                break  # past a near-tie the two greedy paths see different contexts
            worst = max(worst, abs(out.outputs[0].logprobs[s][t].logprob - hf_lp[s, t].item()))
    assert first_ok >= 2, f"{first_ok}/3 first tokens match HF bf16"
    assert worst <= 0.05, f"logprob off HF bf16 by {worst}"


def test_wide_steps_run_eager_and_narrow_ones_the_kernel(native: Any, count_kernel_steps: list[int],
                                                         tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """6 requests of different lengths: decode steps of more than MAX_PIECES requests take the
    eager model, and once at most MAX_PIECES remain, the kernel; every request completes, every
    block returns."""
    path = tiny_model_dir("llama", dtype=torch.bfloat16)
    llm = _llm(path, "bfloat16", max_num_seqs=6)
    eager_rows: list[int] = []
    model = llm.engine.runner.model
    forward = model.forward

    def spy(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        eager_rows.append(len(input_ids))
        return forward(input_ids, *args, **kwargs)

    model.forward = spy  # type: ignore[method-assign]
    lengths = [2, 4, 6, 9, 12, 15]
    reqs = [{"prompt_token_ids": list(range(5, 12 + i))} for i in range(6)]
    outs = llm.generate(reqs, [SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True) for k in lengths],
                        use_tqdm=False)  # fmt: skip
    assert [len(o.outputs[0].token_ids) for o in outs] == lengths
    assert {6, 5} <= set(eager_rows) and max(count_kernel_steps) <= cpu_kernel.MAX_PIECES
    assert set(count_kernel_steps) == set(range(1, cpu_kernel.MAX_PIECES + 1))
    llm.engine.kv.pool.check_idle()


def test_off_switches(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Callable[..., Path]) -> None:
    """float16 models and INFLIGHT_CPU_KERNEL=0 run eager, without plain weight copies."""
    fp16 = _llm(tiny_model_dir("llama"), "float16")
    assert fp16.engine.runner.decode_kernel is None
    monkeypatch.setenv("INFLIGHT_CPU_KERNEL", "0")
    llm = _llm(tiny_model_dir("llama"), "float32")
    assert llm.engine.runner.decode_kernel is None
    qkv = llm.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.plain_weight() is None  # no copy kept for a kernel that is off
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, ignore_eos=True),
                       use_tqdm=False)  # fmt: skip
    assert len(out[0].outputs[0].token_ids) == 3
