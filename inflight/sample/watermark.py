"""Green-list watermarking (Kirchenbauer et al., 2023) and its detector.

At each step the vocabulary is split by a keyed hash of (previous token, candidate
token): a `gamma` fraction is "green" and gets `delta` added to its logit. Text
written that way holds far more green tokens than chance; the detector counts
them and returns the z-score of that count against the gamma * T expected.

The hash is integer arithmetic on int64 tensors (wrapping on overflow, the same
on every device), so the processor marks a whole (B, V) vocabulary in a few
vectorized ops, and the detector recomputes it exactly for (prev, token) pairs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

GAMMA = 0.25  # green fraction of the vocabulary
DELTA = 2.0  # logit bias of green tokens
KEY = 15485863  # hash key: detection needs the same key as generation

_M1, _M2, _M3 = 0x9E3779B1, 0x85EBCA77, 0x2C1B3C6D  # odd mixing constants (golden ratio, murmur3)
_SCALE = 1 << 16


def _is_green(prev: torch.Tensor, tok: torch.Tensor, gamma: float, key: int) -> torch.Tensor:
    """Broadcasting (prev, tok) -> bool: tok is in prev's green list."""
    h = prev * _M1 + tok * _M2 + key
    h = h ^ (h >> 15)
    h = h * _M3
    h = h ^ (h >> 12)
    return (h & (_SCALE - 1)) < int(gamma * _SCALE)


def green_mask(prev: torch.Tensor, vocab_size: int, gamma: float = GAMMA, key: int = KEY) -> torch.Tensor:
    """(B,) previous tokens -> (B, V) bool green lists."""
    tok = torch.arange(vocab_size, dtype=torch.int64, device=prev.device)
    return _is_green(prev.to(torch.int64)[:, None], tok[None, :], gamma, key)


def watermark_processor(reqs: list[Any], device: torch.device, vocab_size: int):  # type: ignore[no-untyped-def]
    """Add DELTA to the green tokens of rows that asked for a watermark; None when none did."""
    rows = [i for i, r in enumerate(reqs) if r.params.watermark]
    if not rows:
        return None
    row_t = torch.tensor(rows, device=device)
    prev = torch.tensor([reqs[i].all_token_ids[-1] for i in rows], device=device)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        green = green_mask(prev, logits.shape[-1])
        logits[row_t] += green.to(logits.dtype) * DELTA
        return logits

    return apply


def watermark_z_score(token_ids: list[int], gamma: float = GAMMA, key: int = KEY) -> float:
    """z-score of the green-token count of a token sequence (the first token has no context).


    Around 0 for ordinary text; watermarked text of a few hundred tokens scores well above 4.
    """
    # Each distinct (prev, token) pair counts once: repeated phrases would otherwise count one
    # green pair many times and break the independence the z-test assumes (ordinary text with
    # repeated phrases scored ~2.8 with every pair counted).
    pairs = sorted(set(zip(token_ids, token_ids[1:])))
    if not pairs:
        return 0.0
    prev, tok = torch.tensor(pairs, dtype=torch.int64).T
    hits = int(_is_green(prev, tok, gamma, key).sum())
    n = len(pairs)
    return (hits - gamma * n) / math.sqrt(n * gamma * (1 - gamma))


def detect_watermark(text: str, tokenizer: Any, gamma: float = GAMMA, key: int = KEY) -> float:
    """watermark_z_score of a text, tokenized without special tokens."""
    return watermark_z_score(list(tokenizer.encode(text, add_special_tokens=False)), gamma, key)
