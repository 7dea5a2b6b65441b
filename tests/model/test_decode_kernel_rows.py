"""The C decode kernel over several rows of one sequence: a speculative verification step.

K + 1 consecutive positions of one request after a cached context, run three ways from the same
KV cache state: the kernel in one call (causal attention among the new rows), the kernel one row
at a time (what the same tokens cost without speculation), and the eager model over the rows as
one piece (the path such a step took before). The one-call step must equal the one-row steps bit
for bit, logits and K/V (each (x row, weight row) product is one accumulator whatever the row
count, so speculation cannot change a greedy token), in every GEMV flavour this CPU runs, for
full-precision and quantized weights; it must match the eager piece as closely as a one-row step
matches an eager decode. It also hands back the residual stream after chosen layers (EAGLE).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from inflight import LLM, platform
from inflight.models import cpu_kernel
from inflight.models.step import StepBatch
from inflight.testing import ARCHS

BS = 16
CONTEXT = 21  # cached tokens before the verified rows: the rows straddle the block boundary at 32
ROWS = 5  # K = 4 drafts + the bonus position
FLAVOURS = [f for f in ("avx512bf16", "avx2", "portable") if platform.current().can_run(f)]


def _llm(path: Path, dtype: str, **kwargs: Any) -> LLM:
    return LLM(model=str(path), dtype=dtype, device="cpu", block_size=BS, num_kv_blocks=16,
               enable_prefix_caching=False, progress=False, **kwargs)  # fmt: skip


def _step(vocab: int, gen: torch.Generator, rows: int = ROWS) -> StepBatch:
    """`rows` rows at positions CONTEXT.. of one sequence on blocks 3, 1, 4 (not in order)."""
    blocks = [3, 1, 4]
    positions = list(range(CONTEXT, CONTEXT + rows))
    ids = torch.randint(3, vocab, (rows,), generator=gen).tolist()
    slots = [blocks[p // BS] * BS + p % BS for p in positions]
    return StepBatch(token_ids=ids, positions=positions, query_lens=[rows], context_lens=[CONTEXT + rows],
                     slots=torch.tensor(slots), block_table=torch.tensor([blocks], dtype=torch.int32))  # fmt: skip


def _three_ways(llm: LLM, kernel: cpu_kernel.DecodeKernel, seed: int = 0, rows: int = ROWS) -> dict[str, torch.Tensor]:
    """Log-probs (rows, vocab) and the K/V pool after: one call, one row at a time, eager."""
    runner = llm.engine.runner
    gen = torch.Generator().manual_seed(seed)
    pool = runner.kv_pool
    pool.copy_(torch.randn(pool.shape, generator=gen).to(pool.dtype))
    start = pool.clone()
    step = _step(kernel.vocab, gen, rows)
    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        table = step.row_block_table()
        out["one_call"] = kernel.logits(kernel.forward(step.token_ids, step.positions, step.slots, table))
        out["one_call_kv"] = pool.clone()
        pool.copy_(start)
        rows = [kernel.logits(kernel.forward([step.token_ids[i]], [step.positions[i]], step.slots[i : i + 1], table[:1]))
                for i in range(rows)]  # fmt: skip
        out["one_row"], out["one_row_kv"] = torch.cat(rows), pool.clone()
        pool.copy_(start)
        step.attn = runner.attention.build_metadata(step)
        hidden = runner.model(step.input_ids, step.position_ids, runner.kv_caches, step.attn)
        out["eager"] = runner.model.compute_logits(hidden).float()
    return {k: torch.log_softmax(v.float(), -1) if not k.endswith("kv") else v for k, v in out.items()}


def _kernel(llm: LLM, flavour: str, weights: torch.dtype | None = None) -> cpu_kernel.DecodeKernel:
    runner = llm.engine.runner
    storage = runner.model.model.embed_tokens.weight.dtype
    lib = cpu_kernel.load_library(cpu_kernel.Variant(flavour, storage, weights or storage))
    kernel = cpu_kernel.DecodeKernel.build(runner.model, runner.kv_caches, BS, lib=lib)
    assert kernel is not None
    return kernel


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_equal_one_row_steps_and_match_eager_float32(arch: str, tiny_model_dir: Callable[..., Path]) -> None:
    """float32 model, bf16 GEMV weights (a bf16 checkpoint): every flavour this CPU runs."""
    llm = _llm(tiny_model_dir(arch, dtype=torch.bfloat16), "float32")
    for flavour in FLAVOURS:
        got = _three_ways(llm, _kernel(llm, flavour, torch.bfloat16))
        assert torch.equal(got["one_call"], got["one_row"]), flavour
        assert torch.equal(got["one_call_kv"], got["one_row_kv"]), flavour
        assert (got["one_call"] - got["eager"]).abs().max().item() <= 1e-4, flavour


@pytest.mark.parametrize("checkpoint", [torch.bfloat16, torch.float32], ids=["bf16-model", "fp32-weights"])
def test_rows_in_bf16_and_fp32_weight_variants(checkpoint: torch.dtype, tiny_model_dir: Callable[..., Path]) -> None:
    """A bf16 model (the AVX512-BF16 dot products where the CPU has them) and a float32 model
    with float32 weights: one call equals one-row steps; bf16 stays near the eager bf16 piece."""
    path = tiny_model_dir("qwen3", dtype=checkpoint)
    llm = _llm(path, "bfloat16" if checkpoint == torch.bfloat16 else "float32")
    for flavour in FLAVOURS:
        got = _three_ways(llm, _kernel(llm, flavour))
        assert torch.equal(got["one_call"], got["one_row"]), flavour
        assert torch.equal(got["one_call_kv"], got["one_row_kv"]), flavour
        tol = 0.1 if checkpoint == torch.bfloat16 else 1e-4  # bf16: both round, in different places
        assert (got["one_call"] - got["eager"]).abs().max().item() <= tol, flavour
        top2 = got["eager"].topk(2, -1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * tol  # rows whose argmax no rounding can flip
        assert torch.equal(got["one_call"].argmax(-1)[clear], got["eager"].argmax(-1)[clear]), flavour


@pytest.mark.parametrize("kind", ["int8", "q8_0"])
def test_quantized_rows_equal_one_row_steps(kind: str, tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """int8-at-load weights (the fused quantized GEMV) and a Q8_0 GGUF (its products straight
    from the blocks, the 512-bit block pairs where the flavour has them): one call equals
    one-row steps. Q8_0 also at 8 rows (MAX_ROWS): one pass of the 512-bit block pairs, two of 4
    on 256-bit (5 rows: one pass, or 4 + 1)."""
    if kind == "q8_0":
        from inflight.testing.gguf import hf_to_gguf

        # K = 256 / 736: 8 / 23 blocks a row (an odd count: the last block outside the pairs); at
        # K = 64 the bf16 activations rounded away the float-order difference this test looks for
        path = tiny_model_dir("llama", dtype=torch.bfloat16, hidden_size=256, intermediate_size=736)
        llm = _llm(hf_to_gguf(path, tmp_path / "m.gguf", "q8_0"), "bfloat16")
    else:
        llm = _llm(tiny_model_dir("llama", dtype=torch.bfloat16), "float32", quantization="int8")
    assert llm.engine.runner.decode_kernel is not None and llm.engine.runner.decode_kernel.quant
    for flavour, rows in [(f, r) for f in FLAVOURS for r in ((ROWS, cpu_kernel.MAX_ROWS) if kind == "q8_0" else (ROWS,))]:
        got = _three_ways(llm, _kernel(llm, flavour), rows=rows)
        assert torch.equal(got["one_call"], got["one_row"]), (flavour, rows)
        assert torch.equal(got["one_call_kv"], got["one_row_kv"]), (flavour, rows)


def test_aux_hidden_states_are_hf_hidden_states(tiny_model_dir: Callable[..., Path]) -> None:
    """Aux layers: each layer's input (the residual stream) as Hugging Face's output_hidden_states
    gives it (hidden_states[l]) for the same rows; num_layers: the output before the final norm."""
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir("llama", dtype=torch.float32)
    llm = _llm(path, "float32")
    kernel = llm.engine.runner.decode_kernel
    assert kernel is not None
    layers = kernel.num_layers
    kernel.set_aux_layers((1, 0, layers, 1))  # any order, repeats allowed: as given
    with pytest.raises(ValueError, match="aux layers"):
        kernel.set_aux_layers((layers + 1,))
    ids = list(range(7, 7 + ROWS))
    table = torch.tensor([[1]] * ROWS, dtype=torch.int32)
    with torch.inference_mode():
        normed = kernel.forward(ids, list(range(ROWS)), torch.arange(BS, BS + ROWS), table)
    aux = kernel.aux_hidden
    assert aux is not None and aux.shape == (4, ROWS, kernel.hidden)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
        prenorm = hf.model.norm(aux[2])
    assert torch.equal(aux[1], hf.model.embed_tokens.weight[ids])
    assert torch.allclose(aux[0], states[1][0], atol=1e-4) and torch.equal(aux[0], aux[3])
    # HF's last entry is after the final norm
    assert torch.allclose(normed, states[layers][0], atol=1e-4) and torch.allclose(prenorm, states[layers][0], atol=1e-4)
    kernel.set_aux_layers(())
    with torch.inference_mode():
        kernel.forward(ids[:1], [0], torch.tensor([BS]), table[:1])
    assert kernel.aux_hidden is None


@pytest.mark.parametrize("features", ["native", "avx2", "portable"])
def test_speculation_verifies_through_the_kernel(features: str, monkeypatch: pytest.MonkeyPatch,
                                                 tiny_model_dir: Callable[..., Path]) -> None:  # fmt: skip
    """n-gram speculation at batch 1 (INFLIGHT_CPU_FEATURES forcing each flavour): the verifying
    steps run the kernel over K + 1 rows, and the greedy tokens and logprobs are those without
    speculation exactly (both paths run the same per-row arithmetic)."""
    from inflight import SamplingParams

    monkeypatch.setenv(platform.ENV, features)
    spec = {"method": "ngram", "num_speculative_tokens": ROWS - 1}
    llm = _llm(tiny_model_dir("qwen2", dtype=torch.bfloat16), "float32", speculative_config=spec)
    kernel = llm.engine.runner.decode_kernel
    assert kernel is not None
    forced = {"avx2": 1, "portable": 0}.get(features)  # the GEMV path of the forced flavour's build
    assert forced is None or kernel.lib.ifl_gemv_path() == forced
    rows: list[int] = []
    forward = kernel.forward
    kernel.forward = lambda ids, *a: rows.append(len(ids)) or forward(ids, *a)  # type: ignore[method-assign]
    prompt = list(range(3, 40)) + list(range(3, 30))  # a repeated span: the model copies it
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = {}
    for on in (False, True):
        saved = llm.engine.speculator
        llm.engine.speculator = saved if on else None
        outs[on] = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        llm.engine.speculator = saved
        if not on:
            assert max(rows) == 1  # without speculation: one-row steps (the prompt is longer than MAX_ROWS)
    assert ROWS in rows and outs[True].metrics.num_accepted_draft_tokens > 0
    assert outs[True].outputs[0].token_ids == outs[False].outputs[0].token_ids
    assert outs[True].outputs[0].cumulative_logprob == outs[False].outputs[0].cumulative_logprob
    llm.engine.kv.pool.check_idle()


def test_eagle3_target_layers_from_the_kernel(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """An EAGLE-3 target: the runner's verification steps run the kernel, which hands the head the
    inputs of its layers (1, 0, 1) in the eager model's order (layer by layer: 0, 1, 1)."""
    from inflight.testing.eagle import make_eagle3_head

    target = tiny_model_dir("llama")
    head = make_eagle3_head(target, tmp_path / "head", aux=[1, 0, 1])
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": ROWS - 1}
    llm = _llm(target, "float32", speculative_config=spec)
    runner = llm.engine.runner
    kernel = runner.decode_kernel
    assert kernel is not None and kernel.aux_layers == (0, 1, 1)
    pool = runner.kv_pool
    pool.copy_(torch.randn(pool.shape, generator=torch.Generator().manual_seed(0)))
    start = pool.clone()
    step = _step(kernel.vocab, torch.Generator().manual_seed(1))
    got: dict[str, list[torch.Tensor]] = {"kernel": [], "eager": []}
    with torch.inference_mode():
        hidden = runner.forward(step, got["kernel"])
        pool.copy_(start)
        runner.decode_kernel = None
        eager = runner.forward(step, got["eager"])
    torch.testing.assert_close(hidden, eager, atol=1e-4, rtol=1e-4)
    assert len(got["kernel"]) == 3 and got["kernel"][0].shape == (ROWS, kernel.hidden)
    for a, b in zip(got["kernel"], got["eager"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_draft_model_runs_the_kernel(tiny_model_dir: Callable[..., Path]) -> None:
    """method draft_model: the draft's K greedy decodes and its catch-up over the verified K + 1
    rows run its own kernel; the target as its own draft is accepted whole (the draft's KV,
    written by its kernel, follows the target's exactly)."""
    from inflight import SamplingParams

    path = tiny_model_dir("qwen2", dtype=torch.bfloat16)
    spec = {"method": "draft_model", "model": str(path), "num_speculative_tokens": ROWS - 1}
    llm = _llm(path, "float32", speculative_config=spec)
    draft = llm.engine.runner.draft
    assert draft.kernel is not None
    rows: list[int] = []
    forward = draft.kernel.forward
    draft.kernel.forward = lambda ids, *a: rows.append(len(ids)) or forward(ids, *a)  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(3, 30))}], params, use_tqdm=False)[0]
    assert {1, ROWS} <= set(rows)
    assert out.metrics.num_draft_tokens > 0 and out.metrics.num_accepted_draft_tokens == out.metrics.num_draft_tokens
