"""y = x @ W^T (+ bias) in Triton for decode steps of 1-8 rows on CUDA (models/triton_gemv_kernels.py).

A batch-1 token of an 8B bf16 model reads 15 GB of weights through ~225 GEMVs; on an H100 cuBLAS
ran the wide ones (gate_up) near the copy rate but o_proj (4096 x 4096) at ~1.6 TB/s of ~3 TB/s
(docs/GPU.md). These kernels stream W in (BLOCK_N rows, BLOCK_K) tiles with enough programs to
fill the SMs even for N = 4,096 (one row: 8-row blocks, 512 programs; 2-8 rows: 16-row blocks,
256; fewer row blocks than SMs split K too, with a float32 partial buffer and a small reduce launch).

**Rounding.** float32 products and sums, the bias added in float32, one rounding to x's dtype at
the end: F.linear's (cuBLAS') rounding, so bf16 / fp16 outputs are within half an ulp of the
float64 result plus float32's accumulation error (the sums' order only moves float32's last
bits), and within one ulp of cuBLAS' (a flip where the two float32 sums straddle a rounding
boundary; tests/model/test_triton_gemv.py asserts both).

**Switch.** `INFLIGHT_TRITON_GEMV`: 0 (default: F.linear everywhere), auto (CUDA tensors of 1-8
rows when Triton imports), 1 (auto, and CPU tensors under Triton's interpreter: tests only).
`INFLIGHT_TRITON_GEMV_SILU=1` (with the GEMV on; default 0): the MLP's down projection reads the
gate_up output and multiplies by SiLU(gate) * up in the same launch (`silu_linear`, from
models/linear.py's `silu_down`): one launch and one (M, I) round trip less a layer, SiLU computed
once per row block instead of once. Read once per process on first use (`reset` reads them
again); CUDA graphs capture whichever path was on at capture time. No host sync, no allocation
but the output (and the split-K partials, from the graph's pool): capturable.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from inflight.models.triton_attention import available, interpreted

MAX_ROWS = 8  # more rows: a GEMM, cuBLAS' business
DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def _kernels() -> Any:
    """models/triton_gemv_kernels.py, imported on first use: a CPU-only process never imports Triton."""
    return importlib.import_module("inflight.models.triton_gemv_kernels")


@functools.cache
def _mode() -> tuple[bool, bool, bool]:
    """(on CUDA tensors, on CPU tensors, the MLP's down fused with SiLU * up), read once: called
    for every linear layer of a step."""
    mode = os.environ.get("INFLIGHT_TRITON_GEMV", "0") or "0"
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"INFLIGHT_TRITON_GEMV: {mode!r} is not one of 0, 1, auto")
    silu = os.environ.get("INFLIGHT_TRITON_GEMV_SILU", "0") or "0"
    if silu not in ("0", "1"):
        raise ValueError(f"INFLIGHT_TRITON_GEMV_SILU: {silu!r} is not one of 0, 1")
    found = mode != "0" and available()
    return found, found and mode == "1" and interpreted(), found and silu == "1"


def reset() -> None:
    """Read INFLIGHT_TRITON_GEMV and INFLIGHT_TRITON_GEMV_SILU again (tests, the benchmarks' A/B legs)."""
    _mode.cache_clear()


def summary() -> str:
    """The CUDA load log's note (models/cpu_paths.py); reads, so checks, INFLIGHT_TRITON_GEMV there."""
    if _mode()[0]:
        return f"GEMV (<= {MAX_ROWS} rows): triton" + (", down fused with SiLU * up" if _mode()[2] else "")
    reason = "triton not installed" if os.environ.get("INFLIGHT_TRITON_GEMV", "0") not in ("", "0") else "INFLIGHT_TRITON_GEMV=0"
    return f"GEMV: cuBLAS ({reason})"


def use(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None, silu: bool = False) -> bool:
    """Whether `linear` runs x @ weight^T: switched on for x's device, 1-8 rows, a 16-bit dtype
    that the weight (and bias) share, the weight's rows contiguous. `silu`: whether `silu_linear`
    runs the MLP's down projection from the gate_up layer's input x (INFLIGHT_TRITON_GEMV_SILU=1)."""
    on_cuda, on_cpu, fused = _mode()
    if silu and not fused:
        return False
    if not (on_cuda if x.is_cuda else on_cpu and x.device.type == "cpu"):
        return False
    if weight is None or x.dtype not in DTYPES or weight.dtype != x.dtype or weight.stride(-1) != 1:
        return False
    if bias is not None and bias.dtype != x.dtype:
        return False
    return weight.dim() == 2 and 0 < x.numel() // max(x.shape[-1], 1) <= MAX_ROWS


@dataclass(frozen=True)
class Config:
    """One launch's tiling: BLOCK_N rows of W per program, BLOCK_K columns a tile, K in split_k
    slices; dot: tensor cores on x padded to 16 rows, else FMA on one row."""

    block_n: int = 8
    block_k: int = 512
    split_k: int = 1
    dot: bool = False
    num_warps: int = 4
    num_stages: int = 3


@functools.cache
def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: an H100's count, so tests see the GPU's choices
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def choose(m: int, n: int, k: int, sms: int) -> Config:
    """The default tiling: FMA for one row, tensor cores for 2-8; K split in slices of >= 4 tiles
    when the row blocks are fewer than the SMs (not so for any Llama-3-8B shape: o_proj's and
    down's 4,096 rows are 512 / 256 blocks). Guesses from the compiled code (sm_90: 16-byte loads,
    ~120 registers and 2 tiles in flight for FMA; 3 tiles in flight through 48 KB of shared
    memory for DOT) until benchmarks/triton_gemv_bench.py has run on a GPU."""
    dot = m > 1
    cfg = Config(block_n=16, block_k=256, dot=True, num_stages=4) if dot else Config()
    blocks = -(-n // cfg.block_n)
    split = 1
    if blocks < sms:
        split = max(1, min(-(-2 * sms // blocks), k // (4 * cfg.block_k)))
    return replace(cfg, split_k=split)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: Config | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """x @ weight^T (+ bias): (..., K) -> (..., N), x's dtype. `config`: a tiling (benchmarks, tests);
    `out`: an (M, N) output with unit stride along N (else a new tensor)."""
    n, k = weight.shape
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device) if out is None else out
    _launch(x.reshape(-1, k), weight, bias, y.view(-1, n) if out is None else out, 0, config)
    return y


def silu_linear(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                config: Config | None = None) -> torch.Tensor:  # fmt: skip
    """(SiLU(gate) * up) @ weight^T (+ bias) of a (..., 2I) [gate; up] output, without writing the
    (..., I) product: triton_fused.silu_mul's roundings, then `linear`'s."""
    n, k = weight.shape
    assert gate_up.shape[-1] == 2 * k
    y = torch.empty((*gate_up.shape[:-1], n), dtype=gate_up.dtype, device=gate_up.device)
    _launch(gate_up.reshape(-1, 2 * k), weight, bias, y.view(-1, n), k, config)
    return y


def _launch(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor, inter: int, config: Config | None) -> None:
    """y (M, N) = x @ w^T (+ bias); `inter` > 0: x is (M, 2 * inter) and multiplies as SiLU(gate) * up."""
    m = x.shape[0]
    n, k = w.shape
    if m == 0:
        return
    assert m <= MAX_ROWS and x.dtype == w.dtype == y.dtype
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = config or choose(m, n, k, _sms(x.device))
    assert cfg.dot or m == 1, "the FMA kernel takes one row"
    kern = _kernels()
    split = cfg.split_k > 1
    partial = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device) if split else y
    flags = dict(HAS_BIAS=bias is not None, EMULATE=interpreted())
    kern.gemv[(-(-n // cfg.block_n), cfg.split_k)](
        x, w, w if bias is None else bias, y, partial, m, n, k, inter, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=16 if cfg.dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        EVEN_K=k % cfg.block_k == 0, DOT=cfg.dot, SILU=inter > 0, **flags,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split:
        block = 1024
        kern.reduce[(m, -(-n // block))](
            partial, w if bias is None else bias, y, m, n, y.stride(0), SPLIT_K=cfg.split_k, BLOCK=block, **flags, num_warps=4,
        )  # fmt: skip
