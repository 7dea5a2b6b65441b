"""CUDA graphs of the decode step: a batch-1 step of an 8B model is ~500 kernel launches, which
eagerly cost more host time than the GPU needs to read the weights once.

At start-up the model's forward over an all-decode batch is captured once per batch size in
SIZES (up to max_num_seqs), all graphs sharing one memory pool, largest first. Inputs live in
persistent buffers that a step fills in place before replaying the smallest graph that holds its
rows; padding rows write nothing (slot -1) and attend to nothing (context length 0). Only the
Triton attention path is capturable (no per-step masks or host-side shapes); steps with a prefill
piece, prompt-embedding tables or more rows than the largest graph run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

# batch sizes captured (then max_num_seqs itself): a step pads to the next one. Dense at the small
# end, where a decode step is weight-bandwidth bound and padding rows are nearly free anyway.
SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# the attention backend's metadata of a decode step over the persistent buffers (query starts,
# context lengths, block tables, slots; the backend owns its type: models/triton_attention.py)
MakeMeta = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], Any]


class DecodeGraphs:
    def __init__(self, max_batch: int, max_blocks: int, block_size: int, device: torch.device) -> None:
        self.block_size = block_size
        self.sizes = sorted({s for s in SIZES if s < max_batch} | {max_batch})
        self.max_batch = max_batch
        n = max_batch
        i64 = {"dtype": torch.int64, "device": device}
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slots = torch.full((n,), -1, **i64)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        self.query_start = torch.arange(n + 1, dtype=torch.int32, device=device)  # one token per row
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0

    @classmethod
    @torch.inference_mode()
    def capture(
        cls,
        model: nn.Module,
        kv_caches: list[torch.Tensor],
        block_size: int,
        make_meta: MakeMeta,
        max_batch: int,
        max_blocks: int,
    ) -> DecodeGraphs:
        device = kv_caches[0].device
        self = cls(max_batch, max_blocks, block_size, device)
        t0 = time.perf_counter()
        pool = None
        for b in reversed(self.sizes):
            meta = make_meta(self.query_start[: b + 1], self.seq_lens[:b], self.block_table[:b], self.slots[:b])
            args = (self.input_ids[:b], self.positions[:b], kv_caches, meta)
            for _ in range(2):  # compiles the Triton kernels, sets up cuBLAS workspaces
                model(*args)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = model(*args)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize(device)
        logger.info(
            "CUDA graphs: %d decode batch sizes up to %d captured in %.1f s",
            len(self.sizes), max_batch, time.perf_counter() - t0,
        )  # fmt: skip
        return self

    def accepts(self, num_rows: int, decode_only: bool = True, embeds: bool = False, num_pieces: int = 1) -> bool:
        """Whether a graph replays a step of `num_rows` rows: one token per piece (`decode_only`),
        at most the largest captured size, none embedded from a prompt-embedding table."""
        return decode_only and not embeds and num_rows <= self.max_batch

    def forward(self, ids: list[int], positions: list[int], slots: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
        """Replay the smallest graph holding len(ids) decode rows. Returns (rows, hidden), a view
        of the graph's output buffer: valid until the next replay."""
        n = len(ids)
        seq_lens = [p + 1 for p in positions]  # each row attends to its context and itself
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        pad = b - n
        width = block_table.shape[1]  # the blocks of the longest row (shorter rows: stale after theirs)
        host = torch.tensor([ids + [0] * pad, positions + [0] * pad], dtype=torch.int64)
        self.input_ids[:b].copy_(host[0], non_blocking=True)
        self.positions[:b].copy_(host[1], non_blocking=True)
        self.slots[:n].copy_(slots, non_blocking=True)
        self.slots[n:b].fill_(-1)
        self.seq_lens[:b].copy_(torch.tensor(seq_lens + [0] * pad, dtype=torch.int32), non_blocking=True)
        self.block_table[:n, :width].copy_(block_table, non_blocking=True)
        self.graphs[b].replay()
        self.num_replays += 1
        return self.outputs[b][:n]

    def forward_steps(
        self, ids: list[int], positions: np.ndarray, slots: np.ndarray, block_table: np.ndarray,
        pick: Callable[[torch.Tensor, int], torch.Tensor],
    ) -> None:  # fmt: skip
        """Several decode passes over the same rows (worker/multistep.py): `positions` and `slots`
        (passes, rows) of every pass, `block_table` (rows, width) covering the last; pass 0 runs
        `ids`, pass i + 1 the (rows,) device tensor `pick(hidden, i)` returns for pass i, copied
        device-to-device into the graph's input: no host sync between passes."""
        n_steps, n = positions.shape
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        width = block_table.shape[1]
        dev = self.input_ids.device
        # every pass's positions, slots and context lengths in one host->device copy
        per_pass = torch.from_numpy(np.stack([positions, slots, positions + 1])).to(dev, non_blocking=True)  # (3, passes, rows)
        self.input_ids[:n].copy_(torch.tensor(ids, dtype=torch.int64), non_blocking=True)
        self.input_ids[n:b].zero_()
        self.positions[n:b].zero_()
        self.slots[n:b].fill_(-1)  # padding rows write nothing and attend to nothing
        self.seq_lens[n:b].zero_()
        self.block_table[:n, :width].copy_(torch.from_numpy(block_table), non_blocking=True)
        for i in range(n_steps):
            self.positions[:n].copy_(per_pass[0, i])
            self.slots[:n].copy_(per_pass[1, i])
            self.seq_lens[:n].copy_(per_pass[2, i])
            self.graphs[b].replay()
            self.num_replays += 1
            token = pick(self.outputs[b][:n], i)
            if i + 1 < n_steps:
                self.input_ids[:n].copy_(token)
