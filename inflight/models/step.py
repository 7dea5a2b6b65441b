"""StepBatch: one step's flat batch, the one object everything that runs a step reads.

Built once per step by the runner from its persistent batch (worker/input_batch.py): the tokens,
their rotary positions, their cache slots, the pieces' block tables, and what the step's features
add (a p-tuning table's or an image's input embeddings, M-RoPE positions, LoRA slots per token).
The attention backend adds its metadata (`attn`, models/attention.py `build_metadata`); the model,
LoRA, the fast paths (CUDA graphs, the CPU decode kernel) read the rest. A new per-step input is a
field here, set by its builder: the runner's forward stays the same.

Flat-batch order: single-token pieces (decodes) first, then prefill pieces one after another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepBatch:
    token_ids: list[int]  # (T) the tokens the step runs
    positions: list[int]  # (T) each token's rotary index (its position; after an image: + the M-RoPE delta)
    query_lens: list[int]  # (S) tokens of each piece
    context_lens: list[int]  # (S) tokens each piece's last query sees: earlier context + the piece
    slots: torch.Tensor  # (T,) int64, on the device: the cache slot of every token
    block_table: torch.Tensor  # (S, width) int32, CPU: each piece's blocks (stale past its context)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # input_ids' and position_ids'
    inputs_embeds: torch.Tensor | None = None  # (T, hidden): p-tuning tables, images (None: embed the ids)
    lora_slots: list[int] | None = None  # (T) the LoRA slot of each token's row; None: base model only
    # what the fast paths run: base weights, token embeddings, rotary index = position (they take
    # context length = position + 1); the builder says
    plain: bool = True
    attn: Any = None  # the attention backend's metadata for this step
    # input_ids / position_ids, made on first read: the CPU decode kernel reads the lists (two
    # torch.tensor calls cost ~50 us of a batch-1 step there, cache-cold after the previous step)
    _input_ids: torch.Tensor | None = field(default=None, repr=False)
    _position_ids: torch.Tensor | None = field(default=None, repr=False)

    @property
    def input_ids(self) -> torch.Tensor:
        """(T,) int64, on the device (ids >= vocab clamped when embeddings replace them)."""
        if self._input_ids is None:
            self._input_ids = torch.tensor(self.token_ids, dtype=torch.int64, device=self.device)
        return self._input_ids

    @input_ids.setter
    def input_ids(self, ids: torch.Tensor) -> None:
        self._input_ids = ids

    @property
    def position_ids(self) -> torch.Tensor:
        """(T,) rotary index, or (3, T) M-RoPE positions, on the device."""
        if self._position_ids is None:
            self._position_ids = torch.tensor(self.positions, dtype=torch.int64, device=self.device)
        return self._position_ids

    @position_ids.setter
    def position_ids(self, positions: torch.Tensor) -> None:
        self._position_ids = positions

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_decodes(self) -> int:
        """Single-token pieces, which come first."""
        return next((i for i, n in enumerate(self.query_lens) if n > 1), len(self.query_lens))

    @property
    def decode_only(self) -> bool:
        return self.num_tokens == len(self.query_lens)

    def row_block_table(self) -> torch.Tensor:
        """(T, width) int32: each token's piece's row of `block_table` (the per-row table of the
        fast paths, which take any step as rows of position + 1 context each)."""
        if self.decode_only:
            return self.block_table
        lens = torch.tensor(self.query_lens)
        return self.block_table.repeat_interleave(lens, dim=0)
