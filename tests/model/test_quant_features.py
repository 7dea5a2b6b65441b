"""Every quantized format with prefix caching, structured output and beams, on the C kernels.

One tiny qwen2 (K-quant shapes: 256 hidden, 512 intermediate, so the GGUF K-quants apply) in each
format: AWQ, GPTQ (act-order too), compressed-tensors int8 W8A8 and FP8 (packed by
test_quant_checkpoints.py), `--quantization int8 / fp8` at load, and GGUF Q8_0 and Q4_K_M.
References: the same engine's cache-miss run for a prefix-cache hit; the JSON schema itself; for
beams HF on the same weights dequantized (the format's formula; transformers' GGUF loader for GGUF).
The C kernels run (batch 1 in the fused decode kernel, beams in the batched GEMMs) and round
activations to int8 (not FP8's), so each beam's score must be HF's score of the same tokens within
that rounding, HF's best beam no better than ours by more, and FP8's beams HF's very beams.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from safetensors.torch import load_file
from test_quant_checkpoints import _hf, _linear_names, _quantize_layer, dequantized, make_quantized
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.models.linear import linear_layers
from inflight.quant import float_kernels, kernels
from inflight.quant.linear import QuantLinear
from inflight.testing.gguf import hf_to_gguf

N_NEW = 6
BEAMS = 3
EXACT_ATOL = 1e-3  # f8c: weights widened, float activations (measured ~1e-5 on a beam's summed log-probability)
KERNEL_ATOL = 0.6  # int8 activations (per 32 elements, per token for W8A8), summed over N_NEW tokens: measured up to 0.31
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "kind"],
          "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["cat", "dog", "bird"]}}}  # fmt: skip
FORMATS = ["awq", "gptq", "gptq-act", "int8", "fp8", "load-int8", "load-fp8", "gguf-q8_0", "gguf-q4_k_m"]


@pytest.fixture(scope="module")
def base(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("qwen2", hidden_size=256, intermediate_size=512)


def _build(fmt: str, base: Path, tmp: Path) -> tuple[LLM, torch.nn.Module]:
    """The engine (default kernels, prefix caching on) and HF on the dequantized weights."""
    kw: dict[str, Any] = dict(dtype="float32", device="cpu", num_kv_blocks=48, max_num_seqs=4, progress=False)
    if fmt.startswith("gguf-"):
        for f in ("config.json", "generation_config.json"):
            (tmp / f).write_text((base / f).read_text())
        path = hf_to_gguf(base, tmp / "model.gguf", fmt[5:])
        hf = AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file=path.name, dtype=torch.float32).eval()
        return LLM(model=str(path), **kw), hf
    if fmt.startswith("load-"):
        mode = fmt[5:]
        sd = load_file(str(base / "model.safetensors"))
        for layer in _linear_names(sd):  # per output channel, round to nearest
            w = sd[f"{layer}.weight"].float()
            sd[f"{layer}.weight"] = dequantized(mode, _quantize_layer(mode, w, torch.Generator()), w.shape[1])
        return LLM(model=str(base), quantization=mode, **kw), _hf(base, sd)
    path, sd = make_quantized(base, tmp / fmt, fmt)
    return LLM(model=str(path), **kw), _hf(base, sd)


def _on_c_kernels(llm: LLM, fused: bool) -> None:
    """Every quantized layer multiplies in C here, and batch 1 runs the fused decode kernel
    (act-order GPTQ: per layer, docs/QUANTIZATION.md)."""
    runner = llm.engine.executor.runner
    methods = [layer.method for layer in linear_layers(runner.model) if isinstance(layer.method, QuantLinear)]
    assert methods and (runner.decode_kernel is not None) == fused
    for m in methods:
        for w in m.weights:
            assert kernels.available(w) or (w.qtype == "f8c" and float_kernels.available(w)), w.qtype


def _hf_beams(hf: torch.nn.Module, prompt: list[int]) -> tuple[list[list[int]], list[float]]:
    """HF's beams, best first, and their summed log-probabilities."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, num_return_sequences=BEAMS,
                          max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False, eos_token_id=None,
                          pad_token_id=0, length_penalty=0.0, output_scores=True, return_dict_in_generate=True)  # fmt: skip
    return [row[len(prompt) :].tolist() for row in out.sequences], out.sequences_scores.tolist()


def _hf_logprob(hf: torch.nn.Module, prompt: list[int], beam: list[int]) -> float:
    """HF's summed log-probability of `beam` after `prompt` (teacher-forced)."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + beam])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(beam)[:, None]).sum().item()


@pytest.mark.parametrize("fmt", FORMATS)
def test_prefix_cache_structured_output_and_beams(fmt: str, base: Path, tmp_path: Path) -> None:
    llm, hf = _build(fmt, base, tmp_path)
    _on_c_kernels(llm, fused=fmt != "gptq-act")
    pool = llm.engine.kv.pool
    prompt = torch.randint(3, 1000, (37,), generator=torch.Generator().manual_seed(8)).tolist()
    greedy = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)

    # a prefix-cache hit (two full blocks of 16 reused) gives the miss's tokens
    miss = llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)[0]
    hits_before = pool.num_hit_tokens
    hit = llm.generate([{"prompt_token_ids": prompt[:33] + [7, 9, 11]}, {"prompt_token_ids": prompt}], greedy,
                       use_tqdm=False)  # fmt: skip
    assert miss.num_cached_tokens == 0 and [h.num_cached_tokens for h in hit] == [32, 32]
    assert pool.num_hit_tokens - hits_before == 64
    assert hit[1].outputs[0].token_ids == miss.outputs[0].token_ids

    # a JSON schema yields valid JSON of the schema
    js = llm.generate(["the cat sat"], SamplingParams(max_tokens=40, temperature=0.0,
                                                      structured_outputs={"json": SCHEMA}), use_tqdm=False)  # fmt: skip
    out = js[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), SCHEMA)

    # beams (the prompt's blocks from the cache): distinct, scored as HF scores them on the dequantized weights
    beam_out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(beam_width=BEAMS, n=BEAMS, temperature=0.0,
                            max_tokens=N_NEW, ignore_eos=True, length_penalty=0.0), use_tqdm=False)[0]  # fmt: skip
    beams, beams_cached = beam_out.outputs, beam_out.num_cached_tokens
    ours = [o.token_ids for o in beams]
    assert beams_cached == 32
    assert len({tuple(b) for b in ours}) == BEAMS
    scores = [o.cumulative_logprob for o in beams]
    assert scores == sorted(scores, reverse=True)
    atol = EXACT_ATOL if "fp8" in fmt else KERNEL_ATOL
    for b, score in zip(ours, scores):  # a wrong fork or cached block would score apart from HF
        assert abs(score - _hf_logprob(hf, prompt, b)) <= atol, (fmt, b, score)
    ref, ref_scores = _hf_beams(hf, prompt)
    if "fp8" in fmt:  # float activations: HF's very beams
        assert ours == ref
    else:  # HF's best beam is at most the kernels' rounding better than ours
        assert ref_scores[0] - _hf_logprob(hf, prompt, ours[0]) <= KERNEL_ATOL
    pool.check_idle()
