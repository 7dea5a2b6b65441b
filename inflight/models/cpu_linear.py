"""CPU fast path: the OneDNNLinear method, oneDNN-prepacked weights for every linear layer.

On an AVX512-BF16 machine (2 threads) `F.linear` takes generic paths that reach ~410-650
GFLOP/s in bf16 at 32 rows and ~100 GFLOP/s in fp32; the same GEMM on a weight reordered once
into oneDNN's blocked layout reaches 720-900 (measured: a Qwen2.5-0.5B decode step at batch 32
spends 39 ms in GEMMs instead of 56). On an AVX2 Zen 3 (2 threads) fp32 packing is 2.2x
`F.linear` for the gate/up GEMM at 32 rows (6.1 vs 13.6 ms) and even at 512 rows. oneDNN
post-ops also fuse the MLP's SiLU(gate) * up into the GEMMs (a 2048-token prefill layer: 46 ms
instead of 63).

Which dtypes are packed is the platform module's call (inflight/platform.py): oneDNN's bf16
GEMM needs AVX512-BW/VL/DQ or AVX-NE-CONVERT, and `pack_weight` raises `UnsupportedFastPath`
rather than asking oneDNN for a dtype / CPU pair the platform refuses.

`use_onednn(model)` gives every linear layer (models/linear.py) this method after the weights
are loaded; `plain_copies` keeps the decode kernel's plain GEMV weights beside the packed ones.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from inflight import platform
from inflight.models import bf16_gemm
from inflight.models.linear import LinearBase, LinearMethod, linear_layers, set_methods

logger = logging.getLogger(__name__)

# Row-count hint for the weight reorder. Measured at M = 1..2048: hints 1, 32 and 2048
# give the same speed, 256 was up to 1.6x slower for the gate/up GEMM at M = 2048.
_PACK_HINT = 32


class UnsupportedFastPath(RuntimeError):
    """A fast path was asked for on a dtype / CPU pair that the platform module refuses."""


def packing_refusal(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why weights of `dtype` on `device` are not packed for oneDNN; None when they are."""
    if device.type != "cpu":
        return f"not on the CPU ({device.type})"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "torch has no oneDNN"
    return platform.current().onednn_refusal(dtype)


def cpu_packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    return packing_refusal(device, dtype) is None


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """`w` reordered into oneDNN's blocked layout; raises UnsupportedFastPath where the platform
    module says oneDNN cannot run this dtype on this CPU (instead of oneDNN failing, or worse)."""
    why = packing_refusal(w.device, w.dtype)
    if why is not None:
        raise UnsupportedFastPath(f"oneDNN weight packing: {why}")
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), _PACK_HINT)


class OneDNNLinear(LinearMethod):
    """The weight reordered once into oneDNN's blocked layout after loading, the plain one
    dropped (no double memory). A [gate; up] layer packs gate and up apart so that SiLU and the
    product run as GEMM post-ops; a tied layer packs a copy and leaves its owner's weight be."""

    def __init__(self, plain: torch.Tensor | None = None) -> None:
        super().__init__(plain)
        self.packed: list[torch.Tensor] = []  # one per GEMM: [weight], or [gate, up]
        self.biases: list[torch.Tensor | None] = []

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        w, b = layer.weight, layer.bias
        if layer.silu_mul:
            self.packed = [pack_weight(part) for part in w.chunk(2, dim=0)]
            self.biases = list(b.chunk(2)) if b is not None else [None, None]
        else:
            self.packed, self.biases = [pack_weight(w)], [b]
        layer.drop_weight()

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        """x W^T + b; for a [gate; up] layer the unfused [gate; up] output (a LoRA delta is added
        to it before SiLU * up, see models/lora.py)."""
        outs = [torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "") for w, b in zip(self.packed, self.biases)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def apply_silu_mul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        gate = torch.ops.mkldnn._linear_pointwise(x, self.packed[0], self.biases[0], "swish", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, gate, self.packed[1], self.biases[1], "mul")


class Bf16Linear(LinearMethod):
    """Our bf16 GEMM (models/bf16_gemm.py) on the layer's own weight, which the decode kernel reads
    too: one copy where oneDNN would hold a packed one beside it (AVX-512 BF16 CPUs). Level with
    oneDNN's packed GEMM from 16 rows on the Qwen2.5-0.5B shapes (benchmarks/bf16_gemm_ab.py)."""

    def apply(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        return bf16_gemm.linear(layer.weight, x, layer.bias)


def one_copy_available(dtype: torch.dtype) -> bool:
    """Whether bf16 weights can be multiplied by our GEMM on this machine (so held once);
    INFLIGHT_BF16_GEMM=0 keeps oneDNN's packed copy instead."""
    if dtype != torch.bfloat16 or os.environ.get("INFLIGHT_BF16_GEMM", "1") == "0":
        return False
    return bf16_gemm.library() is not None


def use_onednn(model: nn.Module, plain_dtype: torch.dtype | None = None) -> int:
    """Give every linear layer an OneDNNLinear (in place). Returns how many weights were packed.

    `plain_dtype` (the decode kernel's weights) keeps a plain copy of every weight in that dtype
    first (see plain_copies). The original weights are dropped either way: keeping them in place
    instead slowed the packed batch-32 GEMMs ~12 % (measured 200-220 vs 239 tok/s), presumably
    through where the packed copies then land.
    """
    plain = plain_copies(model, plain_dtype, copy=True) if plain_dtype is not None else None
    methods = set_methods(model, OneDNNLinear, plain)
    n = sum(len(m.packed) for m in methods if isinstance(m, OneDNNLinear))
    logger.info("packed %d linear weights for oneDNN", n)
    return n


def plain_copies(model: nn.Module, dtype: torch.dtype, copy: bool) -> list[torch.Tensor | None]:
    """The decode kernel's weight for each of `linear_layers(model)`, in `dtype`. `copy` (or a dtype
    change) copies them into one arena allocated up front; otherwise it is the weight itself. A
    tied layer's weight stays (its owner keeps it), so it is copied only to change its dtype."""
    layers = linear_layers(model)

    def copied(layer: LinearBase) -> bool:
        return (copy and not layer.tied) or layer.weight.dtype != dtype

    copies = [layer.weight for layer in layers if copied(layer)]
    arena = _Arena(sum(w.numel() for w in copies), dtype, layers[0].weight.device) if copies else None
    return [arena.take(layer.weight.detach()) if arena is not None and copied(layer) else layer.weight.detach()
            for layer in layers]  # fmt: skip


class _Arena:
    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buf = torch.empty(numel, dtype=dtype, device=device)
        self.used = 0

    def take(self, w: torch.Tensor) -> torch.Tensor:
        out = self.buf[self.used : self.used + w.numel()].view(w.shape)
        self.used += w.numel()
        return out.copy_(w)
