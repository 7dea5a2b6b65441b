"""Build a model from a Hugging Face checkpoint directory (safetensors, single or sharded)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from inflight.config import ModelConfig
from inflight.models import cpu_paths
from inflight.models.layers import RotaryEmbedding
from inflight.models.linear import LinearBase
from inflight.models.llama import LlamaForCausalLM
from inflight.models.qwen2_vl import Qwen2VLForConditionalGeneration

logger = logging.getLogger(__name__)

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
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


Target = Callable[[torch.Tensor], object]


def checkpoint_targets(model: nn.Module) -> dict[str, Target]:
    """Every checkpoint tensor name the model loads -> what copies it in: a linear layer's
    `load` for its own tensors and the shards of a fused layer, `param.copy_` for the rest."""
    targets: dict[str, Target] = {}
    owned: set[int] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, LinearBase):
            for name, param, shard in module.checkpoint_tensors(prefix):
                targets[name] = functools.partial(module.load, param, shard=shard)
                owned.add(id(getattr(module, param)))
    for name, p in model.named_parameters():
        if id(p) not in owned:
            targets[name] = p.copy_
    return targets


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
    model.tie_weights()  # type: ignore[operator]
    if cfg.load_format == "dummy":
        _randomize(model)
    else:
        load_weights(model, cfg, iter_weights(Path(cfg.path), progress))
    cpu_paths.prepare(model, cfg)  # linear methods, the decode kernel's weights; logs the summary line
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    logger.info("model loaded: %.1f MiB of %s weights on %s", weights / 2**20, cfg.dtype, cfg.device)
    return model.eval()


def load_weights(model: nn.Module, cfg: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy checkpoint-named tensors (HF names) into the model's parameters (fused layers take
    their shards' rows); every tensor the model loads must be covered."""
    targets = checkpoint_targets(model)
    rename = getattr(model, "checkpoint_name", None)  # checkpoints saved in another layout
    loaded: set[str] = set()
    with torch.no_grad():
        for name, tensor in weights:
            name = rename(name) if rename is not None else name
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and name not in targets:
                continue  # tied embeddings: some checkpoints still carry a copy
            if name not in targets:
                raise ValueError(f"model: unexpected checkpoint tensor {name!r}")
            targets[name](tensor.to(device=cfg.device, dtype=cfg.dtype))
            loaded.add(name)
    missing = [name for name in targets if name not in loaded]
    if missing:
        raise ValueError(f"model: checkpoint lacks weights for {missing[:8]}")


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
