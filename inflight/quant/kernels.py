"""CPU kernels for `QuantWeight`s: y = x @ dequantize(w)^T without a full-precision weight copy.

The C source is inflight/csrc/quant_kernels.c (+ quant_kernels.h, the scheme: int8 activations
per 32 elements, weights unpacked a few rows at a time in L1, integer dot products). It is built
like the decode kernel (models/cpu_kernel.py: system C compiler on first use, cached under
~/.cache/inflight/kernels, libgomp shared with torch) in the instruction-set flavour that
inflight/platform.py picks (`QUANT_FLAVOURS`: AVX-512 VNNI, AVX2, portable C) and is loaded
only where the CPU runs it.

`available(qw)` says whether `matmul(qw, x)` runs in C for this weight; where it does not (a
qtype without a kernel: f16, bf16, f8c; no compiler; INFLIGHT_QUANT_KERNEL=0), the caller keeps
its portable torch path. Numerics: activations are rounded to int8 per block of 32 (llama.cpp's
Q8_0 activations), so y equals dequantize(w) @ q8(x) up to float summation order; see
quant_kernels.h and tests/unit/test_quant_kernels.py for the tolerances.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from inflight import platform
from inflight.models.cbuild import (
    KernelUnavailable,
    compile_cached,
    library_asked,
    open_checked,
    platform_library,
    quant_compile_flags,
)
from inflight.quant.weight import FILE_QTYPE, GGML_QTYPES, QuantWeight

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "quant_kernels.c"
ABI_VERSION = 3
QTYPE_IDS = ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "i4g", "i8c", "q4_1", "q5_0", "q5_1", "q5_0g", "q4_0g")  # the C enum QT_*
ROW_QTYPES = (*GGML_QTYPES, "q5_0g", "q4_0g")  # what ifl_quant_dequantize_rows takes
_PATH = {"portable": 0, "avx2": 1, "avxvnni": 2, "avx512vnni": 2}  # ifl_quant_path() of each flavour
_P = ctypes.c_void_p
_I = ctypes.c_int


def enabled() -> bool:
    return os.environ.get("INFLIGHT_QUANT_KERNEL", "1").lower() not in ("0", "false", "no", "off")


def build(flavour: str) -> Path:
    """Compile the flavour (or find it cached); building one this CPU cannot run is allowed."""
    flags = quant_compile_flags(flavour)
    return compile_cached(SOURCE, f"quant-{flavour}", flags)


@functools.cache
def load(flavour: str | None = None) -> ctypes.CDLL:
    """The loaded library of `flavour` (default: the platform's pick); raises KernelUnavailable."""
    flavour = flavour or platform.current().quant_flavour()
    if not platform.current().can_run_quant(flavour):
        raise KernelUnavailable(f"quant kernel {flavour} is not runnable on this CPU")
    path = build(flavour)
    lib = open_checked(path, ("ifl_quant_abi_version", "ifl_quant_path"), (ABI_VERSION, _PATH[flavour]))
    lib.ifl_quant_matmul.argtypes = [_I, _I, _I, _I, _P, _P, _P, _I, _P, _I, _P, _P, _I]
    lib.ifl_quant_matmul_runs.argtypes = [_I, _P, _P, _I, _P, _P, _P, _P, _P, _P, _I, _P, _P, _I]
    lib.ifl_quantize_q8_0.argtypes = [_P, _I, _I, _P, _I]
    lib.ifl_row_stats.argtypes = [_P, _I, ctypes.c_int64, ctypes.c_int64, _P, _P, _I]
    lib.ifl_silu_mul.argtypes = [_P, ctypes.c_int64, ctypes.c_int64, _P, _I]
    lib.ifl_rms_norm.argtypes = [_P, _P, _P, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, _P, _P, _I]
    lib.ifl_quant_dequantize_rows.argtypes = [_I, _I, _I, _P, _P, _I, _P]
    lib.ifl_quant_dequantize_rows_bf16.argtypes = [_I, _I, _I, _P, _P, _I, _P]
    logger.debug("quantized CPU kernels (%s) loaded from %s", flavour, path)
    return lib


def _library() -> ctypes.CDLL | None:
    return platform_library(load, platform.current().quant_flavour(), "quantized CPU kernels")


def supports(qw: QuantWeight) -> bool:
    """Whether the C kernels have this weight's layout (independent of the machine)."""
    n, k = qw.shape
    if qw.qtype not in QTYPE_IDS or k % 32 or qw.data.device.type != "cpu":
        return False
    if qw.qtype in FILE_QTYPE:  # q5_0g / q4_0g: groups of 4 blocks
        return k % 128 == 0
    if qw.qtype == "i4g":
        return qw.group_size % 16 == 0 and qw.scales is not None and qw.scales.dtype == torch.float16
    if qw.qtype == "i8c":
        return qw.scales is not None and qw.scales.dtype == torch.float32 and qw.scales.numel() in (1, n)
    return True


def regroups() -> bool:
    """Whether q5_0 / q4_0 weights are regrouped at load here (weight.regroup): the AVX-512 VNNI
    flavour has their grouped GEMV (csrc/quant_gemv_q5g.h); the others read the file's blocks as fast."""
    return enabled() and platform.current().quant_flavour() == "avx512vnni" and _library() is not None


def available(qw: QuantWeight) -> bool:
    """Whether `matmul(qw, x)` runs in C here."""
    return enabled() and supports(qw) and _library() is not None


def matmul(qw: QuantWeight, x: torch.Tensor, bias: torch.Tensor | None = None,
           lib: ctypes.CDLL | None = None) -> torch.Tensor:  # fmt: skip
    """x (..., K) float -> (..., N) in x's dtype: x @ dequantize(qw)^T + bias. `lib`: a given
    flavour's library (tests); by default the platform's. Call only where `available(qw)`."""
    return matmul_runs([qw], x, bias, lib)


def runs_supported(ws: list[QuantWeight]) -> bool:
    """Whether `matmul_runs` takes these weights in one call: one K, no act-order permutation
    (it gathers x's columns per weight), at most 8 runs (the C side's IFL_MAX_RUNS)."""
    if not 0 < len(ws) <= 8 or len({w.shape[1] for w in ws}) != 1:
        return False
    return len(ws) == 1 or all(w.perm is None for w in ws)


def matmul_runs(ws: list[QuantWeight], x: torch.Tensor, bias: torch.Tensor | None = None,
                lib: ctypes.CDLL | None = None) -> torch.Tensor:  # fmt: skip
    """A fused layer's weights of several layouts (rows stacked in order) in one product: x is
    quantized once and every weight's tiles share one parallel region; y (..., sum N). Call only
    where each is `available` and `runs_supported(ws)` (or a single weight, act-order included)."""
    lib = lib or _library()
    if lib is None or not all(supports(w) for w in ws) or not runs_supported(ws):
        raise KernelUnavailable(f"no C kernel for {[(w.qtype, w.shape) for w in ws]}")
    k = ws[0].shape[1]
    n = sum(w.shape[0] for w in ws)
    lead = x.shape[:-1]
    xf = x.reshape(-1, k)
    if ws[0].perm is not None:  # GPTQ act-order: stored column j multiplies feature perm[j]
        xf = xf.index_select(1, ws[0].perm.long())
    xf = xf.to(torch.float32).contiguous()
    m = xf.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m == 0:
        return y.to(x.dtype).reshape(*lead, n)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    keep = [[None if t is None else t.contiguous() for t in (w.data, w.scales, w.zeros)] for w in ws]
    ints = lambda vals: (ctypes.c_int * len(ws))(*vals)  # noqa: E731
    ptrs = lambda i: (ctypes.c_void_p * len(ws))(*(_ptr(t[i]) for t in keep))  # noqa: E731
    per_row = [int(w.scales is not None and w.scales.numel() == w.shape[0] and w.qtype == "i8c") for w in ws]
    rc = lib.ifl_quant_matmul_runs(
        len(ws), ints(QTYPE_IDS.index(w.qtype) for w in ws), ints(w.shape[0] for w in ws), k,
        ints(w.group_size for w in ws), ptrs(0), ptrs(1), ptrs(2), ints(per_row),
        xf.data_ptr(), m, y.data_ptr(), _ptr(b), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"quantized matmul failed ({rc}) for {[(w.qtype, w.shape) for w in ws]}")
    return (y if x.dtype == torch.float32 else y.to(x.dtype)).reshape(*lead, n)


def dequantize_rows(qw: QuantWeight, rows: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """Rows `rows` (int64) of a GGML-layout weight as float32 (len(rows), K), bit-exact to
    `weight.dequantize` (gguf-py's formula) at ~1 us a 896-wide row instead of ~70 us; None where
    the C kernels do not take this weight (the caller dequantizes in Python)."""
    lib = lib or (_library() if enabled() else None)
    if lib is None or qw.qtype not in ROW_QTYPES or not supports(qw) or qw.data.dim() != 2:
        return None
    rows = rows.to(torch.int64).contiguous()
    data = qw.data.contiguous()
    out = torch.empty(rows.numel(), qw.shape[1], dtype=torch.float32)
    rc = lib.ifl_quant_dequantize_rows(QTYPE_IDS.index(qw.qtype), qw.shape[0], qw.shape[1], data.data_ptr(), rows.data_ptr(),
                                       rows.numel(), out.data_ptr())  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"dequantize_rows failed ({rc}) for {qw.qtype} {qw.shape}")
    return out


def rows_dequantizer(qw: QuantWeight, dtype: torch.dtype = torch.float32) -> Callable[[int, int, int], int] | None:
    """`dequantize_rows` bound once to `qw`: f(rows_ptr, n, out_ptr) -> 0 writes rows `rows` (n
    int64) of it as `dtype` (n, K) at out_ptr (non-zero: a row out of range): float32, or bfloat16
    rounded as `.to(torch.bfloat16)` rounds the float32 rows. What the decode kernel's embedding
    calls per step, its checks and tensors done here; None where `dequantize_rows` would be, or
    for another dtype. qw.data must be contiguous (the caller keeps it alive)."""
    lib = _library() if enabled() else None
    if lib is None or qw.qtype not in ROW_QTYPES or not supports(qw) or qw.data.dim() != 2 or not qw.data.is_contiguous():
        return None
    fn = {torch.float32: lib.ifl_quant_dequantize_rows, torch.bfloat16: lib.ifl_quant_dequantize_rows_bf16}.get(dtype)
    return None if fn is None else functools.partial(fn, QTYPE_IDS.index(qw.qtype), qw.shape[0], qw.shape[1], qw.data.data_ptr())


def row_stats(x: torch.Tensor, logprobs: bool, lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(`x.argmax(dim=-1)`, and with `logprobs` those tokens' log-softmax in float64) of a CPU
    float32 (B, V) tensor with unit column stride, in C (a max pass and, for the logprob, a sum
    of e^(x - max) a row); None where the kernels are off, absent or not loaded yet (the caller's
    torch path runs: a float model's sampler never builds them)."""
    lib = lib or (_library() if enabled() and library_asked(load) else None)
    if lib is None or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] == 0:
        return None
    if x.stride(1) != 1 or (x.shape[0] > 1 and x.stride(0) < x.shape[1]):
        return None
    tokens = torch.empty(x.shape[0], dtype=torch.int64)
    lps = torch.empty(x.shape[0], dtype=torch.float64) if logprobs else None
    ld = x.stride(0) if x.shape[0] > 1 else x.shape[1]
    rc = lib.ifl_row_stats(x.data_ptr(), x.shape[0], x.shape[1], ld, tokens.data_ptr(), _ptr(lps), torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"row_stats failed for {tuple(x.shape)} stride {x.stride()}")
    return tokens, lps


def row_argmax(x: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """`x.argmax(dim=-1)` as row_stats, or None."""
    got = row_stats(x, False, lib)
    return None if got is None else got[0]


def silu_mul(y: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor | None:
    """SiLU(gate) * up of a [gate; up] product y (..., 2 I) float32 on CPU, in C (one pass, vector
    exp); None where the kernels are off or absent, on the portable flavour (its scalar expf is
    slower than torch's vector silu), or y is not a contiguous float32 CPU tensor."""
    lib = lib or (_library() if enabled() and platform.current().quant_flavour() != "portable" else None)
    if lib is None or y.device.type != "cpu" or y.dtype != torch.float32 or not y.is_contiguous() or y.shape[-1] % 2:
        return None
    inter = y.shape[-1] // 2
    out = torch.empty(*y.shape[:-1], inter, dtype=torch.float32)
    if lib.ifl_silu_mul(y.data_ptr(), y.numel() // max(1, y.shape[-1]), inter, out.data_ptr(), torch.get_num_threads()) != 0:
        raise RuntimeError(f"silu_mul failed for {tuple(y.shape)}")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """(s, weight * s / sqrt(mean(s^2) + eps)) with s = x (+ residual), float32 CPU tensors (..., H),
    in C, one pass a row; None where the kernels are off, not loaded yet (a float model never
    builds them for this) or a tensor is not a contiguous float32 CPU one (the caller's torch
    path runs)."""
    lib = lib or (_library() if enabled() and library_asked(load) else None)
    if lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        return None
    h = x.shape[-1]
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.shape != (h,) or not weight.is_contiguous():
        return None
    if residual is not None and (residual.dtype != torch.float32 or residual.shape != x.shape or not residual.is_contiguous()):
        return None  # (a CPU x and a residual of its shape and dtype: the same device)
    s = x if residual is None else torch.empty_like(x)
    out = torch.empty_like(x)
    rc = lib.ifl_rms_norm(x.data_ptr(), _ptr(residual), weight.data_ptr(), x.numel() // max(1, h), h, eps,
                          _ptr(None if residual is None else s), out.data_ptr(), torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"rms_norm failed for {tuple(x.shape)}")
    return s, out


def quantize_q8_0(w: torch.Tensor, chunk_rows: int = 4096) -> QuantWeight:
    """A float (N, K) weight as Q8_0 blocks (llama.cpp's rounding), converted `chunk_rows` rows at
    a time (no full float32 copy of a bf16 weight). Raises KernelUnavailable without the kernels."""
    lib = _library()
    n, k = w.shape
    if lib is None or k % 32:
        raise KernelUnavailable(f"no Q8_0 quantizer for {tuple(w.shape)}")
    out = torch.empty(n, k // 32 * 34, dtype=torch.uint8)
    for start in range(0, n, chunk_rows):
        rows = w[start : start + chunk_rows].detach().to(torch.float32).contiguous()
        rc = lib.ifl_quantize_q8_0(rows.data_ptr(), rows.shape[0], k, out[start].data_ptr(), torch.get_num_threads())
        if rc != 0:
            raise RuntimeError(f"Q8_0 quantization failed ({rc})")
    return QuantWeight("q8_0", (n, k), out)


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()
