"""AWQ / GPTQ int4, compressed-tensors int8 W8A8 and FP8 checkpoints, and `--quantization`,
against HF running the same model with the format's dequantized weights substituted.

The checkpoints are packed here from a tiny float model: int4 groups (AutoAWQ's GEMM order,
GPTQ's K-packing with the zero - 1 of v1 checkpoints, act-order g_idx), int8 / FP8 per channel.
`dequantized` below is each format's formula, written once; HF multiplies by its output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from inflight import LLM, SamplingParams
from inflight.config import ModelConfig

GROUP = 32  # divides the tiny model's hidden (64) and intermediate (128) sizes
N_NEW = 8
EXACT_ATOL = 1e-3  # weight-only through the portable path: the same dequantized values as HF
ACT_ATOL = 0.5  # int8 activations (W8A8, or the C kernels' per-32 rounding): logits span about +-6
_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds column c*8 + _ORDER[i]


def _linear_names(sd: dict[str, torch.Tensor]) -> list[str]:
    return [n[: -len(".weight")] for n in sd if n.endswith("_proj.weight")]


def _int4(w: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) float -> q (K, N), zeros (K/g, N), scales (K/g, N): asymmetric 4-bit groups along K."""
    wt = w.t().reshape(-1, g, w.shape[0])  # (K/g, g, N)
    lo, hi = wt.amin(1), wt.amax(1)
    s = ((hi - lo) / 15).clamp_min(1e-6).half()
    z = torch.round(-lo / s.float()).clamp(0, 15)
    q = torch.round(wt / s.float()[:, None] + z[:, None]).clamp(0, 15).reshape(-1, w.shape[0])
    return q.to(torch.int32), z.to(torch.int32), s


def _pack(q: torch.Tensor, order: list[int], dim: int) -> torch.Tensor:
    """Eight 4-bit values per int32 along `dim`; nibble i holds index 8c + order[i]."""
    q = q.movedim(dim, -1)
    q = q.reshape(*q.shape[:-1], -1, 8)[..., order]
    word = sum(q[..., i] << (4 * i) for i in range(8))
    return word.to(torch.int32).movedim(-1, dim).contiguous()


def dequantized(fmt: str, t: dict[str, torch.Tensor], k: int) -> torch.Tensor:
    """The format's own formula: the float (N, K) weight a quantized layer stands for."""
    def nib(x: torch.Tensor, order: list[int], dim: int) -> torch.Tensor:  # _pack undone
        x = x.movedim(dim, -1)
        vals = torch.stack([(x >> (4 * i)) & 0xF for i in range(8)], -1)
        out = torch.empty_like(vals)
        out[..., order] = vals
        return out.reshape(*x.shape[:-1], -1).movedim(-1, dim)

    if fmt == "awq":
        q, z = nib(t["qweight"], _ORDER, 1), nib(t["qzeros"], _ORDER, 1)  # (K, N), (K/g, N)
        g_idx = torch.arange(k) // GROUP
    elif fmt in ("gptq", "gptq-act", "gptq-row"):
        q, z = nib(t["qweight"], list(range(8)), 0), nib(t["qzeros"], list(range(8)), 1) + 1
        g_idx = t["g_idx"].long()
    elif fmt == "fp8":
        return (t["weight"].float() * t["weight_scale"].float()).float()
    else:  # int8
        return t["weight"].float() * t["weight_scale"].float()
    return ((q - z[g_idx]) * t["scales"].float()[g_idx]).t()


def _quantize_layer(fmt: str, w: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    n, k = w.shape
    if fmt == "int8":
        s = w.abs().amax(1, keepdim=True) / 127
        return {"weight": torch.round(w / s).to(torch.int8), "weight_scale": s.float()}
    if fmt == "fp8":
        s = w.abs().amax(1, keepdim=True) / 448
        return {"weight": (w / s).to(torch.float8_e4m3fn), "weight_scale": s.float()}
    perm = torch.randperm(k, generator=gen) if fmt == "gptq-act" else torch.arange(k)
    g = k if fmt == "gptq-row" else GROUP  # group_size -1: one group per row
    q, z, s = _int4(w[:, perm], g)  # groups formed in act order: stored row j is feature perm[j]
    if fmt == "awq":
        return {"qweight": _pack(q, _ORDER, 1), "qzeros": _pack(z, _ORDER, 1), "scales": s}
    qk = torch.empty_like(q)
    qk[perm] = q  # GPTQ keeps features in order; g_idx says each one's group
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = torch.arange(k, dtype=torch.int32) // g
    return {"qweight": _pack(qk, list(range(8)), 0), "qzeros": _pack(z - 1, list(range(8)), 1), "scales": s,
            "g_idx": g_idx}  # fmt: skip


QCONFIG = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False},
    "gptq-act": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False},
    "gptq-row": {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": True, "sym": False},
    "int8": {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"], "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
                    "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}},
    "fp8": {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"], "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
}  # fmt: skip


def make_quantized(src: Path, out: Path, fmt: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The checkpoint in `fmt`, and the float state dict HF runs (dequantized weights substituted)."""
    shutil.copytree(src, out)
    (out / "model.safetensors").unlink()
    sd = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    tensors, ref = {}, dict(sd)
    for name in sd:
        if not name.endswith("_proj.weight"):
            tensors[name] = sd[name]
    for layer in _linear_names(sd):
        parts = _quantize_layer(fmt, sd[f"{layer}.weight"].float(), gen)
        tensors.update({f"{layer}.{k}": v for k, v in parts.items()})
        ref[f"{layer}.weight"] = dequantized(fmt, parts, sd[f"{layer}.weight"].shape[1])
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = QCONFIG[fmt]
    (out / "config.json").write_text(json.dumps(cfg))
    return out, ref


def _hf(src: Path, sd: dict[str, torch.Tensor]) -> torch.nn.Module:
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    if hf.config.tie_word_embeddings:
        hf.tie_weights()
    return hf


Run = list[tuple[list[int], torch.Tensor]]  # per prompt: greedy tokens and the logits that chose them


def _agree(ours: Run, ref: Run, atol: float) -> None:
    """Tokens identical up to a step where the reference's own top two logits are within `atol`,
    logits within `atol` until then."""
    for (tokens, logits), (want, full) in zip(ours, ref, strict=True):
        same = next((s for s, (a, b) in enumerate(zip(tokens, want)) if a != b), N_NEW)
        if same < N_NEW:  # only where the reference itself nearly ties
            top2 = full[same].topk(2).values
            assert (top2[0] - top2[1]).item() <= atol, (tokens, want)
        diff = (logits[:same] - full[:same]).abs().max().item() if same else 0.0
        assert diff <= atol, f"logits differ by {diff:.2e}"


def _compare(llm: LLM, hf: torch.nn.Module, atol: float) -> Run:
    """Greedy tokens and logits against HF's (`_agree`); returns ours."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (6, 21)]
    params = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, return_generation_logits=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ours, refs = [(o.outputs[0].token_ids, o.outputs[0].generation_logits) for o in outs], []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                              do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()  # fmt: skip
            refs.append((ref, hf(torch.tensor([p + ref])).logits[0, len(p) - 1 : len(p) - 1 + N_NEW]))
    _agree(ours, refs, atol)
    llm.engine.kv.pool.check_idle()
    return ours


@pytest.fixture(scope="module")
def base(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("qwen2")  # qkv biases, tied embeddings


@pytest.mark.parametrize("fmt", ["awq", "gptq", "gptq-act", "int8", "fp8"])
def test_quantized_checkpoint_matches_hf_with_its_dequantized_weights(
    fmt: str, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sd = make_quantized(base, tmp_path / fmt, fmt)
    monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")  # the portable path: exact for weight-only formats
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    _compare(llm, _hf(base, sd), ACT_ATOL if fmt == "int8" else EXACT_ATOL)
    monkeypatch.delenv("INFLIGHT_QUANT_KERNEL")  # the C kernels where they take the layout
    _compare(llm, _hf(base, sd), ACT_ATOL)


@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_quantization_flag_quantizes_at_load(mode: str, base: Path) -> None:
    sd = load_file(str(base / "model.safetensors"))
    ref = dict(sd)
    for layer in _linear_names(sd):  # per output channel, round to nearest
        w = sd[f"{layer}.weight"].float()
        ref[f"{layer}.weight"] = dequantized(mode, _quantize_layer(mode, w, torch.Generator()), w.shape[1])
    llm = LLM(model=str(base), quantization=mode, dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    assert llm.engine.runner.decode_kernel is not None  # fp8 too: f8c layers in the fused step (float activations)
    _compare(llm, _hf(base, ref), ACT_ATOL if mode == "int8" else EXACT_ATOL)


@pytest.mark.parametrize(("change", "error"), [
    ({"quant_method": "bitsandbytes"}, r"quantization_config\.quant_method: 'bitsandbytes' is not supported"),
    ({"bits": 8}, r"quantization_config\.bits: 8"),
    ({"version": "gemv"}, r"quantization_config\.version: 'gemv'"),
])  # fmt: skip
def test_unsupported_quantization_config_is_a_start_up_error(change: dict, error: str, base: Path, tmp_path: Path) -> None:
    path, _ = make_quantized(base, tmp_path / "awq", "awq")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=error):
        ModelConfig.from_path(path)


def test_group_size_that_does_not_divide_a_layer_names_it(base: Path, tmp_path: Path) -> None:
    path, _ = make_quantized(base, tmp_path / "awq", "awq")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["group_size"] = 48
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"down_proj: group size 48 does not divide its 128 input features"):
        LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
    with pytest.raises(ValueError, match=r"quantization: 'int8' applies to full-precision checkpoints"):
        LLM(model=str(path), quantization="int8", dtype="float32", device="cpu", num_kv_blocks=32, progress=False)


def test_tensor_parallel_shards_keep_whole_groups(base: Path, tmp_path: Path) -> None:
    """Rank 1 of 2 built in this process (loading needs no collective): each quantized layer holds
    exactly its rows (column-parallel) or input columns (row-parallel) of the full dequantized
    weight; at 4 ranks o_proj's 16 inputs per rank would cut a group of 32: refused, naming it."""
    from inflight.models import loader
    from inflight.models.linear import linear_layers
    from inflight.models.parallel import TensorParallel
    from inflight.quant.weight import dequantize

    path, sd = make_quantized(base, tmp_path / "awq", "awq")
    cfg = ModelConfig.from_path(path, dtype="float32", device="cpu")
    model = loader.load_model(cfg, progress=False, tp=TensorParallel(1, 2))
    layers = dict(model.named_modules())
    o = layers["model.layers.0.self_attn.o_proj"]
    full = sd["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(dequantize(o.method.weights[0]), full[:, 32:64])  # input columns [32, 64)
    gate_up = layers["model.layers.1.mlp.gate_up_proj"]
    mine = torch.cat([dequantize(w) for w in gate_up.method.weights])
    want = torch.cat([sd[f"model.layers.1.mlp.{p}_proj.weight"][64:128] for p in ("gate", "up")])
    assert torch.equal(mine, want)  # intermediate rows [64, 128) of gate and of up
    assert all(layer.weight is None for layer in linear_layers(model) if layer.method.quantized)
    with pytest.raises(ValueError, match=r"o_proj: input columns \[16, 32\) do not fall on its group boundaries \(32\)"):
        loader.load_model(cfg, progress=False, tp=TensorParallel(1, 4))


_TP2, _MP = {"tensor_parallel_size": 2}, {"distributed_executor_backend": "mp"}
_SPLITS = [("awq", _TP2), ("gptq", _TP2), ("gptq-row", _TP2), ("int8", _TP2), ("fp8", _TP2),
           ("awq", _MP), ("gptq", _MP), ("int8", _MP), ("fp8", _MP)]


@pytest.fixture(scope="module")
def uni_run(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, torch.nn.Module, Run]]:
    """fmt -> (its checkpoint, HF on its dequantized weights, `uni`'s greedy tokens and logits), made once."""
    cache: dict[str, tuple[Path, torch.nn.Module, Run]] = {}

    def run(fmt: str) -> tuple[Path, torch.nn.Module, Run]:
        if fmt not in cache:
            path, sd = make_quantized(base, tmp_path_factory.mktemp("split") / fmt, fmt)
            hf = _hf(base, sd)
            llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False)
            cache[fmt] = (path, hf, _compare(llm, hf, ACT_ATOL))
        return cache[fmt]

    return run


@pytest.mark.parametrize(("fmt", "kw"), _SPLITS, ids=[f"{f}-{'tp2' if k is _TP2 else 'mp'}" for f, k in _SPLITS])
def test_tensor_parallel_and_worker_process_match_uni(fmt: str, kw: dict, uni_run: Callable) -> None:
    """TP=2 (issue 32: shards on quantization-group boundaries) and the `mp` executor (the worker
    reads the checkpoint itself) over each safetensors format, the C kernels where they take the
    layout: each rank reads its rows, and its row-parallel layers' input columns on whole int4
    groups (o_proj 32 of 64 inputs, down_proj 64 of 128: one and two groups of 32; with group_size
    -1 any whole bytes of a row, its one scale and zero with them: act-order is then no permutation)
    or per-channel int8 / FP8 columns. Greedy tokens and logits as HF's on the dequantized weights and as `uni`'s
    in this process (`_agree`). They may part from `uni`'s only where its top two nearly tie: the
    all-reduce adds the ranks' partial sums in another order, which can move an activation across
    an int8 rounding step of the next layer; and W8A8 under TP rounds each rank's share of a
    row-parallel input by its own per-token maximum (as vLLM does: no extra collective), a finer
    scale than `uni`'s (here int8-tp2 parts at the fourth token of the first prompt)."""
    path, hf, want = uni_run(fmt)
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False, **kw)
    try:
        got = _compare(llm, hf, ACT_ATOL)
    finally:
        llm.engine.shutdown()
    _agree(got, want, ACT_ATOL)


def test_act_order_gptq_under_tensor_parallel_is_refused(base: Path, tmp_path: Path) -> None:
    """An act-order layer's groups follow g_idx, not the columns: a rank's columns would mix groups.
    Refused at start-up from config.json (it was a worker dying at load)."""
    path, _ = make_quantized(base, tmp_path / "gptq-act", "gptq-act")
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 2 would split act-order \(desc_act\) GPTQ layers"):
        LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False, tensor_parallel_size=2)


@pytest.mark.parametrize("fmt", ["awq", "fp8"])
def test_lora_on_a_quantized_safetensors_base_matches_peft(fmt: str, base: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """LoRA wraps whatever linear method a layer has: an AWQ (i4g) or FP8 (f8c) base with an
    adapter gives PEFT's tokens on HF with the dequantized weights; the base rows beside it stay the base's.
    AWQ through the portable path (exactly the dequantized values; the C kernels round activations)."""
    import peft

    if fmt == "awq":
        monkeypatch.setenv("INFLIGHT_QUANT_KERNEL", "0")

    from inflight.testing import make_peft_lora

    path, sd = make_quantized(base, tmp_path / fmt, fmt)
    adapter = make_peft_lora(base, tmp_path / "lora", r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    ref = peft.PeftModel.from_pretrained(_hf(base, sd), str(adapter)).eval()
    llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=32, progress=False, enable_lora=True)
    llm.load_lora_adapter("a", str(adapter))
    prompt = torch.randint(3, 1000, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    sp = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": prompt, "lora_name": "a"}, {"prompt_token_ids": prompt}], sp, use_tqdm=False)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                  eos_token_id=None, pad_token_id=0)  # fmt: skip
        want = ref.generate(ids, **kw)[0, len(prompt) :].tolist()
        with ref.disable_adapter():
            base_want = ref.generate(ids, **kw)[0, len(prompt) :].tolist()
    assert want != base_want  # the adapter changes the answer
    assert [o.outputs[0].token_ids for o in outs] == [want, base_want]
    llm.engine.kv.pool.check_idle()
