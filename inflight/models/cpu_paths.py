"""Which fast paths a loaded model takes on this machine, applied once at load and logged.

The decisions come from the platform module (inflight/platform.py); this module applies them
to the model: each linear layer's method (models/linear.py: `OneDNNLinear` where oneDNN packs
this dtype, `Bf16Linear` for bf16 weights the decode kernel reads where our bf16 GEMM runs,
else `PlainLinear`), the plain weights the C decode kernel reads (kept by those
methods, models/cpu_kernel.py), and one log line that names every choice, e.g.

    cpu: zen3 avx2 fma (2 cores) | bf16: emulated | dtype: float32 (checkpoint bfloat16)
        | onednn: float32 | kernel: avx2, bf16 weights
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from inflight import platform
from inflight.config import ModelConfig, checkpoint_dtype
from inflight.models import (
    cpu_kernel_choice,
    cpu_kernel_quant,
    cpu_linear,
    triton_fused,
    triton_gemv,
)
from inflight.models.linear import PlainLinear, linear_layers, set_methods
from inflight.models.parallel import TensorParallel
from inflight.quant.linear import WidenedLinear

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuPaths:
    """What one loaded model runs with (the log line, and what tests check)."""

    summary: str  # the whole log line
    packed: bool  # linear weights prepacked for oneDNN
    kernel: str | None  # the decode kernel variant ("avx2, bf16 weights"), None when off
    kernel_weights: torch.dtype | None  # the dtype of the weights the kernel reads per token


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def prepare(model: nn.Module, cfg: ModelConfig, tp: TensorParallel | None = None) -> CpuPaths:
    """Apply this machine's fast paths to a freshly loaded model; log and return what was chosen
    (also kept as `model.cpu_paths`, which benchmarks record with their results)."""
    plat = platform.current()
    dtype = _dtype_name(cfg.dtype)
    ckpt = checkpoint_dtype(cfg.hf_config)
    if ckpt is not None and ckpt != cfg.dtype:
        dtype += f" (checkpoint {_dtype_name(ckpt)})"
    if cfg.weight_dtype is not None:
        dtype += f", {_dtype_name(cfg.weight_dtype)} weights"
    head = f"{plat.summary()} | dtype: {dtype}"
    if cfg.device.type != "cpu":
        paths = CpuPaths(f"{head} | device: {cfg.device} | {platform.cuda_summary()} | {triton_fused.summary()} | {triton_gemv.summary()}", False, None, None)
    else:
        paths = _prepare_cpu(model, cfg, head, tp or TensorParallel.single())
    logger.info("%s", paths.summary)
    model.cpu_paths = paths  # type: ignore[assignment]
    return paths


def _prepare_cpu(model: nn.Module, cfg: ModelConfig, head: str, tp: TensorParallel) -> CpuPaths:
    refusal = cpu_linear.packing_refusal(cfg.device, cfg.dtype) if cfg.cpu_fast_path else "off (cpu_fast_path=False)"
    widened = cfg.weight_dtype is not None  # bf16 weights in a float32 model: no float32 copies to pack
    if widened:
        refusal = f"off ({_dtype_name(cfg.weight_dtype)} weights, widened in the kernels)"  # type: ignore[arg-type]
    packed = refusal is None  # per rank: each packs its own shard
    # bf16 weights the decode kernel reads, multiplied in batches by our GEMM where it runs: one copy
    one_copy = packed and tp.size == 1 and cpu_linear.one_copy_available(cfg.dtype)
    if tp.size > 1:  # one C call runs every layer: there is no point between layers for an all-reduce
        head += f" | tensor parallel: rank {tp.rank} of {tp.size}"
        choice = cpu_kernel_choice.KernelChoice(None, "off (tensor parallel: the kernel has no all-reduce between layers)")
    elif any(layer.method.quantized for layer in linear_layers(model)):
        if cfg.cpu_fast_path and cpu_kernel_quant.quant_weights(model) is not None:  # the fused step on the quantized bytes
            choice = cpu_kernel_choice.choose(model, cfg.dtype, packed and not one_copy)
        else:
            choice = cpu_kernel_choice.KernelChoice(None, "off (quantized weights the fused kernel does not multiply)")
    elif cfg.cpu_fast_path:
        choice = cpu_kernel_choice.choose(model, cfg.dtype, packed and not one_copy)
    else:
        choice = cpu_kernel_choice.KernelChoice(None, "off (cpu_fast_path=False)")
    weights = choice.variant.weights if choice.variant is not None else None
    one_copy = one_copy and weights == cfg.dtype  # no kernel: oneDNN's packed copy is the one copy
    if one_copy:
        packed, refusal = False, "off (bf16: our GEMM on the kernel's weights, one copy)"
        plain = cpu_linear.plain_copies(model, weights, copy=False) if weights is not None else None
        set_methods(model, cpu_linear.Bf16Linear, plain)
    elif packed:
        cpu_linear.use_onednn(model, plain_dtype=weights)
    elif weights is not None or widened:  # the kernel's weights, in place where they can be
        plain = cpu_linear.plain_copies(model, weights, copy=False) if weights is not None else None
        set_methods(model, WidenedLinear if widened else PlainLinear, plain)
    if refusal is None:
        onednn = _dtype_name(cfg.dtype)
    else:
        onednn = refusal if refusal.startswith("off") else f"off ({refusal})"
    kernel = choice.note if choice.lib is not None else None
    return CpuPaths(f"{head} | onednn: {onednn} | kernel: {choice.note}", packed, kernel, weights)
