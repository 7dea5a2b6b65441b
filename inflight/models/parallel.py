"""Tensor parallelism as the model sees it: this rank's place in the group and its collectives.

The worker (worker/distributed.py) builds one `TensorParallel` per rank once the
torch.distributed process group is up (gloo on CPU, nccl on CUDA) and hands it to the model,
which sizes its layers by it (Megatron-style):

  embedding      vocab-parallel: rank r holds rows [r * V/N, (r+1) * V/N) (V padded up to a
                 multiple of N); ids outside its range embed to 0; one all-reduce
  q/k/v, gate/up column-parallel: rank r holds heads [r * H/N, ...) and intermediate rows
                 [r * I/N, ...); no communication
  o_proj, down   row-parallel: rank r holds the matching input columns; one all-reduce each

A quantized down_proj stores its input columns in blocks (`down_block`: a GGML block, an int4
group): the intermediate rows are then dealt in whole blocks, unevenly where I/N would cut one
(`block_share`; gate/up's rows and down_proj's columns alike, so nothing else changes).
  lm_head        column-parallel over the (padded) vocabulary; the logits are all-gathered

KV heads: with num_kv_heads >= N each rank holds KV/N of them; with num_kv_heads < N (and N a
multiple of it) each KV head is replicated on N / KV ranks, rank r holding head r * KV // N, as
vLLM does. `TensorParallel.single()` (N = 1) makes every collective a no-op: the same model code
runs unsharded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from inflight.checkpoint import block_shares


@dataclass(frozen=True)
class TensorParallel:
    rank: int
    size: int
    group: Any = None  # the torch.distributed process group of the model's collectives
    # the block down_proj's input columns are stored in (elements; the loader sets it from a
    # quantized checkpoint, Checkpoint.row_blocks): 1 for float weights
    down_block: int = 1

    @classmethod
    def single(cls) -> TensorParallel:
        return cls(0, 1)

    def split(self, total: int, what: str) -> int:
        """This rank's share of `total` (heads, intermediate rows); an indivisible count is an
        error naming `what` and the sizes that would work."""
        if total % self.size:
            ok = [n for n in range(1, total + 1) if total % n == 0]
            raise ValueError(
                f"tensor_parallel_size: {self.size} does not divide {what} ({total}); use one of {ok}"
            )
        return total // self.size

    def block_share(self, total: int, what: str) -> tuple[int, int]:
        """(size, first) of this rank's share of `total` intermediate rows: `split` for float
        weights, else whole `down_block`s (checkpoint.block_shares; Checkpoint.check_shards refused
        the rest at start-up)."""
        if self.down_block == 1:
            size = self.split(total, what)
            return size, self.rank * size
        shares = block_shares(total, self.down_block, self.size)
        if shares is None:
            raise ValueError(f"tensor_parallel_size: {self.size} ranks cannot share {what} ({total}) in whole "
                             f"blocks of {self.down_block}")  # fmt: skip
        return shares[self.rank], sum(shares[: self.rank])

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(this rank's KV heads, the first of them in the checkpoint): split when there are at
        least as many as ranks, else replicated (N must then be a multiple of num_kv_heads)."""
        if num_kv_heads >= self.size:
            local = self.split(num_kv_heads, "num_key_value_heads")
            return local, self.rank * local
        if self.size % num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size: {self.size} ranks cannot share {num_kv_heads} KV heads "
                f"(replication needs a multiple of num_key_value_heads)"
            )
        return 1, self.rank * num_kv_heads // self.size

    def padded_share(self, total: int) -> tuple[int, int]:
        """(rows per rank, this rank's first row) of `total` rows padded up to a multiple of N
        (the vocabulary: padding rows are zeros and their logits are cut off)."""
        per_rank = -(-total // self.size)
        return per_rank, self.rank * per_rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (row-parallel outputs, the vocab-parallel embedding)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` (T, n) side by side: (T, N * n), rank order (column-parallel logits)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
