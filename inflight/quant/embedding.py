"""`QuantEmbedding`: a token embedding kept as the checkpoint's quantized rows (a GGUF's token_embd).

A lookup dequantizes only the rows its ids name (each distinct id once), so the table never
exists in float: Llama-3-8B's 128256 x 4096 embedding is 532 MB as Q4_K instead of 2.1 GB in
float32 (1.05 GB bf16). A tied lm_head multiplies by the same `QuantWeight` (quant/formats.py
gives it the embedding's object: one copy of the bytes). `weight` stays a (0, hidden) parameter:
it carries the model's dtype through `model.to(dtype)` for the code that asks it, and holds no
rows, so nothing may read rows from it (the fused decode kernel embeds through `lookup_rows`,
models/cpu_kernel.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from inflight.models.layers import VocabEmbedding
from inflight.quant import kernels
from inflight.quant.weight import QuantWeight, dequantize


def take_rows(qw: QuantWeight, rows: torch.Tensor) -> QuantWeight:
    """The weight's rows `rows` (int64 indices), in that order."""
    pick = lambda t: None if t is None or t.shape[0] == 1 else t.index_select(0, rows)  # noqa: E731
    scales = qw.scales if qw.scales is not None and qw.scales.shape[0] == 1 else pick(qw.scales)
    return QuantWeight(qw.qtype, (rows.numel(), qw.shape[1]), pick(qw.data), scales, pick(qw.zeros),  # type: ignore[arg-type]
                       qw.group_size, qw.perm, qw.act_int8)  # fmt: skip


class QuantEmbedding(VocabEmbedding):
    """VocabEmbedding (vocab-parallel rows, padding rows zero) over a `QuantWeight`."""

    qweight: QuantWeight | None

    @classmethod
    def replacing(cls, old: VocabEmbedding) -> QuantEmbedding:
        """A quantized embedding in place of a (meta) float one of the same shape and ranks."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.tp, new.rows, new.vocab_start, new.hidden = old.tp, old.rows, old.vocab_start, old.weight.shape[1]
        new.weight = nn.Parameter(torch.empty(0, new.hidden, device=old.weight.device))
        new.qweight = None
        return new

    def load(self, param: str, tensor: Any, shard: str | None = None) -> None:
        """This rank's rows of the checkpoint's table, as the file's blocks; padding rows zeros."""
        from inflight.quant.linear import pad_rows

        size = max(0, min(self.rows, tensor.shape[0] - self.vocab_start))
        self.qweight = pad_rows(tensor.read_quant(0, self.vocab_start, size), self.rows)

    def lookup_rows(self, local: torch.Tensor) -> torch.Tensor:
        """(T,) local row ids -> (T, hidden) in the model's dtype, dequantizing each distinct row once."""
        assert self.qweight is not None, "QuantEmbedding used before loading"
        uniq, inverse = torch.unique(local.reshape(-1).cpu(), return_inverse=True)
        rows = kernels.dequantize_rows(self.qweight, uniq)  # C: ~1 us a row, not gguf-py's ~70 us
        if rows is None:
            rows = dequantize(take_rows(self.qweight, uniq))  # (U, hidden) float32
        return rows.index_select(0, inverse).to(device=self.weight.device, dtype=self.weight.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.lookup_rows(ids).reshape(*ids.shape, self.hidden)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows)
        x = self.lookup_rows(local.masked_fill(outside, 0)).reshape(*ids.shape, self.hidden)
        return self.tp.all_reduce(x.masked_fill(outside.unsqueeze(-1), 0))
