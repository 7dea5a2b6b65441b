"""The warpers of HF's beam *sampling*, on each beam's log-probs after the temperature.

HF keeps at least `min_keep` tokens per row in beam searches (1 + the number of EOS ids, at
least 2: a beam must have a candidate that does not end it), which the sampler's warpers
(sampler.py, min_keep 1) don't, so beams use these. Each follows transformers'
TopK / TopP / MinP / TypicalLogitsWarper step for step (same sorts, so the same ties).
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def _unsort(remove_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return remove_sorted.scatter(1, order, remove_sorted)


def top_k(scores: torch.Tensor, k: int, min_keep: int) -> torch.Tensor:
    k = min(max(k, min_keep), scores.shape[-1])
    kth = torch.topk(scores, k)[0][..., -1, None]
    return scores.masked_fill(scores < kth, _NEG_INF)


def top_p(scores: torch.Tensor, p: float, min_keep: int) -> torch.Tensor:
    sorted_scores, order = torch.sort(scores, descending=False)
    remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - p)
    remove[..., -min_keep:] = False
    return scores.masked_fill(_unsort(remove, order), _NEG_INF)


def min_p(scores: torch.Tensor, p: float, min_keep: int) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    below = probs < p * probs.amax(dim=-1, keepdim=True)
    order = torch.argsort(scores, descending=True, dim=-1)
    remove = torch.gather(below, dim=-1, index=order)
    remove[..., :min_keep] = False
    return scores.masked_fill(_unsort(remove, order), _NEG_INF)


def typical_p(scores: torch.Tensor, mass: float, min_keep: int) -> torch.Tensor:
    logp = torch.log_softmax(scores, dim=-1)
    entropy = -(logp * logp.exp()).nansum(-1, keepdim=True)
    shifted, order = torch.sort(torch.abs(-logp - entropy), descending=False)
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1).clamp_(max=shifted.shape[-1] - 1)
    remove = shifted > shifted.gather(1, last.view(-1, 1))
    remove[..., :min_keep] = False
    return scores.masked_fill(_unsort(remove, order), _NEG_INF)
