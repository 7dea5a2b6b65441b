"""CPU kernels for weights in a narrow float format: f16, bf16 and f8c (FP8 e4m3) `QuantWeight`s.

y = x @ (s * w)^T with w widened to float32 in registers (never a float copy of the weight) and
float32 activations: y equals dequantize(w) @ x up to float32 summation order. The C source is
inflight/csrc/float_kernels.c, built like quant_kernels.c (system compiler on first use, cached,
in the flavour inflight/platform.py picks from `QUANT_FLAVOURS`: AVX-512, AVX2 + F16C, portable).

One call serves every row count: batch-1 GEMV (a dot-product loop, bandwidth-bound) and, from 8
rows, a panel GEMM (weights widened once per 256 columns into an L1 panel) that runs batched
decode and prefill as fast as oneDNN's float32 GEMM on the same CPU class (float_kernels.c).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from inflight import platform
from inflight.models.cbuild import (
    KernelUnavailable,
    compile_cached,
    open_checked,
    platform_library,
    quant_compile_flags,
)
from inflight.quant import kernels as _quant
from inflight.quant.weight import QuantWeight

logger = logging.getLogger(__name__)

SOURCE = _quant.SOURCE.parent / "float_kernels.c"
ABI_VERSION = 1
WTYPES = ("f16", "bf16", "f8c")  # the C enum HT_*
_PATH = {"portable": 0, "avx2": 1, "avxvnni": 1, "avx512vnni": 2}  # ifl_float_path() of each flavour
_P = ctypes.c_void_p
_I = ctypes.c_int


def build(flavour: str) -> str:
    flags = quant_compile_flags(flavour)
    return str(compile_cached(SOURCE, f"float-{flavour}", flags))


@functools.cache
def load(flavour: str | None = None) -> ctypes.CDLL:
    """The loaded library of `flavour` (default: the platform's pick); raises KernelUnavailable."""
    flavour = flavour or platform.current().quant_flavour()
    if not platform.current().can_run_quant(flavour):
        raise KernelUnavailable(f"float kernel {flavour} is not runnable on this CPU")
    path = build(flavour)
    lib = open_checked(Path(path), ("ifl_float_abi_version", "ifl_float_path"), (ABI_VERSION, _PATH[flavour]))
    lib.ifl_float_matmul.argtypes = [_I, _I, _I, _P, _P, _I, _P, _I, _P, _P, _I]
    return lib


def _library() -> ctypes.CDLL | None:
    return platform_library(load, platform.current().quant_flavour(), "float-weight CPU kernels")


def supports(qw: QuantWeight) -> bool:
    """Whether the C kernel has this weight's layout (independent of the machine)."""
    if qw.qtype not in WTYPES or qw.data.device.type != "cpu" or qw.perm is not None or qw.act_int8:
        return False
    if qw.qtype == "f8c":
        return qw.scales is not None and qw.scales.dtype == torch.float32 and qw.scales.numel() in (1, qw.shape[0])
    return qw.data.dtype == (torch.float16 if qw.qtype == "f16" else torch.bfloat16)


def available(qw: QuantWeight) -> bool:
    """Whether `matmul(qw, x)` runs in C here."""
    return _quant.enabled() and supports(qw) and _library() is not None


def matmul(qw: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None = None,
           lib: ctypes.CDLL | None = None) -> torch.Tensor:  # fmt: skip
    """x (..., K) float -> (..., N) in x's dtype: x @ dequantize(qw)^T + bias. `lib`: a given
    flavour's library (tests); by default the platform's."""
    lib = lib or _library()
    if lib is None or not supports(qw):
        raise KernelUnavailable(f"no float kernel for {qw.qtype} {qw.shape}")
    n, k = qw.shape
    lead = x.shape[:-1]
    xf = x.reshape(-1, k).to(torch.float32).contiguous()
    m = xf.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m == 0:
        return y.to(x.dtype).reshape(*lead, n)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    data = qw.data.contiguous()
    scales = None if qw.qtype != "f8c" else qw.scales.contiguous()  # type: ignore[union-attr]
    per_row = int(scales is not None and scales.numel() == n)
    rc = lib.ifl_float_matmul(WTYPES.index(qw.qtype), n, k, data.data_ptr(), _ptr(scales), per_row,
                              xf.data_ptr(), m, y.data_ptr(), _ptr(b), torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"float-weight matmul failed ({rc}) for {qw.qtype} {qw.shape}")
    return (y if x.dtype == torch.float32 else y.to(x.dtype)).reshape(*lead, n)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()
