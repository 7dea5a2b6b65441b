"""Process memory of a long-running server: oneDNN's primitive caches and glibc's free lists.

Measured with benchmarks/soak.py (docs/OPERATIONS.md): with torch's defaults a served CPU
model's RSS keeps growing for many minutes. Python objects are not the cause (tracemalloc
over 1,200 requests: +0.03 MB). Two things are:

- oneDNN primitives. Every linear layer call with a new row count (each step's token count,
  1..max_num_batched_tokens) makes a GEMM primitive per weight shape, and two caches keep them:
  oneDNN's own (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, 1,024 by default) and ideep's, which torch's
  `mkldnn._linear_pointwise` uses and which holds references to oneDNN's
  (`LRU_CACHE_CAPACITY`, 1,024). At 4864 x 896 (Qwen2.5-0.5B's MLP) an entry costs ~1.3 MB;
  599 row counts of a 128 x 64 GEMM grew RSS by 412 MB with the defaults, by 7 MB with both
  capacities at 8 (one alone: 231 / 336 MB). `configure` bounds both (CACHE_CAPACITY). Both
  are read when the first oneDNN primitive is made (at weight packing), so they may be set
  after `import torch`; a value already in the environment is left alone.
- Freed memory glibc keeps. Tensors of varying size leave holes in malloc's heaps that are
  never handed back. `trim` (glibc `malloc_trim(0)`) returns the free pages of every arena to
  the kernel; the engine thread calls it when it goes idle and at most every TRIM_INTERVAL_S
  under load. Lowering `M_MMAP_THRESHOLD` instead (every tensor over it mmap'ed and unmapped)
  made a loop of small GEMMs 4.7x slower: not done.

Only glibc has `malloc_trim`; elsewhere (musl, macOS, Windows) `trim` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import time
from collections.abc import MutableMapping

logger = logging.getLogger(__name__)

# Entries each of the two oneDNN caches keeps. A step runs ~6 distinct GEMM shapes (q/k/v,
# o, gate, up, down, lm_head) at one row count, so 128 keeps ~20 recent row counts warm (decode
# batch sizes recur); a miss re-creates a primitive (~1 ms at 4864 x 896). Memory: <= 128 x ~1.3 MB.
CACHE_CAPACITY = 128
CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
# Under load: give freed pages back at most this often (a trim of a ~1 GB heap takes a few ms).
TRIM_INTERVAL_S = 10.0


def configure(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Bound oneDNN's primitive caches unless the environment already sets them. Call before
    the model loads (the CLI and the worker process entry do). Returns what it set."""
    env = os.environ if environ is None else environ
    set_now = {}
    for name in CACHE_ENV:
        if name not in env:
            env[name] = set_now[name] = str(CACHE_CAPACITY)
    return set_now


def _libc() -> ctypes.CDLL | None:
    """glibc, or None where malloc_trim does not exist."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def trim() -> bool:
    """Give malloc's free pages back to the kernel (glibc); False where there is no such call."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def trim_interval_s() -> float:
    """TRIM_INTERVAL_S, or `INFLIGHT_MALLOC_TRIM_S` from the environment (0: never trim)."""
    try:
        return max(0.0, float(os.environ.get("INFLIGHT_MALLOC_TRIM_S", TRIM_INTERVAL_S)))
    except ValueError:
        return TRIM_INTERVAL_S


class Trimmer:
    """When a process trims: after a step at most every `interval_s` while requests are live;
    once idle (after steps ran) at most once a second, so a server answering one request at a
    time trims once a second, not after each. Nothing where there is no malloc_trim or the
    interval is 0."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.interval_s = trim_interval_s() if interval_s is None else interval_s
        self.enabled = _LIBC is not None and self.interval_s > 0
        self.last = time.monotonic()
        self.num_trims = 0
        self.seconds = 0.0  # spent trimming, in total
        self.dirty = False  # steps ran since the last trim

    def after_step(self, busy: bool = True, now: float | None = None) -> bool:
        """Called after each step; `busy`: requests are still live. True if it trimmed."""
        self.dirty = True
        if not self.enabled:
            return False
        now = time.monotonic() if now is None else now
        if now - self.last < (self.interval_s if busy else min(1.0, self.interval_s)):
            return False
        start = time.perf_counter()
        trim()
        self.seconds += time.perf_counter() - start
        self.num_trims += 1
        self.last = now
        self.dirty = False
        return True

    def idle(self, now: float | None = None) -> bool:
        """Called while nothing is live: trims once if steps ran since the last trim."""
        return self.dirty and self.after_step(busy=False, now=now)
