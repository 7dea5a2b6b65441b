"""GGUF files (llama.cpp's) served as they are, anchored to transformers' own GGUF loader.

Each tiny HF checkpoint is written as GGUF the way llama.cpp's converter writes it
(inflight.testing.gguf: q / k rows permuted for llama-arch, K-quants from our numpy quantizer),
then loaded twice: by `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` (which
dequantizes every tensor to float32) and by us (the blocks kept, multiplied tile by tile or by
the kernels). Greedy tokens must be identical and the logits close: ours multiply by the same
dequantized values, so the tolerance (LOGIT_ATOL, every type) only covers summation order and,
when the C kernels take a type, their activation rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.engine.tokenizer import load_tokenizer
from inflight.models.linear import linear_layers
from inflight.quant.embedding import QuantEmbedding
from inflight.quant.linear import QuantLinear, WidenedLinear
from inflight.testing.gguf import hf_to_gguf

N_NEW = 10
EXACT_ATOL = 1e-3  # portable path vs HF, every type (measured ~1e-5: summation order only)
KERNEL_ATOL = 0.5  # C kernels vs HF (int8 activations per 32 elements); measured up to 0.22; logits span about +-6, std 1.6
# (arch, file type, per-tensor overrides): every arch, every supported type, and a Q4_K_M-like mix
# (attn_v and ffn_down in Q6_K: a fused q/k/v layer with parts of two types)
CASES = [
    ("llama", "q8_0", None),
    ("mistral", "q4_0", None),
    ("qwen2", "q4_k", None),
    ("qwen3", "q6_k", None),
    ("llama", "q5_k", None),
    ("qwen2", "f16", None),
    ("llama", "q4_k", {"attn_v": "q6_k", "ffn_down": "q6_k"}),
]
_K_SHAPES = {"hidden_size": 256, "intermediate_size": 512}  # K-quant rows are 256-element super-blocks


def _overrides(arch: str, qtype: str) -> dict[str, int]:
    kw = dict(_K_SHAPES) if qtype.endswith("_k") else {}
    if arch == "qwen3":
        kw["head_dim"] = 128  # transformers' GGUF config for qwen3 ignores key_length: keep its default
    return kw


@pytest.fixture(scope="module")
def gguf_file(tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[tuple[str, str, str], Path] = {}

    def make(arch: str, qtype: str, types: dict[str, str] | None = None, split: int = 1) -> Path:
        key = (arch, qtype, repr(types), split)
        if key not in cache:
            src = tiny_model_dir(arch, **_overrides(arch, qtype))
            out = tmp_path_factory.mktemp(f"gguf_{arch}_{qtype}")
            for f in ("config.json", "generation_config.json"):  # HF's loader needs a directory
                (out / f).write_text((src / f).read_text())
            cache[key] = hf_to_gguf(src, out / "model.gguf", qtype, split=split, types=types)
        return cache[key]

    return make


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (7, 23)]


def _hf_refs(hf: torch.nn.Module, prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """HF's greedy tokens and the logits that scored them, per prompt."""
    refs = []
    for p in prompts:
        with torch.no_grad():
            ids = torch.tensor([p])
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()  # fmt: skip
            refs.append((ref, hf(torch.tensor([p + ref])).logits[0, len(p) - 1 : len(p) - 1 + N_NEW]))
    return refs


def _run(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """Our greedy tokens and generation logits, per prompt."""
    params = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, return_generation_logits=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    return [(o.outputs[0].token_ids, o.outputs[0].generation_logits) for o in outs]


@pytest.mark.parametrize(("arch", "qtype", "types"), CASES, ids=[f"{a}-{q}{'-mix' if t else ''}" for a, q, t in CASES])
def test_gguf_matches_transformers(arch: str, qtype: str, types: dict[str, str] | None,
                                   gguf_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    path = gguf_file(arch, qtype, types)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, max_num_seqs=4, progress=False)
    quantized = [m for m in (layer.method for layer in linear_layers(llm.engine.executor.runner.model))
                 if isinstance(m, QuantLinear)]  # fmt: skip
    if qtype == "f16":
        assert not quantized  # F16 / BF16 / F32 weights load as float layers
    else:
        assert quantized and all(w.data.dtype == torch.uint8 for m in quantized for w in m.weights)
        if types:  # the mix keeps each part's own type: q/k (Q4_K) and v (Q6_K) apart in one layer
            assert any({w.qtype for w in m.weights} == {"q4_k", "q6_k"} for m in quantized)
        model = llm.engine.executor.runner.model
        embed = model.model.embed_tokens  # the file's blocks, no float table; lookups dequantize their rows
        assert isinstance(embed, QuantEmbedding) and embed.weight.numel() == 0
        if model.lm_head.tied:  # the tied output multiplies by the same bytes (one copy)
            assert model.lm_head.method.weights[0] is embed.qweight
    refs = _hf_refs(hf, _prompts())
    # the portable path multiplies by exactly what HF dequantizes: greedy identical, logits ~1e-5 apart
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")
    for (tokens, logits), (ref, full) in zip(_run(llm, _prompts()), refs):
        assert tokens == ref
        diff = (logits - full).abs().max().item()
        assert diff <= EXACT_ATOL, f"{arch} {qtype}: logits differ by {diff:.2e}"
    # the C kernels round activations to int8 per 32 (llama.cpp's scheme): HF's tokens up to a
    # step whose top two HF logits are within KERNEL_ATOL, logits within KERNEL_ATOL until then
    monkeypatch.delenv("INFLIGHT_QUANT_KERNEL")
    for (tokens, logits), (ref, full) in zip(_run(llm, _prompts()), refs):
        top2 = full.topk(2, dim=-1).values
        same = next((s for s, (a, b) in enumerate(zip(tokens, ref)) if a != b), N_NEW)
        if same < N_NEW:
            gap = (top2[same, 0] - top2[same, 1]).item()
            assert gap <= KERNEL_ATOL, f"step {same}: {tokens[same]} instead of HF's {ref[same]}, {gap:.3f} apart"
        if same:
            assert (logits[:same] - full[:same]).abs().max().item() <= KERNEL_ATOL


@pytest.mark.parametrize(("arch", "qtype"), [("qwen2", "f16"), ("llama", "bf16")])
def test_f16_and_bf16_files_stay_16_bit_on_avx2(arch: str, qtype: str, gguf_file: Callable[..., Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """llama.cpp's model-f16.gguf (and BF16) files with dtype auto on an AVX2 CPU (forced): a float32
    model whose linear weights and embedding stay in the file's 16 bits (not float32 copies: half
    the memory), widened in the float kernels (batched) and in the decode kernel (batch 1); HF's
    float32 greedy tokens, logits to summation order (both multiply by the same values in float32)."""
    monkeypatch.setenv("INFLIGHT_CPU_FEATURES", "avx2")
    path = gguf_file(arch, qtype)
    want = torch.float16 if qtype == "f16" else torch.bfloat16
    llm = LLM(model=str(path), device="cpu", num_kv_blocks=32, max_num_seqs=4, progress=False)
    model = llm.engine.executor.runner.model
    assert (llm.engine.config.model.dtype, llm.engine.config.model.weight_dtype) == (torch.float32, want)
    assert {type(layer.method) for layer in linear_layers(model)} == {WidenedLinear}
    assert {layer.weight.dtype for layer in linear_layers(model)} == {want}
    assert model.model.embed_tokens.weight.dtype == want and model.model.norm.weight.dtype == torch.float32
    kernel = llm.engine.executor.runner.decode_kernel  # batch 1: the fused step reads the 16-bit weights
    assert kernel is not None and kernel.lib.ifl_weight_f16() == int(qtype == "f16")
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    refs = _hf_refs(hf, _prompts())
    one = [_run(llm, [p])[0] for p in _prompts()]  # batch 1: the decode kernel
    for (tokens, logits), (ref, full) in zip(one + _run(llm, _prompts()), refs + refs):
        assert tokens == ref
        assert (logits - full).abs().max().item() <= EXACT_ATOL


def test_split_gguf_and_its_tokenizer(gguf_file: Callable[..., Path], tiny_model_dir: Callable[..., Path]) -> None:
    """A 3-shard file (any shard named) serves what the single file does; the tokenizer, chat
    template and eos come from the metadata, or from --tokenizer."""
    single = gguf_file("qwen2", "q8_0")
    first = gguf_file("qwen2", "q8_0", split=3)
    assert first.name == "model-00001-of-00003.gguf"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = []
    for path in (single, first.with_name("model-00002-of-00003.gguf")):
        llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
        runs.append(llm.generate(["the cat sees a dog"], params, use_tqdm=False)[0].outputs[0].token_ids)
        assert llm.engine.config.model.eos_token_ids == (2,)  # <|im_end|> from tokenizer.ggml.eos_token_id
    assert runs[0] == runs[1]
    tok = load_tokenizer(single)
    hf_dir = tiny_model_dir("qwen2")
    ref = load_tokenizer(hf_dir)
    text = "the old man reads a book 你好 🚀"
    assert tok.encode(text) == ref.encode(text)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    llm = LLM(model=str(single), tokenizer=str(hf_dir), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    assert llm.get_tokenizer().name_or_path == str(hf_dir)


def test_llama3_rope_from_rope_freqs(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """Llama 3.1 files carry their rope scaling as llama.cpp's `rope_freqs.weight` divisors, which
    transformers' GGUF loader drops: the anchor is HF on the original safetensors (F32 file: same
    weights). Past the original 64-token context, a wrong rope would show."""
    src = tiny_model_dir("llama3")
    path = hf_to_gguf(src, tmp_path / "l3.gguf", "f32")
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    assert len(llm.engine.config.model.hf_config["rope_freq_factors"]) == 8  # head_dim 16 / 2
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    p = torch.randint(3, 1000, (90,), generator=torch.Generator().manual_seed(2)).tolist()
    ours = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids  # fmt: skip
    with torch.no_grad():
        ids = torch.tensor([p])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                          do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()  # fmt: skip
    assert ours == ref
