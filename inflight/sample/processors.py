"""Logits processors: batched edits of the (B, V) logits before sampling.

Each is built once per step from the rows that need it and applied in place;
rows that don't use a control cost nothing. The decoding-controls issue adds
penalties, biases and banned words here.
"""

from __future__ import annotations

import torch

from inflight.request import Request


def min_tokens_ban(reqs: list[Request], device: torch.device):  # type: ignore[no-untyped-def]
    """Ban EOS and stop ids for rows that have fewer than `min_tokens` output tokens.

    Returns a processor, or None when no row needs it.
    """
    rows: list[int] = []
    cols: list[int] = []
    for row, r in enumerate(reqs):
        p = r.params
        if r.num_output_tokens >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids)
        if not p.ignore_eos:
            banned.update((p.end_id,) if p.end_id is not None else r.eos_token_ids)
        rows.extend([row] * len(banned))
        cols.extend(banned)
    if not rows:
        return None
    index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))

    def apply(logits: torch.Tensor) -> torch.Tensor:
        logits[index] = float("-inf")
        return logits

    return apply
