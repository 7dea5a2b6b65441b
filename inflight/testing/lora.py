"""PEFT LoRA adapter directories with random weights, for a checkpoint's shapes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def make_lora_adapter(
    out_dir: str | Path,
    config: dict[str, Any],
    *,
    rank: int = 16,
    alpha: float = 32.0,
    targets: Iterable[str] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    seed: int = 0,
    std: float = 0.02,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write a random PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) for a
    Llama-family config without building the model (benchmarks; tests make theirs with peft)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    q, kv = heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim
    sizes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
             "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in targets:
            n_in, n_out = sizes[module]
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, n_in, generator=gen) * std).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(n_out, rank, generator=gen) * std).to(dtype)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets), "bias": "none",
           "use_rslora": False, "task_type": "CAUSAL_LM", "lora_dropout": 0.0}  # fmt: skip
    (out_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return out_dir


def make_peft_lora(base: str | Path, out_dir: str | Path, *, seed: int = 0, std: float = 0.08, **lora_config: Any) -> Path:
    """A random LoRA adapter made and saved by `peft` itself (tests' reference), on the
    checkpoint in `base`: `lora_config` are `peft.LoraConfig` fields (r, lora_alpha,
    target_modules, use_rslora, alpha_pattern, ...); A and B are N(0, std) so the adapter
    visibly changes the outputs."""
    import peft
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    lora = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **lora_config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    lora.save_pretrained(str(out_dir))
    return Path(out_dir)
