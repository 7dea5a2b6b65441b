"""Every CPU dispatch branch, forced through the platform override, end to end on a tiny model.

Branches: AVX2 only (dtype auto: float32 with the linear weights kept bf16), AVX-512 without bf16, AVX512-BF16, no C compiler, the decode kernel
disabled, and this machine as it is with dtype bfloat16 / float32 / auto. Each loads a bf16
checkpoint, checks that the engine's log line names the path it took, and generates greedily,
one request at a time (batch-1 steps: the C decode kernel where it runs) and three at once (the
batched PyTorch path), against Hugging Face in the dtype the engine resolved.

A profile above this CPU (AVX512-BF16 on an AVX2 machine) keeps its dtype decision but only
runs instructions the CPU has (inflight/platform.py): the expectations below follow the real
hardware, so on an AVX512-BF16 machine the same test runs that branch's kernel and packing for
real, and here it checks the decision, the clamp and the log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams, platform
from inflight.models import cpu_kernel
from inflight.models.cpu_linear import Bf16Linear, OneDNNLinear
from inflight.models.linear import PlainLinear, linear_layers
from inflight.quant.linear import WidenedLinear

N_NEW = 8
HW = platform.detect()
X86 = platform.Platform(HW, HW.features).x86


FLAVOURS = tuple(platform.KERNEL_FLAVOURS)  # best first


def _runnable_flavour(wanted: str) -> str:
    """The best flavour at or below `wanted` that the hardware runs (the clamp, spelt out here)."""
    if not X86:
        return "portable"
    below = FLAVOURS[FLAVOURS.index(wanted) :]
    return next(f for f in below if platform.KERNEL_FLAVOURS[f][0] <= HW.features)


def _packs(dtype: torch.dtype, claimed: frozenset[str]) -> bool:
    """Whether oneDNN packs `dtype`: the profile claims the instructions and the hardware has them."""
    if not X86:
        return False
    need = [{"avx2", "fma"}] if dtype == torch.float32 else [{"avx512bw", "avx512vl", "avx512dq"},
                                                              {"avx2", "avx_ne_convert"}]  # fmt: skip
    ok = any(n <= claimed for n in need) and any(n <= HW.features for n in need)
    return ok and (dtype == torch.float32 or platform._torch_onednn_bf16())


NATIVE_BF16 = platform.Platform(HW, HW.features).native_bf16
# id: (environment, dtype argument, profile's features, dtype it must resolve to, kernel flavour it picks)
BRANCHES: dict[str, tuple[dict[str, str], str, frozenset[str], torch.dtype, str | None]] = {
    "avx2": ({platform.ENV: "avx2"}, "auto", frozenset(platform.PROFILES["avx2"]), torch.float32, "avx2"),
    "avx512-no-bf16": ({platform.ENV: "avx512"}, "auto", frozenset(platform.PROFILES["avx512"]), torch.float32,
                       "avx2"),
    "avx512-bf16": ({platform.ENV: "avx512_bf16"}, "auto", frozenset(platform.PROFILES["avx512_bf16"]),
                    torch.bfloat16, "avx512bf16"),
    "no-compiler": ({"CC": "/nonexistent/cc"}, "auto", HW.features,
                    torch.bfloat16 if NATIVE_BF16 else torch.float32, None),
    "kernel-disabled": ({"INFLIGHT_CPU_KERNEL": "0"}, "auto", HW.features,
                        torch.bfloat16 if NATIVE_BF16 else torch.float32, None),
    "this-cpu-bfloat16": ({}, "bfloat16", HW.features, torch.bfloat16, ""),
    "this-cpu-float32": ({}, "float32", HW.features, torch.float32, ""),
    "this-cpu-auto": ({}, "auto", HW.features, torch.bfloat16 if NATIVE_BF16 else torch.float32, ""),
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("qwen2", dtype=torch.bfloat16)  # tied lm_head, qkv biases


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 19, 34)]


@pytest.fixture(scope="module")
def hf_greedy(checkpoint: Path, prompts: list[list[int]]) -> Callable[[torch.dtype], list[tuple[list[int], torch.Tensor]]]:
    """HF greedy tokens and per-step log-probabilities of each prompt, per dtype (cached)."""
    cache: dict[torch.dtype, list[tuple[list[int], torch.Tensor]]] = {}

    def run(dtype: torch.dtype) -> list[tuple[list[int], torch.Tensor]]:
        if dtype not in cache:
            model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, local_files_only=True).eval()
            cache[dtype] = []
            with torch.no_grad():
                for p in prompts:
                    ids = torch.tensor([p])
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW,
                                         min_new_tokens=N_NEW, do_sample=False, output_logits=True,
                                         return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)  # fmt: skip
                    logprobs = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), -1)
                    cache[dtype].append((out.sequences[0, len(p) :].tolist(), logprobs))
        return cache[dtype]

    return run


def assert_matches_hf(tokens: list[int], hf: tuple[list[int], torch.Tensor], dtype: torch.dtype) -> None:
    """float32: HF's greedy tokens exactly. bf16 (both sides round, differently): HF's tokens up to
    a step where HF's own top two are within 0.1 nats (a near-tie either side may take)."""
    hf_tokens, hf_lp = hf
    assert len(tokens) == N_NEW
    if dtype == torch.float32:
        assert tokens == hf_tokens
        return
    for s, (ours, theirs) in enumerate(zip(tokens, hf_tokens)):
        if ours != theirs:
            gap = (hf_lp[s, theirs] - hf_lp[s, ours]).item()
            assert gap <= 0.1, f"step {s}: {ours} instead of HF's {theirs}, {gap:.3f} nats apart"
            return


def _apply(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in (platform.ENV, "CC", "INFLIGHT_CPU_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _load(checkpoint: Path, dtype: str, caplog: pytest.LogCaptureFixture) -> tuple[LLM, str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="inflight"):
        llm = LLM(model=str(checkpoint), dtype=dtype, device="cpu", num_kv_blocks=32, max_num_seqs=4,
                  progress=False)  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.name == "inflight.models.cpu_paths"]
    assert len(lines) == 1, lines
    return llm, lines[0]


def _generate(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    params = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    one = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    many = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                         use_tqdm=False)]  # fmt: skip
    llm.engine.kv.pool.check_idle()
    return one, many


@pytest.mark.parametrize("branch", BRANCHES)
def test_branch_end_to_end(branch: str, checkpoint: Path, prompts: list[list[int]], hf_greedy: Any,
                           monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    env, dtype_arg, claimed, want_dtype, wanted = BRANCHES[branch]
    _apply(monkeypatch, env)
    if wanted == "":  # this CPU as it is: the flavour it picks for itself
        wanted = _runnable_flavour("avx512bf16")
    llm, line = _load(checkpoint, dtype_arg, caplog)
    runner = llm.engine.runner
    assert llm.engine.config.model.dtype == want_dtype
    # the log line names every choice, and the choices are what ran
    assert line.startswith("cpu: ") and f"| dtype: {str(want_dtype)[6:]}" in line, line
    # dtype auto on AVX2 without bf16: a float32 model whose linear weights stay bf16 (half the memory)
    widened = dtype_arg == "auto" and want_dtype == torch.float32 and platform.Platform(HW, claimed).widens_bf16
    assert llm.engine.config.model.weight_dtype == (torch.bfloat16 if widened else None)
    assert (", bfloat16 weights" in line) == widened, line
    down = runner.model.model.layers[0].mlp.down_proj
    # bf16 where our bf16 GEMM runs (the AVX-512 BF16 flavour) and the kernel reads bf16: one copy
    one_copy = want_dtype == torch.bfloat16 and wanted is not None and _runnable_flavour(wanted) == "avx512bf16"
    packs = _packs(want_dtype, claimed) and not widened and not one_copy
    assert packs or down.weight.dtype == (torch.bfloat16 if widened else want_dtype)  # packed: dropped
    assert runner.model.cpu_paths.packed == packs, line
    methods = {type(layer.method) for layer in linear_layers(runner.model)}
    want_methods = {OneDNNLinear} if packs else {WidenedLinear} if widened else {Bf16Linear} if one_copy else {PlainLinear}
    assert methods == want_methods, line
    if widened:  # the embedding table too (a tied lm_head multiplies by it); lookups widen their rows
        assert runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert ("our GEMM on the kernel's weights, one copy" in line) == one_copy, line
    if (widened or one_copy) and wanted is not None:  # the decode kernel reads the layers' own bf16 weights
        assert down.plain_weight().data_ptr() == down.weight.data_ptr()
        assert runner.model.lm_head.plain_weight().data_ptr() == runner.model.model.embed_tokens.weight.data_ptr()
    kept = {layer.plain_weight() is not None for layer in linear_layers(runner.model)}
    assert kept == {wanted is not None}, line  # the kernel's GEMV weights, kept for a kernel that runs
    assert (f"| onednn: {str(want_dtype)[6:]} |" in line) == packs, line
    if wanted is None:
        assert runner.decode_kernel is None
        reason = "no C compiler" if "CC" in env else "INFLIGHT_CPU_KERNEL=0"
        assert f"| kernel: off ({reason})" in line, line
    else:
        runs = _runnable_flavour(wanted)
        assert runner.decode_kernel is not None, line
        assert f"| kernel: {runs}, bf16 weights" in line, line  # a bf16 checkpoint: exact bf16 GEMV weights
        assert (f"the profile picks {wanted}, not runnable on this CPU" in line) == (runs != wanted), line
        path = cpu_kernel.Variant(runs, want_dtype).gemv_path()
        assert runner.decode_kernel.lib.ifl_gemv_path() == path
    if dtype_arg == "bfloat16" and not NATIVE_BF16:
        assert "(float32 here) is faster" in caplog.text
    one, many = _generate(llm, prompts)
    for tokens_one, tokens_many, hf in zip(one, many, hf_greedy(want_dtype)):
        assert_matches_hf(tokens_one, hf, want_dtype)
        assert_matches_hf(tokens_many, hf, want_dtype)


@pytest.mark.parametrize("failure", ["compiler-fails", "library-corrupt"])
def test_a_kernel_that_cannot_be_built_or_loaded_falls_back(failure: str, checkpoint: Path, prompts: list[list[int]],
                                                            hf_greedy: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Never takes the engine down: the warning says why, the PyTorch path serves."""
    _apply(monkeypatch, {"INFLIGHT_CACHE_DIR": str(tmp_path)})
    if failure == "compiler-fails":
        monkeypatch.setenv("CC", "false")  # exists, exits 1
        why = "false failed"
    else:
        variant = cpu_kernel.Variant(platform.current().kernel_flavour(), torch.float32, torch.bfloat16)
        cpu_kernel.build_library(variant).write_bytes(b"not a shared object")
        why = "cannot load"
    llm, line = _load(checkpoint, "float32", caplog)
    assert llm.engine.runner.decode_kernel is None
    assert f"| kernel: off ({why}" in line, line
    assert any(r.levelno == logging.WARNING and why in r.getMessage() for r in caplog.records)
    one, _ = _generate(llm, prompts[:1])
    assert_matches_hf(one[0], hf_greedy(torch.float32)[0], torch.float32)
