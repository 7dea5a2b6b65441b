"""CPU decode kernel: a whole small-batch bfloat16 decode step in one C call.

At batch 1 a decode step through PyTorch spends ~230 us per layer outside the GEMVs
(dispatch, allocation, Python; ~5.5 ms of a 29 ms Qwen2.5-0.5B step) and each oneDNN GEMV
call has a fixed cost that the small q/k/v and o projections feel most. inflight/csrc/
decode_kernel.c runs embedding -> layers -> final norm in one OpenMP parallel region with
AVX512-BF16 GEMVs over the plain (N, K) weights, and the lm_head GEMV in a second call.

The library is compiled on first use with the system C compiler (gcc -O3 -march=native
-fopenmp, ~1 s) into ~/.cache/inflight (or $INFLIGHT_CACHE_DIR) and loaded with ctypes;
it resolves libgomp to the copy torch already loaded, so it shares torch's thread team
(a second OpenMP runtime would oversubscribe the cores; see docs/ARCHITECTURE.md).
No compiler, a model that is not bfloat16, or INFLIGHT_CPU_KERNEL=0: the PyTorch path
runs, unchanged.

The kernel needs plain weights next to oneDNN's packed copies (the packed layout is opaque),
so `keep_plain_weights` decides at load time whether that extra memory is affordable; the
loader then keeps them as `plain_weight` (cpu_linear.pack_for_cpu).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "decode_kernel.c"
ABI_VERSION = 1
# Decode steps of at most this many rows take the kernel. Measured (Qwen2.5-0.5B shape, bf16,
# 2 threads, one step): 1 row 22.0 vs 28.0 ms eager; 2 rows 32.9 vs 30.9; 4 rows 37.7 vs 30.4
# (the multi-row GEMV and the scalar attention loop are not tuned yet), so batch 1 only. The kernel
# computes any row count correctly (tests run it at 3 and 4 rows).
MAX_ROWS = 1
# Keep plain weights (the kernel's) beside the packed ones only while they take at most this
# share of the memory available after loading.
_PLAIN_MEMORY_SHARE = 0.25

_CFG = ("hidden", "heads", "kv_heads", "head_dim", "rot_dim", "inter", "layers", "qk_norm",
        "block_size", "slots", "window", "vocab")  # fmt: skip  # order of the C enum C_*
_LAYER_PTRS = 13  # L_N in the C source
_P = ctypes.c_void_p


def enabled() -> bool:
    return os.environ.get("INFLIGHT_CPU_KERNEL", "1").lower() not in ("0", "false", "no", "off")


def _cache_dir() -> Path:
    root = os.environ.get("INFLIGHT_CACHE_DIR") or Path.home() / ".cache" / "inflight"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """The compile targets this CPU (-march=native): its flags are part of the cache key."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return platform.machine() + flags


def _compile(compiler: str, out: Path, march: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [compiler, "-O3", f"-march={march}", "-fopenmp", "-fPIC", "-shared", "-std=gnu11",
           str(SOURCE), "-o", tmp, "-lm"]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        os.replace(tmp, out)  # atomic: concurrent builders (test workers) race harmlessly
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load_library(march: str = "native") -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None when it cannot be built or is disabled.

    `march` is the gcc target: "native" in service; tests also build a portable one
    ("x86-64-v2": no AVX512-BF16) to run the plain-C code paths."""
    if not enabled():
        return None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not SOURCE.exists():
        logger.info("CPU decode kernel: no C compiler; the PyTorch path runs")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256(SOURCE.read_bytes() + (version + march + _cpu_signature()).encode()).hexdigest()[:16]
        path = _cache_dir() / f"decode-{key}.so"
        if not path.exists():
            _compile(compiler, path, march)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or e
        logger.warning("CPU decode kernel unavailable (%s); the PyTorch path runs", str(detail)[:500])
        return None
    if lib.ifl_abi_version() != ABI_VERSION:
        logger.warning("CPU decode kernel: ABI mismatch; the PyTorch path runs")
        return None
    lib.ifl_decode_step.argtypes = [_P, _P, _P, _P, ctypes.c_int, _P, _P, _P, _P, ctypes.c_int, _P, ctypes.c_int]
    lib.ifl_logits.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int]
    logger.info("CPU decode kernel loaded from %s (AVX512-BF16: %s)", path, bool(lib.ifl_uses_avx512bf16()))
    return lib


def _linear_bytes(model: nn.Module) -> int:
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if isinstance(m, nn.Linear) and m.weight is not None)  # fmt: skip


def keep_plain_weights(model: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the loader keeps plain weights beside oneDNN's packed ones, for this kernel."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not hasattr(model, "spec"):
        return False
    if load_library() is None:
        return False
    extra = _linear_bytes(model)
    try:
        with open("/proc/meminfo") as f:
            avail = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}["MemAvailable"]
    except (OSError, KeyError):
        return False
    if extra > _PLAIN_MEMORY_SHARE * avail:
        logger.info("CPU decode kernel off: plain weights (%.1f GiB) would take over %d%% of free memory",
                    extra / 2**30, int(_PLAIN_MEMORY_SHARE * 100))  # fmt: skip
        return False
    return True


def _plain(layer: nn.Linear) -> torch.Tensor | None:
    """The weight in its checkpoint (N, K) layout: the loader's plain copy when it packed for oneDNN."""
    plain = getattr(layer, "plain_weight", None)
    return plain if plain is not None else layer.weight


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class DecodeKernel:
    """Binds one loaded model and its KV cache to the C kernel."""

    def __init__(self, lib: ctypes.CDLL, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int) -> None:
        self.lib = lib
        self.max_rows = MAX_ROWS
        spec = model.spec  # type: ignore[attr-defined]
        inner = model.model  # type: ignore[attr-defined]
        rotary = inner.rotary
        self._keep: list[torch.Tensor] = []  # everything whose pointer C holds
        values = {
            "hidden": spec.hidden, "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "rot_dim": rotary.rot_dim, "inter": spec.intermediate,
            "layers": spec.num_layers, "qk_norm": int(spec.qk_norm), "block_size": block_size,
            "slots": kv_caches[0].shape[2], "window": spec.sliding_window or 0, "vocab": spec.vocab_size,
        }  # fmt: skip
        self.cfg = torch.tensor([values[k] for k in _CFG], dtype=torch.int64)
        self.fcfg = torch.tensor([spec.eps, spec.head_dim**-0.5], dtype=torch.float64)
        rows = []
        for layer, kv in zip(inner.layers, kv_caches):
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            tensors = [
                layer.input_layernorm.weight, _plain(attn.qkv_proj), attn.qkv_proj.bias,
                q_norm.weight if q_norm is not None else None, k_norm.weight if k_norm is not None else None,
                _plain(attn.o_proj), attn.o_proj.bias, layer.post_attention_layernorm.weight,
                _plain(mlp.gate_up_proj), mlp.gate_up_proj.bias, _plain(mlp.down_proj), mlp.down_proj.bias, kv,
            ]  # fmt: skip  # order of the C enum L_*
            rows.append([_ptr(self._check(t)) for t in tensors])
        self.layer_ptrs = torch.tensor(rows, dtype=torch.int64)
        assert self.layer_ptrs.shape[1] == _LAYER_PTRS
        cos = rotary.cos.to(torch.bfloat16).contiguous()  # the eager path rounds the same table per step
        sin = rotary.sin.to(torch.bfloat16).contiguous()
        glob = [inner.embed_tokens.weight, inner.norm.weight, cos, sin]
        self.global_ptrs = torch.tensor([_ptr(self._check(t)) for t in glob], dtype=torch.int64)
        lm = model.tied_lm_head_weight() if spec.tie_embeddings else _plain(model.lm_head)  # type: ignore[operator,arg-type]
        self.lm_head = self._check(lm)
        self.hidden, self.vocab, self.block_size = spec.hidden, spec.vocab_size, block_size

    def _check(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        if t.dtype != torch.bfloat16 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"decode kernel: tensor {tuple(t.shape)} {t.dtype} is not contiguous CPU bfloat16")
        self._keep.append(t)
        return t

    @classmethod
    def build(
        cls, model: nn.Module, kv_caches: list[torch.Tensor], block_size: int, lib: ctypes.CDLL | None = None
    ) -> DecodeKernel | None:
        lib = lib or load_library()
        if lib is None or not hasattr(model, "spec"):
            return None
        layers = model.model.layers  # type: ignore[attr-defined,union-attr]
        if any(getattr(layer.mlp.down_proj, "plain_weight", None) is None for layer in layers):
            return None  # the loader kept no plain weights
        try:
            return cls(lib, model, kv_caches, block_size)
        except ValueError as e:
            logger.info("CPU decode kernel off: %s", e)
            return None

    def forward(self, ids: list[int], positions: list[int], slots: list[int], block_ids: list[list[int]]) -> torch.Tensor:
        """Final-normed hidden states (M, hidden) of M decode rows; writes their K/V."""
        m = len(ids)
        width = max(-(-(p + 1) // self.block_size) for p in positions)
        table = torch.tensor([(b + [0] * width)[:width] for b in block_ids], dtype=torch.int64)
        args = torch.tensor([ids, positions, slots], dtype=torch.int64)
        out = torch.empty(m, self.hidden, dtype=torch.bfloat16)
        rc = self.lib.ifl_decode_step(
            self.cfg.data_ptr(), self.fcfg.data_ptr(), self.layer_ptrs.data_ptr(), self.global_ptrs.data_ptr(), m,
            args[0].data_ptr(), args[1].data_ptr(), args[2].data_ptr(), table.data_ptr(), width,
            out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"decode kernel failed ({rc})")
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, hidden) bf16 -> (M, vocab) float32, rounded through bf16 like the eager lm_head."""
        hidden = hidden.contiguous()
        out = torch.empty(hidden.shape[0], self.vocab, dtype=torch.float32)
        rc = self.lib.ifl_logits(self.lm_head.data_ptr(), hidden.data_ptr(), hidden.shape[0], self.vocab,
                                 self.hidden, out.data_ptr(), torch.get_num_threads())  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"decode kernel logits failed ({rc})")
        return out

