"""Tiny GGUF files written from tiny HF checkpoints, the way llama.cpp's converter writes them.

`hf_to_gguf(hf_dir, out, qtype)` mirrors `convert_hf_to_gguf.py` for llama / mistral / qwen2 /
qwen3: the metadata keys, the tokenizer as `tokenizer.ggml.*` (gpt2-style BPE: tokens, token
types, merges, special ids, chat template), 1-D tensors in F32, q / k rows of llama-arch models
permuted into llama.cpp's rotary order, and 2-D weights in `qtype` (quantized with gguf-py or
inflight.quant.ggml_quantize). Where a row is not a whole number of `qtype` blocks the tensor
falls back as llama.cpp's quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16).
`qtype="q4_k_m"` is about llama.cpp's Q4_K_M mix (attn_v and ffn_down in Q6_K). `split=N` writes
`name-0000i-of-0000N.gguf` shards. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from inflight.quant.ggml_quantize import quantize
from inflight.quant.gguf import _LAYER_NAMES
from inflight.quant.weight import block_info

_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
         "Qwen3ForCausalLM": "qwen3"}  # fmt: skip
# HF layer name -> GGUF's: the reader's table, inverted (one table for both directions)
_NAMES = {hf: gg for gg, hf in _LAYER_NAMES.items()}


def gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = name.split(".", 3)  # model.layers.{i}.{module}.{weight|bias}
    module, _, kind = rest.rpartition(".")
    return f"blk.{i}.{_NAMES[module]}.{kind}"


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: HF's rotate-half row order -> interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}  # llama.cpp's, for rows not 256-divisible
PRESETS = {"q4_k_m": ("q4_k", {"attn_v": "q6_k", "ffn_down": "q6_k"})}  # about llama.cpp's Q4_K_M mix


def _pick_type(qtype: str, k: int) -> str:
    for t in (qtype, _FALLBACK.get(qtype, "q8_0"), "q8_0"):
        if k % block_info(t)[0] == 0:
            return t
    return "f16"


def _add_tensor(writer: Any, name: str, w: np.ndarray, qtype: str) -> None:
    from gguf import GGMLQuantizationType

    if w.ndim == 1 or qtype == "f32":
        writer.add_tensor(name, np.ascontiguousarray(w, dtype=np.float32))
        return
    t = _pick_type(qtype, w.shape[1])
    if t == "f16":
        writer.add_tensor(name, w.astype(np.float16))
        return
    if t == "bf16":  # the top half of each float32, rounded to nearest even (as llama.cpp's converter does)
        bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        writer.add_tensor(name, bits, raw_shape=bits.shape, raw_dtype=GGMLQuantizationType.BF16)
        return
    blocks = quantize(w, t)
    writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=getattr(GGMLQuantizationType, t.upper()))


def _metadata(writer: Any, arch: str, cfg: dict[str, Any], hf_dir: Path) -> None:
    heads = cfg["num_attention_heads"]
    writer.add_name(cfg.get("_name", "tiny"))
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(1)
    _tokenizer(writer, hf_dir, cfg)


def _tokenizer(writer: Any, hf_dir: Path, cfg: dict[str, Any]) -> None:
    """The HF tokenizer.json's BPE as llama.cpp's `gpt2` tokenizer model."""
    path = hf_dir / "tokenizer.json"
    if not path.is_file():  # random benchmark checkpoints: llama.cpp's "no vocab" (token ids only)
        writer.add_tokenizer_model("no_vocab")
        return
    tok = json.loads(path.read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab.update(special)
    tokens = [""] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_merges(merges)
    for key, fn in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                    ("pad_token_id", writer.add_pad_token_id)):  # fmt: skip
        if cfg.get(key) is not None:
            fn(int(cfg[key]))
    writer.add_add_bos_token(False)
    tc = hf_dir / "tokenizer_config.json"
    template = json.loads(tc.read_text()).get("chat_template") if tc.is_file() else None
    if not template and (hf_dir / "chat_template.jinja").is_file():
        template = (hf_dir / "chat_template.jinja").read_text()
    if template:
        writer.add_chat_template(template)


def hf_to_gguf(hf_dir: str | Path, out: str | Path, qtype: str = "q8_0", split: int = 1,
               types: dict[str, str] | None = None) -> Path:  # fmt: skip
    """Write the HF checkpoint at `hf_dir` as a GGUF file (or `split` shards; returns the first).

    `qtype`: f32 | f16 | q8_0 | q4_0 | q4_k | q5_k | q6_k for every 2-D weight; `types` overrides
    it per GGUF tensor-name fragment ({"attn_v": "q6_k", "ffn_down": "q6_k"}: a Q4_K_M-like mix).
    """
    import gguf

    if qtype in PRESETS:
        qtype, preset = PRESETS[qtype]
        types = {**preset, **(types or {})}
    hf_dir, out = Path(hf_dir), Path(out)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = _ARCH[cfg["architectures"][0]]
    where = {}  # tensor name -> its file: tensors are read and quantized one at a time (an 8B shape
    for f in sorted(hf_dir.glob("*.safetensors")):  # never holds more than one float tensor)
        with safe_open(str(f), framework="pt") as sf:
            where.update(dict.fromkeys(sf.keys(), f))  # noqa: SIM118
    names = list(where)
    paths = [out] if split == 1 else [out.with_name(f"{out.stem}-{i:05d}-of-{split:05d}.gguf") for i in range(1, split + 1)]
    per = -(-len(names) // split)
    for i, path in enumerate(paths):
        writer = gguf.GGUFWriter(str(path), arch)
        if i == 0:
            _metadata(writer, arch, cfg, hf_dir)
        if split > 1:
            writer.add_uint16("split.no", i)
            writer.add_uint16("split.count", split)
            writer.add_int32("split.tensors.count", len(names))
        if i == 0 and (factors := _llama3_rope_factors(cfg)) is not None:
            writer.add_tensor("rope_freqs.weight", factors)
        for name in names[i * per : (i + 1) * per]:
            with safe_open(str(where[name]), framework="pt") as sf:
                w = sf.get_tensor(name).float().numpy()  # torch reads bf16, numpy cannot
            g = gguf_name(name)
            _add_tensor(writer, g, _llama_rows(arch, cfg, name, w), next((v for k, v in (types or {}).items() if k in g), qtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return paths[0]


def _llama3_rope_factors(cfg: dict[str, Any]) -> np.ndarray | None:
    """llama.cpp's `rope_freqs.weight` for a Llama 3.1 rope_scaling: each frequency's divisor."""
    sc = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if sc.get("rope_type") != "llama3":
        return None
    rope = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    factor, low, high = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    out = []
    for f in freqs:  # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _llama_rows(arch: str, cfg: dict[str, Any], name: str, w: np.ndarray) -> np.ndarray:
    if arch != "llama" or not (".q_proj." in name or ".k_proj." in name):
        return w
    heads = cfg["num_attention_heads"]
    return permute_rows(w, heads if ".q_proj." in name else cfg.get("num_key_value_heads") or heads)


def make_tiny_gguf(out: str | Path, qtype: str = "q8_0", model: str | Path | None = None) -> Path:
    """The bundled demo model (or the HF checkpoint `model`) as a GGUF file at `out`."""
    from inflight.engine.args import DEMO_MODEL

    return hf_to_gguf(model or DEMO_MODEL, out, qtype)
