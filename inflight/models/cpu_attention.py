"""The decode rows' attention in C on CPU (inflight/csrc/attention_kernels.c): every single-token
row of a step attends to its context straight from the paged float32 KV cache, one task per (row,
KV head), instead of attention.py's gather of whole blocks into a padded copy and two batched
matmuls. At 32 rows x ~200 positions (Qwen2.5-0.5B shape, Zen 4, 2 threads) that torch path cost
~1.3 ms a layer, 30 of a 220 ms Q8_0 decode step (attention_kernels.c has the figures).

Built like the quantized kernels: the system compiler on first use, cached, in the flavour
inflight/platform.py picks (AVX-512, AVX2 + FMA; the portable C build is tested but not used).
Where it cannot run (no compiler, a portable CPU, a bf16 cache, a head too large for its buffers)
attention.py's torch path runs; tests check the two agree for every flavour this CPU runs.
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

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "attention_kernels.c"
ABI_VERSION = 1
_PATH = {"portable": 0, "avx2": 1, "avxvnni": 1, "avx512vnni": 2}  # ifl_attn_path() of each flavour
MAX_HEAD_DIM, MAX_GROUP, MAX_BLOCK = 256, 32, 128  # attention_kernels.c's IFLA_MAX_*


@functools.cache
def load(flavour: str | None = None) -> ctypes.CDLL:
    """The loaded library of `flavour` (default: the platform's pick); raises KernelUnavailable."""
    flavour = flavour or platform.current().quant_flavour()
    if not platform.current().can_run_quant(flavour):
        raise KernelUnavailable(f"attention kernel {flavour} is not runnable on this CPU")
    flags = quant_compile_flags(flavour)
    path = str(compile_cached(SOURCE, f"attn-{flavour}", flags))
    lib = open_checked(Path(path), ("ifl_attn_abi_version", "ifl_attn_path"), (ABI_VERSION, _PATH[flavour]))
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.ifl_decode_attention.argtypes = [i, i, i, i, i, p, p, i64, p, i64, p, i, ctypes.c_float, p, i]
    return lib


def _library() -> ctypes.CDLL | None:
    """The platform flavour's library; none on the portable flavour, whose scalar exp and dots
    are slower than the torch path (32 rows x 200 positions, Zen 4, 2 threads: 3.7 vs 1.7 ms)."""
    flavour = platform.current().quant_flavour()
    return None if flavour == "portable" else platform_library(load, flavour, "C decode attention")


def supports(q: torch.Tensor, kv_cache: torch.Tensor, block_size: int) -> bool:
    """Whether the C kernel takes these decode rows (independent of the machine)."""
    num_heads, num_kv, hd = q.shape[1], kv_cache.shape[1], q.shape[2]
    return (
        q.device.type == "cpu"
        and q.dtype == kv_cache.dtype == torch.float32
        and kv_cache.is_contiguous()
        and num_heads % num_kv == 0
        and num_heads // num_kv <= MAX_GROUP
        and hd <= MAX_HEAD_DIM
        and block_size <= MAX_BLOCK
    )


def available(q: torch.Tensor, kv_cache: torch.Tensor, block_size: int) -> bool:
    return supports(q, kv_cache, block_size) and _library() is not None


def decode_attention(
    q: torch.Tensor,  # (D, H, hd)
    kv_cache: torch.Tensor,  # (2, KV, slots, hd)
    blocks: torch.Tensor,  # (D, >= max blocks) int64 block table
    context_lens: torch.Tensor,  # (D,) int64: positions each row attends, its own included
    block_size: int,
    window: int | None,
    scale: float,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """(D, H, hd): each row's softmax(q K^T * scale) V over its last `window` (or all) positions.
    Call only where `available(...)` (or with a given flavour's `lib`, tests)."""
    lib = lib or _library()
    if lib is None:
        raise KernelUnavailable("no C decode attention")
    d, num_heads, hd = q.shape
    q = q.contiguous()
    blocks = blocks.to(torch.int64)
    if blocks.stride(-1) != 1:
        blocks = blocks.contiguous()
    lens = context_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    rc = lib.ifl_decode_attention(
        d, num_heads, kv_cache.shape[1], hd, block_size, q.data_ptr(), kv_cache.data_ptr(), kv_cache.shape[2],
        blocks.data_ptr(), blocks.stride(0), lens.data_ptr(), window or 0, scale, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"decode attention failed ({rc}) for q {tuple(q.shape)}, cache {tuple(kv_cache.shape)}")
    return out
