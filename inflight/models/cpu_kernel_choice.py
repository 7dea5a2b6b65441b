"""Which fused decode kernel a model gets (models/cpu_kernel.py builds and runs it): the weights'
dtype it reads them in, whether their plain copies fit in memory, the library for this CPU's
flavour, or why none ("off (...)", for cpu_paths' log line). Never raises."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import torch
from torch import nn

from inflight import platform
from inflight.models.cbuild import KernelUnavailable
from inflight.models.cpu_kernel import KERNEL_DTYPES, Variant, enabled, load_library, short_name
from inflight.models.cpu_kernel_quant import quant_weights
from inflight.models.linear import linear_layers

logger = logging.getLogger("inflight.models.cpu_kernel")

# Keep plain weights (the kernel's) beside the packed ones only while they take at most this
# share of the memory available after loading.
PLAIN_MEMORY_SHARE = 0.25


def _exact_in_bf16(t: torch.Tensor) -> bool:
    """Every value of a float32 tensor is a bfloat16 value (its low 16 bits are zero)."""
    if t.dtype != torch.float32:
        return t.dtype == torch.bfloat16
    return not bool((t.detach().contiguous().view(torch.int32) & 0xFFFF).any())


def plain_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights the kernel reads as GEMV matrices: every linear layer's (a tied lm_head's is
    the embedding), before any linear method repacked them."""
    return [layer.weight for layer in linear_layers(model)]


def plain_dtype(model: nn.Module, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype of the kernel's GEMV weights for a model of `dtype`; None: no kernel variant. A
    float32 model whose weights are kept f16 (a GGUF F16 file on AVX2, config.resolve_weight_dtype)
    reads them as they are."""
    if dtype == torch.bfloat16:
        return torch.bfloat16
    if dtype != torch.float32:
        return None
    if all(w.dtype == torch.float16 for w in plain_weights(model)):
        return torch.float16
    return torch.bfloat16 if all(_exact_in_bf16(w) for w in plain_weights(model)) else torch.float32


@dataclass(frozen=True)
class KernelChoice:
    """What the loader decided for a model: a loaded library, or none and why."""

    lib: ctypes.CDLL | None
    note: str  # for the log line: "avx2, bf16 weights" or "off (no C compiler)"
    variant: Variant | None = None


def choose(model: nn.Module, dtype: torch.dtype, packed: bool) -> KernelChoice:
    """The kernel for this model on this platform, or why none. Never raises: a kernel that cannot
    be built or loaded is logged with its reason and the PyTorch path runs."""
    if not enabled():
        return KernelChoice(None, "off (INFLIGHT_CPU_KERNEL=0)")
    if not hasattr(model, "spec"):
        return KernelChoice(None, "off (not a Llama-family model)")
    if quant_weights(model) is not None:  # the quantized bytes themselves: no copy to keep
        return _choose_quant(dtype)
    weights = plain_dtype(model, dtype)
    if weights is None:
        return KernelChoice(None, f"off (no {short_name(dtype)} variant)")
    plat = platform.current()
    variant = Variant(plat.kernel_flavour(), dtype, weights)
    try:
        lib = load_library(variant)
    except KernelUnavailable as e:
        logger.warning("CPU decode kernel unavailable (%s); the PyTorch path runs", e)
        return KernelChoice(None, f"off ({e})")
    # copies: every weight beside oneDNN's packed ones, else those not already in the GEMV dtype
    extra = sum(w.numel() for w in plain_weights(model) if packed or w.dtype != weights) * weights.itemsize
    avail = _available_memory() if extra else None
    if extra and (avail is None or extra > PLAIN_MEMORY_SHARE * avail):
        return KernelChoice(None, f"off (plain weights, {extra / 2**30:.1f} GiB, would take over "
                                  f"{int(PLAIN_MEMORY_SHARE * 100)}% of free memory)")  # fmt: skip
    note = variant.describe()
    wanted = plat.kernel_flavour(runnable=False)
    if wanted != variant.flavour:
        note += f"; the profile picks {wanted}, not runnable on this CPU"
    return KernelChoice(lib, note, variant)


def _choose_quant(dtype: torch.dtype) -> KernelChoice:
    if dtype not in KERNEL_DTYPES:
        return KernelChoice(None, f"off (no {short_name(dtype)} variant)")
    variant = Variant(platform.current().kernel_flavour(), dtype, dtype)
    try:
        lib = load_library(variant)
    except KernelUnavailable as e:
        logger.warning("CPU decode kernel unavailable (%s); the PyTorch path runs", e)
        return KernelChoice(None, f"off ({e})")
    return KernelChoice(lib, f"{variant.flavour}, quantized weights")  # no variant: nothing plain to keep


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}["MemAvailable"]
    except (OSError, KeyError):
        return None
