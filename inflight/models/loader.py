"""Build a model from a Hugging Face checkpoint directory (safetensors, single or sharded), or
from a quantized checkpoint (a GGUF file, `--quantization`: inflight/quant/formats.py).

Tensors are read lazily (safetensors slices): each module reads only the part it holds, so a
tensor-parallel rank reads its shard's rows or columns, never a full copy of a sharded tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from inflight import checkpoint, memory
from inflight.config import ModelConfig
from inflight.models import cpu_paths
from inflight.models.layers import RotaryEmbedding, VocabEmbedding
from inflight.models.linear import InMemory, TensorSource, linear_layers
from inflight.models.llama import LlamaForCausalLM
from inflight.models.parallel import TensorParallel
from inflight.models.qwen2_vl import Qwen2VLForConditionalGeneration
from inflight.models.safetensors_io import iter_weights
from inflight.quant.formats import open_quantized

logger = logging.getLogger(__name__)

ARCHITECTURES: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
}

assert set(ARCHITECTURES) == set(checkpoint.ARCHITECTURES)  # the start-up check's list (torch-free) is this one


Target = Callable[[TensorSource], object]


def _copy_whole(param: torch.Tensor, src: TensorSource) -> None:
    param.copy_(src.read(0, 0, src.shape[0]))


def checkpoint_targets(model: nn.Module) -> dict[str, Target]:
    """Every checkpoint tensor name the model loads -> what copies it in: the `load` of a module
    that declares its `checkpoint_tensors` (linear layers, fused shards, the vocab-parallel
    embedding: each reads only this rank's part), a whole copy for the rest (norms)."""
    targets: dict[str, Target] = {}
    owned: set[int] = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "checkpoint_tensors"):
            for name, param, shard in module.checkpoint_tensors(prefix):
                targets[name] = functools.partial(module.load, param, shard=shard)
                owned.add(id(getattr(module, param)))
    for name, p in model.named_parameters():
        if id(p) not in owned:
            targets[name] = functools.partial(_copy_whole, p)
    return targets


def load_model(cfg: ModelConfig, progress: bool = True, tp: TensorParallel | None = None) -> nn.Module:
    """The model on `cfg.device`, its weights loaded (this rank's shard under `tp`), its fast
    paths chosen (models/cpu_paths.py)."""
    arch = cfg.architecture
    # EngineArgs.check ran these before torch loaded; a ModelConfig built by hand gets them here
    checkpoint.Checkpoint(cfg.path, cfg.hf_config).check(cfg.quantization, cfg.load_format)
    tp = tp or TensorParallel.single()
    quant = open_quantized(cfg.path, cfg.hf_config, cfg.quantization)  # None: plain safetensors
    if tp.size > 1 and quant is not None:  # intermediate rows dealt in down_proj's whole blocks
        block = checkpoint.Checkpoint.read(cfg.path).row_blocks()["down_proj"][1]
        tp = dataclasses.replace(tp, down_block=block)
    with torch.device("meta"):
        # a sharded build only for models that take one (config.ParallelConfig.check_model refuses the rest)
        model = ARCHITECTURES[arch](cfg.hf_config, cfg.max_model_len, *([tp] if tp.size > 1 else []))
    if quant is not None:
        quant.prepare(model)  # quantized layers hold no float weight: none is allocated below
    model.to(cfg.dtype)  # on meta, before any byte exists: converting the allocated float32 took 2.4 s (0.5B)
    model.to_empty(device=cfg.device)
    if cfg.weight_dtype is not None:  # linear weights kept narrower than the model (bf16 on AVX2)
        for layer in linear_layers(model):
            if not layer.method.quantized and not layer.tied and layer.weight is not None:
                layer.weight = nn.Parameter(torch.empty_like(layer.weight, dtype=cfg.weight_dtype))
        embed = model.model.embed_tokens  # type: ignore[union-attr]
        if type(embed) is VocabEmbedding and not cfg.is_multimodal:  # the table too; lookups widen their rows
            embed.weight = nn.Parameter(torch.empty_like(embed.weight, dtype=cfg.weight_dtype))
            embed.out_dtype = cfg.dtype
    # rotary tables are buffers built on meta: rebuild them for real, kept in float32
    spec = model.spec  # type: ignore[attr-defined]
    rotary = RotaryEmbedding(cfg.hf_config, spec.head_dim, cfg.max_model_len)
    model.model.rotary.cos = rotary.cos.to(cfg.device)  # type: ignore[union-attr]
    model.model.rotary.sin = rotary.sin.to(cfg.device)  # type: ignore[union-attr]
    model.tie_weights()  # type: ignore[operator]
    if cfg.load_format == "dummy":
        _randomize(model)
    else:
        load_weights(model, cfg, quant.weights() if quant is not None else iter_weights(Path(cfg.path), progress))
    if quant is not None:
        quant.finish(model, cfg.device)
        logger.info("quantized weights, %s", quant.summary(model))
    cpu_paths.prepare(model, cfg, tp)  # linear methods, the decode kernel's weights; logs the summary line
    memory.ARENA.close()  # its last mapping lives on through the weights in it only
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    logger.info("model loaded: %.1f MiB of %s weights on %s", weights / 2**20, cfg.dtype, cfg.device)
    return model.eval()


def load_weights(
    model: nn.Module, cfg: ModelConfig, weights: Iterable[tuple[str, torch.Tensor | TensorSource]]
) -> None:
    """Copy checkpoint-named tensors (HF names; in memory or lazy `TensorSource`s) into the
    model's parameters (fused layers take their shards' rows, a tensor-parallel rank its part);
    every tensor the model loads must be covered. Dtype and device follow the parameter."""
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
            try:
                targets[name](InMemory(tensor) if isinstance(tensor, torch.Tensor) else tensor)
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"model: checkpoint tensor {name!r}: {e}") from e
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
