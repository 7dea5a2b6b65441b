"""Fused elementwise kernels in Triton for the CUDA path: residual add + RMSNorm, SiLU(gate) * up,
RoPE on q and k in place (with Qwen3's per-head q/k RMSNorm before it).

Each replaces 2-6 torch launches and as many round trips through HBM: on an H100 (docs/GPU.md)
the torch ops they replace took ~10 of a 2,048-token prefill step's 52 ms of kernels and ~0.65 ms
of a 7.64 ms batch-1 token (8B shape, bf16).

**Rounding.** Arithmetic is float32, and every value HF's modules round to the model dtype is
rounded here at the same point (`.to(DT).to(f32)`), so bf16 / fp16 results equal the torch path's
bit for bit (up to the order of the RMS sum, which can move the last bit of rstd): RMSNorm rounds
x * rstd, then weight * that (HF's `weight * hidden.to(dtype)`); RoPE rounds cos, sin, both
products and their sum (HF computes it in the model dtype); SiLU(gate) rounds before the * up.
A product of two bf16 / fp16 values is exact in float32, so these roundings are torch's own.

Used where a tensor is on CUDA and Triton imports (`use`); the CPU keeps its paths (the C kernels,
torch). `INFLIGHT_TRITON_FUSED=0` turns them off (A/B); `1` also runs them on CPU tensors when
Triton's interpreter is on (TRITON_INTERPRET=1: tests only, slow). Every launch is a fixed grid
over shapes, no host sync and no allocation but the outputs: CUDA graphs capture them.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import torch

from inflight.models.triton_attention import available, interpreted


@functools.cache
def _kernels() -> Any:
    """models/triton_fused_kernels.py, imported on first use: a CPU-only process never imports Triton."""
    return importlib.import_module("inflight.models.triton_fused_kernels")


@functools.cache
def _mode() -> tuple[bool, bool]:
    """(on CUDA tensors, on CPU tensors), read once: called ~4 times a layer a step."""
    mode = os.environ.get("INFLIGHT_TRITON_FUSED", "auto") or "auto"
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"INFLIGHT_TRITON_FUSED: {mode!r} is not one of 0, 1, auto")
    found = mode != "0" and available()
    return found, found and mode == "1" and interpreted()


def reset() -> None:
    """Read INFLIGHT_TRITON_FUSED again (tests that change it)."""
    _mode.cache_clear()


def summary() -> str:
    """The load log's note (models/cpu_paths.py); reads, so checks, INFLIGHT_TRITON_FUSED there."""
    if _mode()[0]:
        return "fused elementwise: triton"
    reason = "INFLIGHT_TRITON_FUSED=0" if os.environ.get("INFLIGHT_TRITON_FUSED") == "0" else "triton not installed"
    return f"fused elementwise: off ({reason})"


def use(x: torch.Tensor) -> bool:
    """Whether the fused kernels run on `x`: on CUDA when Triton imports, unless switched off."""
    on_cuda, on_cpu = _mode()
    return on_cuda if x.is_cuda else on_cpu and x.device.type == "cpu"


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, last dim) with unit stride along it (a view when it is one)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, weight * s / sqrt(mean(s^2) + eps)) with s = x (+ residual), both shaped like x; s is x
    itself without a residual. One pass a row."""
    n = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    s = x if residual is None else torch.empty_like(x)
    r2 = x2 if residual is None else _rows(residual)
    s2 = x2 if residual is None else s.view(-1, n)
    if rows:
        block = _pow2(n)
        _kernels().rms_norm[(rows,)](
            x2, r2, weight, s2, out.view(-1, n), x2.stride(0), r2.stride(0), s2.stride(0), n, n, eps,
            HAS_RES=residual is not None, BLOCK=block, EMULATE=interpreted(), num_warps=min(16, max(1, block // 512)),
        )  # fmt: skip
    return s, out


def silu_mul(y: torch.Tensor, inter: int) -> torch.Tensor:
    """SiLU(y[..., :inter]) * y[..., inter:] of a (..., 2 * inter) gate_up output: (..., inter)."""
    y2 = _rows(y)
    rows = y2.shape[0]
    out = torch.empty((*y.shape[:-1], inter), dtype=y.dtype, device=y.device)
    if rows:
        block = 1024 if rows >= 64 else 256  # few rows: more programs to spread one row's 14,336 columns
        _kernels().silu_mul[(rows, -(-inter // block))](
            y2, out, y2.stride(0), inter, inter, BLOCK=block, EMULATE=interpreted(), num_warps=4 if block >= 1024 else 2,
        )  # fmt: skip
    return out


# With FP contraction on (Triton's default), LLVM folds `round(x * cos) + round(x' * sin)` into
# fma.rn.bf16(x, cos, mul.bf16(x', sin)): one product never rounds. On an H100 (2026-11-27) that put
# q / k 1-3 ulp from torch's in bf16 / fp16 on a few % of the elements and the bf16 HF-parity tests
# of llama / mistral / qwen3 below their bar; without it the PTX is mul.rn + mul.rn + add.rn, HF's
# roundings (tests/model/test_triton_fused.py reads the PTX for sm_90).


def rope_(
    qk: torch.Tensor,  # (T, heads, head_dim), unit stride along head_dim: q's heads then k's
    positions: torch.Tensor,  # (T,) int, on qk's device
    cos: torch.Tensor,  # (P, rot_dim) float32, RotaryEmbedding's table
    sin: torch.Tensor,  # (P, rot_dim) float32, the first half negated
    norms: tuple[torch.Tensor, torch.Tensor, int, float] | None = None,  # (q weight, k weight, q heads, eps)
) -> torch.Tensor:
    """Rotate q and k in place (after Qwen3's per-head RMSNorm when `norms`); returns qk."""
    t, heads, hd = qk.shape
    assert qk.stride(-1) == 1 and cos.stride(-1) == 1 and cos.stride(0) == sin.stride(0)
    if t == 0:
        return qk
    if norms is None:
        wq = wk = cos  # unread (HAS_NORM=False)
        num_q, eps = heads, 0.0
    else:
        wq, wk, num_q, eps = norms
    block_h = min(_pow2(heads), 16)
    grid = (t, -(-heads // block_h))
    _kernels().rope[grid](
        qk, cos, sin, positions, wq, wk, qk.stride(0), qk.stride(1), cos.stride(0), heads, num_q, eps,
        HEAD_DIM=hd, HD_PAD=_pow2(hd), ROT=cos.shape[-1], BLOCK_H=block_h, HAS_NORM=norms is not None, EMULATE=interpreted(),
        num_warps=4, enable_fp_fusion=False,  # no FMA contraction: see the comment above
    )  # fmt: skip
    return qk
