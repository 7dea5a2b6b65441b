"""Our bf16 GEMM on plain (N, K) weights (inflight/csrc/bf16_gemm.c, vdpbf16ps): what lets a bf16
model on an AVX-512 BF16 CPU hold its linear weights once. The batched steps multiply by the very
bf16 rows the batch-1 decode kernel reads, instead of by oneDNN's opaque packed copy beside them
(docs/QUANTIZATION.md "One copy where bf16 is native": 2,029 -> 991 MiB for the 0.5B shape).

Built only in the decode kernel's `avx512bf16` flavour (platform.KERNEL_FLAVOURS' flags) and used
only where the platform's kernel flavour is that one: INFLIGHT_CPU_FEATURES=native,-avx512_bf16
(or an AVX2 CPU) keeps the oneDNN / widening paths.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from inflight import platform
from inflight.models.cbuild import (
    KernelUnavailable,
    compile_cached,
    compile_flags,
    open_checked,
    platform_library,
)

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "bf16_gemm.c"
ABI_VERSION = 1
FLAVOUR = "avx512bf16"


@functools.cache
def load(flavour: str = FLAVOUR) -> ctypes.CDLL:
    """The built library; raises KernelUnavailable where this CPU cannot run it."""
    if flavour != FLAVOUR or not platform.current().can_run(flavour):
        raise KernelUnavailable(f"bf16 GEMM needs the {FLAVOUR} flavour")
    flags = compile_flags(platform.KERNEL_FLAVOURS[flavour][1])
    lib = open_checked(compile_cached(SOURCE, f"bf16gemm-{flavour}", flags), ("ifl_bf16_abi_version",), (ABI_VERSION,))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.ifl_bf16_gemm.argtypes = [i, i, p, p, i, p, p, i]
    return lib


def library() -> ctypes.CDLL | None:
    """The library where the platform's kernel flavour has bf16 dot products, else None."""
    if platform.current().kernel_flavour() != FLAVOUR:
        return None
    return platform_library(load, FLAVOUR, "bf16 GEMM")


def supports(w: torch.Tensor) -> bool:
    """Whether the C GEMM takes this weight (independent of the machine): a contiguous bf16
    (N, K) tensor on the CPU, K even (the kernel reads k-pairs as 32-bit words)."""
    return w.device.type == "cpu" and w.dtype == torch.bfloat16 and w.dim() == 2 and w.is_contiguous() and w.shape[1] % 2 == 0


def linear(w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None,
           lib: ctypes.CDLL | None = None) -> torch.Tensor:  # fmt: skip
    """x (..., K) @ w^T + bias -> (..., N) bf16, float32 accumulation, rounded once (as F.linear
    on these bf16 tensors). F.linear where the kernel does not take the operands."""
    lib = lib or library()
    n, k = w.shape
    if lib is None or x.dtype != torch.bfloat16 or not supports(w) or (bias is not None and bias.dtype != x.dtype):
        return F.linear(x, w, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    if m == 0:
        return y.reshape(*lead, n)
    b = None if bias is None else bias.detach().contiguous()
    rc = lib.ifl_bf16_gemm(n, k, w.data_ptr(), x2.data_ptr(), m, y.data_ptr(), 0 if b is None else b.data_ptr(),
                           torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"bf16 GEMM failed ({rc}) for {tuple(w.shape)}")
    return y.reshape(*lead, n)
