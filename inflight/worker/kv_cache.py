"""Allocate the KV pool once, from a memory budget, and hand out per-layer views."""

from __future__ import annotations

import logging

import torch

from inflight.config import CacheConfig, ModelConfig

logger = logging.getLogger(__name__)

# Default CPU budget: a quarter of available memory, at most 4 GiB. 4 GiB holds
# ~340k tokens of a Qwen2.5-0.5B-shaped model in bf16 (12 KiB per token).
_CPU_FRACTION = 0.25
_CPU_MAX_BYTES = 4 << 30
_GPU_FRACTION = 0.85  # of free device memory after the weights are loaded


def bytes_per_block(model: ModelConfig, block_size: int, num_kv_heads: int | None = None) -> int:
    """`num_kv_heads`: the heads this rank keeps (tensor parallel), default all of them."""
    elem = torch.empty((), dtype=model.dtype).element_size()
    return 2 * model.num_layers * block_size * (num_kv_heads or model.num_kv_heads) * model.head_dim * elem


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * _GPU_FRACTION)
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        avail = info.get("MemAvailable", 8 << 30)
    except OSError:
        avail = 8 << 30
    return min(int(avail * _CPU_FRACTION), _CPU_MAX_BYTES)


def num_kv_blocks(
    model: ModelConfig, cache: CacheConfig, max_num_seqs: int = 64, num_kv_heads: int | None = None, sharers: int = 1,
    extra_bytes_per_block: int = 0,
) -> int:
    """Blocks that fit the budget, but no more than max_num_seqs full-length requests can use
    (a tiny model must not take gigabytes; +1 request's worth of headroom for prefix caching).
    Tensor parallel: `num_kv_heads` this rank keeps; `sharers` ranks split this machine's CPU
    memory budget (a GPU rank has its own device). `extra_bytes_per_block`: another pool laid
    out block for block like this one shares the budget (a draft model's, spec_decode/)."""
    if cache.num_blocks is not None:
        return cache.num_blocks
    budget = cache.kv_cache_memory_bytes or _available_bytes(model.device) // (sharers if model.device.type == "cpu" else 1)
    n = budget // (bytes_per_block(model, cache.block_size, num_kv_heads) + extra_bytes_per_block)
    per_request = -(-model.max_model_len // cache.block_size)
    if cache.kv_cache_memory_bytes is None:
        n = min(n, (max_num_seqs + 1) * per_request)
    if n < 2:
        raise ValueError(
            f"kv_cache_memory_bytes: {budget} bytes hold fewer than 2 blocks of "
            f"{bytes_per_block(model, cache.block_size, num_kv_heads)} bytes"
        )
    return int(n)


def allocate_kv_cache(
    model: ModelConfig, num_blocks: int, block_size: int, num_kv_heads: int | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The pool (layers, 2, KV, slots, hd) and one view per layer, (2, num_kv_heads,
    num_blocks * block_size, head_dim): K at [0], V at [1], gathered together. `num_kv_heads`:
    this rank's (tensor parallel), default all."""
    shape = (num_kv_heads or model.num_kv_heads, num_blocks * block_size, model.head_dim)
    pool = torch.zeros((model.num_layers, 2, *shape), dtype=model.dtype, device=model.device)
    logger.info(
        "KV cache: %d blocks x %d tokens, %.1f MiB", num_blocks, block_size, pool.numel() * pool.element_size() / 2**20
    )
    return pool, [pool[i] for i in range(model.num_layers)]
