"""Build a model from a Hugging Face checkpoint directory (safetensors, single or sharded)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from inflight.config import ModelConfig
from inflight.models import cpu_paths
from inflight.models.layers import RotaryEmbedding
from inflight.models.llama import PACKED, LlamaForCausalLM

logger = logging.getLogger(__name__)

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model: no .safetensors weights in {path}")
    return files


def iter_weights(path: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    files = checkpoint_files(path)
    names = []
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.extend((f, k) for k in sf.keys())  # noqa: SIM118 (a safetensors handle, not a dict)
    bar = tqdm(total=len(names), desc="Loading weights", unit="tensor", disable=not progress)
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():  # noqa: SIM118
                yield name, sf.get_tensor(name)
                bar.update(1)
    bar.close()


def _packed_target(name: str) -> tuple[str, str | int | None]:
    for ckpt, (fused, shard) in PACKED.items():
        token = f".{ckpt}."
        if token in name:
            return name.replace(token, f".{fused}."), shard
    return name, None


def _copy_shard(param: torch.Tensor, tensor: torch.Tensor, shard: str | int, model: nn.Module) -> None:
    spec = model.spec  # type: ignore[attr-defined]
    if isinstance(shard, str):  # q / k / v rows of qkv_proj
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        start = {"q": 0, "k": q, "v": q + kv}[shard]
        size = q if shard == "q" else kv
    else:  # gate (0) / up (1) rows of gate_up_proj
        size = spec.intermediate
        start = shard * size
    param.narrow(0, start, size).copy_(tensor)


def load_model(cfg: ModelConfig, progress: bool = True) -> nn.Module:
    arch = cfg.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(f"model: architecture {arch!r} is not supported; have {sorted(ARCHITECTURES)}")
    with torch.device("meta"):
        model = ARCHITECTURES[arch](cfg.hf_config, cfg.max_model_len)
    model.to_empty(device=cfg.device)
    model.to(cfg.dtype)
    # rotary tables are buffers built on meta: rebuild them for real, kept in float32
    spec = model.spec  # type: ignore[attr-defined]
    rotary = RotaryEmbedding(cfg.hf_config, spec.head_dim, cfg.max_model_len)
    model.model.rotary.cos = rotary.cos.to(cfg.device)  # type: ignore[union-attr]
    model.model.rotary.sin = rotary.sin.to(cfg.device)  # type: ignore[union-attr]
    if cfg.load_format == "dummy":
        _randomize(model)
    else:
        load_weights(model, cfg, iter_weights(Path(cfg.path), progress))
    cpu_paths.prepare(model, cfg)  # oneDNN packing, the decode kernel's weights; logs the summary line
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    logger.info("model loaded: %.1f MiB of %s weights on %s", weights / 2**20, cfg.dtype, cfg.device)
    return model.eval()


def load_weights(model: nn.Module, cfg: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy checkpoint-named tensors (HF names) into the model's fused parameters; every
    parameter must be covered."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    with torch.no_grad():
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and "lm_head.weight" not in params:
                continue  # tied embeddings: some checkpoints still carry a copy
            target, shard = _packed_target(name)
            if target not in params:
                raise ValueError(f"model: unexpected checkpoint tensor {name!r}")
            tensor = tensor.to(device=cfg.device, dtype=cfg.dtype)
            if shard is None:
                params[target].copy_(tensor)
            else:
                _copy_shard(params[target], tensor, shard, model)
            loaded.add(f"{target}:{shard}")
    _check_complete(model, params, loaded)


@torch.no_grad()
def _randomize(model: nn.Module) -> None:
    """load_format="dummy": N(0, 0.02) weights (HF's initializer range), norms at 1, biases at 0."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(0)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=gen)


def _check_complete(model: nn.Module, params: dict[str, torch.Tensor], loaded: set[str]) -> None:
    missing = []
    for name in params:
        fused = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        shards = {"qkv_proj": ["q", "k", "v"], "gate_up_proj": [0, 1]}.get(fused, [None])
        for shard in shards:
            if f"{name}:{shard}" not in loaded:
                missing.append(f"{name}:{shard}" if shard is not None else name)
    if missing:
        raise ValueError(f"model: checkpoint lacks weights for {missing[:8]}")
