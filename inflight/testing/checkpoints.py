"""Random-weight checkpoints: tiny ones of every supported arch (real HF configs, shrunk) for
the tests, and full-size shapes (Qwen2.5-0.5B) for the benchmarks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from inflight.testing.tokenizer import ENDOFTEXT, IM_END, build_tiny_tokenizer, tiny_tokenizer

# ----------------------------------------------------------------------------- tiny checkpoints
ARCHS: tuple[str, ...] = ("llama", "llama3", "mistral", "qwen2", "qwen3")

_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
_PER_ARCH: dict[str, dict[str, Any]] = {
    "llama": dict(tie_word_embeddings=False),
    "llama3": dict(
        tie_word_embeddings=False,
        rope_theta=500000.0,
        # original context 64 at head_dim 16: frequencies fall in all three llama3 bands.
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dict(tie_word_embeddings=False, sliding_window=16),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(tie_word_embeddings=True, head_dim=32),
}
_INIT_STD = 0.1  # large enough that logits and attention scores are far from uniform


def _config_class(arch: str) -> type:
    import transformers

    names = {
        "llama": "LlamaConfig",
        "llama3": "LlamaConfig",
        "mistral": "MistralConfig",
        "qwen2": "Qwen2Config",
        "qwen3": "Qwen3Config",
    }
    if arch not in names:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    return getattr(transformers, names[arch])


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter: norms near (not at) 1, so per-channel scaling bugs show up."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            value = 0.02 * noise
        else:
            value = _INIT_STD * noise
        param.copy_(value)


def make_tiny_checkpoint(
    arch: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    with_tokenizer: bool = True,
    max_shard_size: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Save a 2-layer random-weight HF checkpoint of `arch` (see ARCHS) to out_dir."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    config_cls = _config_class(arch)
    # Deep copies: transformers fills rope dicts in place (rope_theta), leaking between calls.
    kwargs: dict[str, Any] = copy.deepcopy({**_COMMON, **_PER_ARCH[arch]})
    if with_tokenizer:
        tokenizer = tiny_tokenizer()
        ids = tokenizer.convert_tokens_to_ids
        kwargs.update(
            vocab_size=len(tokenizer),
            bos_token_id=ids(ENDOFTEXT),  # as Qwen does: the tokenizer itself never adds a BOS
            eos_token_id=ids(IM_END),
            pad_token_id=ids(ENDOFTEXT),
        )
    else:
        kwargs.update(vocab_size=1024, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    kwargs.update(copy.deepcopy(config_overrides))
    config = config_cls(**kwargs)

    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_(model, seed)  # tied lm_head shares the embedding Parameter, so it follows
    model = model.to(dtype).eval()
    model.config.dtype = dtype

    save_kwargs: dict[str, Any] = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out_dir), safe_serialization=True, **save_kwargs)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out_dir))
    if with_tokenizer:
        build_tiny_tokenizer(out_dir)
    return out_dir


# ------------------------------------------------------------------------ benchmark checkpoints
QWEN25_05B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes for a full (defaults filled in) config dict."""
    model_type = cfg["model_type"]
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias is not supported")
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    qkv_bias = model_type == "qwen2" or bool(cfg.get("attention_bias"))

    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out_dims = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
        for n, dim in out_dims.items():
            shapes[f"{p}self_attn.{n}_proj.weight"] = (dim, hidden)
            if qkv_bias:
                shapes[f"{p}self_attn.{n}_proj.bias"] = (dim,)
        shapes[f"{p}self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        if cfg.get("attention_bias"):
            shapes[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if model_type == "qwen3":
            shapes[f"{p}self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{p}self_attn.k_norm.weight"] = (head_dim,)
        shapes[f"{p}mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{p}mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def make_random_checkpoint(
    out_dir: str | Path,
    *,
    config: dict[str, Any],
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Path:
    """Write random weights for an HF config dict without building a transformers model.

    Produces config.json, generation_config.json and a single model.safetensors; no tokenizer.
    """
    from transformers import AutoConfig, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = copy.deepcopy(config)
    if raw.get("model_type") not in _ARCHITECTURES:
        raise ValueError(
            f"model_type must be one of {tuple(_ARCHITECTURES)}, got {raw.get('model_type')!r}"
        )
    raw.setdefault("architectures", [_ARCHITECTURES[raw["model_type"]]])
    # The real config class fills defaults exactly as transformers will when loading (Qwen3's
    # head_dim=128, Qwen2's num_key_value_heads=32, ...), and config.json comes out in its format.
    hf_config = AutoConfig.for_model(**raw)
    hf_config.dtype = dtype
    cfg = hf_config.to_dict()

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in _weight_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            noise.mul_(0.1).add_(1.0)
        else:
            noise.mul_(0.02)
        tensors[name] = noise.to(dtype)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors

    hf_config.save_pretrained(str(out_dir))
    gen_ids = {k: cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    GenerationConfig(**{k: v for k, v in gen_ids.items() if v is not None}).save_pretrained(
        str(out_dir)
    )
    return out_dir


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """The raw config.json of a checkpoint, as an engine would see it."""
    return json.loads((Path(model_dir) / "config.json").read_text())
