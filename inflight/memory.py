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
import mmap
import os
import platform
import time
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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


# ------------------------------------------------------------------ huge pages for the weights
# Decode streams every weight byte once a step. In 4 KiB pages that is a TLB miss and a page walk
# every 4 KiB of the stream; in the transparent huge pages (2 MiB) that Linux gives only to memory
# asked for them (`enabled` is `madvise` on most distributions, as on the Zen 4 VM of
# docs/QUANTIZATION.md), one every 2 MiB. Measured there, 2 threads, one process, two rounds in 4 KiB
# pages then its anonymous memory collapsed (batch-1 steps paired with a read probe in 4 KiB pages,
# ~34 GB/s): 0.5B Q8_0 18.1 / 17.5 -> 17.1 / 16.9 ms, Q4_K_M 13.8 / 13.6 -> 13.1 / 12.9 ms; a 525 MB
# x.sum() 32 -> 37 GB/s. numpy already advises its arrays over 4 MiB (a GGUF tensor's copy), so what
# this adds is the smaller tensors (a 0.5B model's) and everything else the model holds.
HUGE_PAGE = 2 << 20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <linux/mman.h>; COLLAPSE since Linux 6.1
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode() -> str:
    """The kernel's transparent huge page mode (always / madvise / never), "" where there is none."""
    try:
        with open(THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


def _thp_ok() -> bool:
    return _LIBC is not None and thp_mode() in ("always", "madvise") and os.environ.get("INFLIGHT_HUGE_PAGES", "1") != "0"


class WeightArena:
    """Weight bytes carved from 2 MiB-aligned anonymous mappings advised MADV_HUGEPAGE before their
    first touch, so the loader's copy faults in huge pages (no collapse, no second copy) and small
    tensors share them: a Qwen2.5-0.5B Q4_K_M file's 896-wide rows are ~0.5-3 MiB tensors, too
    small to hold a whole huge page of their own. Each slice is 64-byte aligned; a mapping is freed
    when no slice of it is left. Without THP, and for 4 MiB or more: plain torch.empty (a Llama-3-8B's
    fused layers from the arena cost 282 MiB of RSS, the heap's freed part copies no longer reused,
    and ~3 s of load in compaction at fault time, for nothing: huge_pages() collapses them in 0.1 s)."""

    CHUNK = 64 << 20

    def __init__(self) -> None:
        self._chunk: torch.Tensor | None = None
        self._used = 0

    def empty(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of `nbytes`."""
        import torch

        if not _thp_ok() or nbytes < 4096 or nbytes >= 2 * HUGE_PAGE:  # a large one: huge_pages() collapses it
            return torch.empty(nbytes, dtype=torch.uint8)
        step = -(-nbytes // 64) * 64
        if self._chunk is None or self._used + step > self._chunk.numel():
            size = max(self.CHUNK, -(-step // HUGE_PAGE) * HUGE_PAGE)
            mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared: shmem, no THP
            whole = torch.frombuffer(mm, dtype=torch.uint8)  # holds the mapping while a slice lives
            skip = -whole.data_ptr() % HUGE_PAGE
            _madvise(whole.data_ptr() + skip, size, MADV_HUGEPAGE)
            self._chunk, self._used = whole[skip : skip + size], 0
        out = self._chunk[self._used : self._used + nbytes]
        self._used += step
        return out

    def close(self) -> None:
        """Drop the open mapping (the end of a load): its slices keep it alive, nothing else."""
        self._chunk, self._used = None, 0


ARENA = WeightArena()


def _madvise(addr: int, size: int, advice: int) -> int:
    assert _LIBC is not None
    _LIBC.madvise.argtypes, _LIBC.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return int(_LIBC.madvise(addr, size, advice))


def huge_pages(tensors: Iterable[torch.Tensor], min_bytes: int = HUGE_PAGE) -> int:
    """Back the whole 2 MiB pages inside each CPU tensor of at least `min_bytes` with huge pages:
    madvise(MADV_HUGEPAGE), then MADV_COLLAPSE to move the bytes into them now (a copy, ~0.8 ms a
    MiB here) rather than when khugepaged gets to them. Returns the bytes collapsed. Nothing where
    the kernel has no THP, on `INFLIGHT_HUGE_PAGES=0`, or outside glibc Linux; a range the kernel
    cannot collapse (an old kernel, fragmented memory) keeps the MADV_HUGEPAGE hint only."""
    if not _thp_ok():
        return 0
    ranges = set()
    for t in tensors:
        size = t.numel() * t.element_size()
        if t.device.type != "cpu" or size < min_bytes or not t.is_contiguous():
            continue
        try:
            start = t.data_ptr()  # its own bytes: not all of a shared storage's
        except RuntimeError:  # a tensor without storage of its own (a wrapper subclass)
            continue
        lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, (start + size) // HUGE_PAGE * HUGE_PAGE
        if hi > lo:
            ranges.add((lo, hi))
    done = 0
    for lo, hi in sorted(ranges):
        if _madvise(lo, hi - lo, MADV_HUGEPAGE) == 0 and _madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
    return done


TRIM_EVERY = 128 << 20  # pack_into_huge_pages: bytes copied between two trims (Llama-3-8B Q4_K_M: 0.75 GB)


def pack_into_huge_pages(*roots: object, skip: Iterable[torch.Tensor] = (), max_bytes: int = 16 << 20) -> int:
    """Copy the storages of the tensors `roots` own that huge_pages() would leave mostly in 4 KiB
    pages (64 KiB .. max_bytes, under 90 % of their bytes in whole 2 MiB pages of their own) into
    one 2 MiB-aligned mapping advised MADV_HUGEPAGE, every view re-pointed (`set_`), the old
    storages freed one by one. Call it before anything keeps raw pointers to them (the decode
    kernel). The Qwen2.5-0.5B Q8_0 file's o_proj (0.8 MB a layer) were all in 4 KiB pages, its
    gate_up (9.2 MB) 25 % and down (4.6 MB) 43 %: 1-row GEMVs at 14, 24 and 24 GB/s a core
    against the lm_head's 29 (benchmarks/decode_breakdown.py, Zen 4, 2 threads). Returns bytes."""
    import torch

    if not _thp_ok():
        return 0
    pools = {_storage_ptr(t) for t in skip}
    views: dict[int, dict[int, torch.Tensor]] = {}  # storage -> its views, each once
    for t in owned_tensors(*(r for r in roots if r is not None)):
        if t.device.type == "cpu" and (p := _storage_ptr(t)) is not None and p not in pools and not t.is_sparse:
            group = views.setdefault(p, {})
            group[id(t)] = t
            if t._base is not None:  # a view holds its base, and the base the old storage
                group[id(t._base)] = t._base
    picked = []
    for p, group in views.items():
        ts = list(group.values())
        n = ts[0].untyped_storage().nbytes()
        whole = max(0, (p + n) // HUGE_PAGE * HUGE_PAGE - -(-p // HUGE_PAGE) * HUGE_PAGE)
        if 64 << 10 <= n <= max_bytes and whole < 0.9 * n:
            picked.append(ts)
    total = sum(-(-ts[0].untyped_storage().nbytes() // 64) * 64 for ts in picked)
    if not total:
        return 0
    size = -(-total // HUGE_PAGE) * HUGE_PAGE
    mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    # its storage the aligned whole pages (so a second call finds them covered); holds the mapping
    arena = torch.frombuffer(mm, dtype=torch.uint8, offset=-base % HUGE_PAGE, count=size)
    _madvise(arena.data_ptr(), size, MADV_HUGEPAGE)
    at = 0
    with torch.inference_mode():  # set_ on inference tensors (the loader's)
        for ts in picked:
            old = ts[0].untyped_storage()
            n = old.nbytes()
            arena[at : at + n].copy_(torch.empty(0, dtype=torch.uint8).set_(old, 0, (n,)))
            for t, off, shape, stride in [(t, t.storage_offset(), t.size(), t.stride()) for t in ts]:
                t.set_(arena.untyped_storage(), at // t.element_size() + off, shape, stride)
            del old
            if (at + n) // TRIM_EVERY > at // TRIM_EVERY:
                trim()  # the old storages' pages, as we go: the peak stays ~TRIM_EVERY above the start
            at += -(-n // 64) * 64
    trim()
    return total


def owned_tensors(*roots: object, depth: int = 16) -> list[torch.Tensor]:
    """The tensors reachable from `roots` through modules (parameters, buffers, attributes), lists,
    tuples, dicts, dataclasses and inflight's own objects: a model's weights wherever its layers
    keep them (quantized blocks, packed copies, the decode kernel's own)."""
    import torch

    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(obj: object, left: int) -> None:
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), obj)
            return
        if left == 0 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            items: Iterable[object] = obj
        elif isinstance(obj, dict):
            items = obj.values()
        elif isinstance(obj, torch.nn.Module):  # its tensors a level down, not under its dicts'
            items = [*obj._parameters.values(), *obj._buffers.values(), *obj._modules.values(), *vars(obj).values()]
        elif type(obj).__module__.startswith("inflight.") and hasattr(obj, "__dict__"):
            items = vars(obj).values()
        else:
            return
        for item in items:
            walk(item, left - 1)

    for root in roots:
        walk(root, depth)
    return list(found.values())


def _storage_ptr(t: torch.Tensor) -> int | None:
    """Where t's storage starts; None for a tensor without one (oneDNN's opaque packed weights)."""
    try:
        return t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return None


def weights_in_huge_pages(*roots: object, skip: Iterable[torch.Tensor] = ()) -> int:
    """huge_pages() over the tensors `roots` own (a model, its decode kernel, a draft), logged; not
    over those sharing storage with `skip` (the KV pool: a copy of gigabytes at start-up, and its
    blocks are read a few KiB at a time, where 4 KiB pages cost little)."""
    start = time.perf_counter()
    pools = {_storage_ptr(t) for t in skip}
    owned = owned_tensors(*(r for r in roots if r is not None))
    done = huge_pages(t for t in owned if _storage_ptr(t) not in pools)
    if done:
        logger.info("weights: %.0f MiB in 2 MiB pages (%.2f s)", done / 2**20, time.perf_counter() - start)
    return done
