"""CPU fast path: oneDNN-prepacked weights for every linear layer.

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

`pack_for_cpu(model)` is applied after weights are loaded; modules then call
`linear(x, module)` which takes the packed weight when there is one.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from inflight import platform

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


def linear(x: torch.Tensor, layer: nn.Linear, post_op: str = "none") -> torch.Tensor:
    packed = getattr(layer, "packed_weight", None)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, post_op, [], "")
    y = F.linear(x, layer.weight, layer.bias)
    return F.silu(y) if post_op == "swish" else y


def linear_mul(x: torch.Tensor, layer: nn.Linear, other: torch.Tensor) -> torch.Tensor:
    """linear(x) * other, fused into the GEMM when packed."""
    packed = getattr(layer, "packed_weight", None)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, layer.bias, "mul")
    return F.linear(x, layer.weight, layer.bias) * other


def pack_for_cpu(model: nn.Module, plain_dtype: torch.dtype | None = None) -> int:
    """Reorder every linear weight for oneDNN (in place). Returns how many were packed.

    The MLP's fused gate_up weight is split into gate and up so that SiLU and the
    product become GEMM post-ops; a tied lm_head gets a packed copy of the embedding.
    `plain_dtype` (the decode kernel's weights) keeps a plain copy of every weight in that dtype
    first (see keep_plain_weights). The original weights are dropped either way: keeping them in
    place instead slowed the packed batch-32 GEMMs ~12 % (measured 200-220 vs 239 tok/s),
    presumably through where the packed copies then land.
    """
    if plain_dtype is not None:
        keep_plain_weights(model, plain_dtype, copy=True)
    n = 0
    split: set[int] = set()
    for module in list(model.modules()):
        gate_up = getattr(module, "gate_up_proj", None)
        if isinstance(gate_up, nn.Linear):
            gate_w, up_w = gate_up.weight.chunk(2, dim=0)
            module.gate_packed = pack_weight(gate_w)  # type: ignore[assignment]
            module.up_packed = pack_weight(up_w)  # type: ignore[assignment]
            biases = gate_up.bias.chunk(2) if gate_up.bias is not None else (None, None)
            module.gate_bias, module.up_bias = biases  # type: ignore[assignment]
            split.add(id(gate_up))
            _drop_weight(gate_up)
            n += 2
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight is not None and id(module) not in split:
            module.packed_weight = pack_weight(module.weight)  # type: ignore[assignment]
            _drop_weight(module)
            n += 1
    tied_weight = getattr(model, "tied_lm_head_weight", lambda: None)()
    if tied_weight is not None:
        model.lm_head_packed = pack_weight(tied_weight)  # type: ignore[assignment]
        n += 1
    logger.info("packed %d linear weights for oneDNN", n)
    return n


def plain_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights the decode kernel reads as GEMV matrices: every linear, and a tied lm_head."""
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not None]
    tied = getattr(model, "tied_lm_head_weight", lambda: None)()
    return weights + ([tied] if tied is not None else [])


def keep_plain_weights(model: nn.Module, dtype: torch.dtype, copy: bool) -> None:
    """Give every linear a `plain_weight` in `dtype` (and the model an `lm_head_plain` when the
    lm_head is tied and `dtype` is not the embedding's). `copy` (or a dtype change) copies them
    into one arena allocated up front; otherwise `plain_weight` is the weight itself."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not None]
    tied = getattr(model, "tied_lm_head_weight", lambda: None)()
    tied_copy = tied is not None and tied.dtype != dtype
    copies = [m.weight for m in linears if copy or m.weight.dtype != dtype] + ([tied] if tied_copy else [])
    arena = _Arena(sum(w.numel() for w in copies), dtype, linears[0].weight.device) if copies else None
    for m in linears:
        w = m.weight.detach()
        m.plain_weight = arena.take(w) if arena is not None and (copy or w.dtype != dtype) else w  # type: ignore[assignment,union-attr]
    if tied_copy:
        model.lm_head_plain = arena.take(tied.detach())  # type: ignore[assignment,union-attr]


class _Arena:
    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buf = torch.empty(numel, dtype=dtype, device=device)
        self.used = 0

    def take(self, w: torch.Tensor) -> torch.Tensor:
        out = self.buf[self.used : self.used + w.numel()].view(w.shape)
        self.used += w.numel()
        return out.copy_(w)


def _drop_weight(layer: nn.Linear) -> None:
    """The packed copy replaces the plain weight: no double memory."""
    del layer.weight
    layer.register_parameter("weight", None)
