"""The step loop's side of structured output: mask a batch's logits, advance the matchers.

Both run in the model runner (the engine thread, or the worker process with "mp"). Filling a bitmask row is one C++ call per
constrained request (microseconds for most grammars); applying the masks is one batched call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from inflight.outputs import SampledToken

if TYPE_CHECKING:
    from inflight.worker.input_batch import RunnerRequest

logger = logging.getLogger(__name__)


def grammar_mask(
    reqs: list[RunnerRequest], vocab_size: int
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A logits processor masking each constrained row to the tokens its grammar allows next, and
    each row past its thinking budget to the end-of-thinking token (structured/thinking.py)."""
    # a complete grammar allows nothing more: such a row (async scheduling ran the request one
    # step past its end; the scheduler drops that token) is left unmasked; a row still thinking
    # is free (its grammar starts after the thinking)
    rows = [i for i, r in enumerate(reqs) if r.matcher is not None and not r.matcher.is_terminated()
            and (r.thinking is None or r.thinking.answering)]  # fmt: skip
    forced = [(i, r.thinking.params.end_id) for i, r in enumerate(reqs) if r.thinking is not None and r.thinking.must_end()]
    if not rows and not forced:
        return None
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(max(len(reqs), 1), vocab_size)
    for i in rows:
        reqs[i].matcher.fill_next_token_bitmask(bitmask, i)
        th = reqs[i].thinking
        if th is not None and th.phase == "open":  # the answer, or the start of thinking
            _allow(bitmask, i, th.params.start_id)

    banned = [(i, t) for i in rows for t in reqs[i].matcher.banned_ids]

    def apply(logits: torch.Tensor) -> torch.Tensor:
        if rows:
            xgr.apply_token_bitmask_inplace(
                logits, bitmask.to(logits.device), vocab_size=vocab_size, indices=rows
            )
        if banned:
            r, t = zip(*banned)
            logits[list(r), list(t)] = float("-inf")
        for i, end_id in forced:  # only the end token stays (finite even if a bias banned it); no device sync
            keep = logits[i, end_id].clone()
            logits[i] = float("-inf")
            logits[i, end_id] = torch.nan_to_num(keep, neginf=0.0)
        return logits

    return apply


def _allow(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Set one token's bit in an xgrammar bitmask row (int32 words, bit i of word i // 32)."""
    word = int(bitmask[row, token_id // 32]) & 0xFFFFFFFF | (1 << (token_id % 32))
    bitmask[row, token_id // 32] = word - (1 << 32) if word >= 1 << 31 else word


def advance_matchers(reqs: list[RunnerRequest], sampled: list[SampledToken]) -> set[str]:
    """Feed each constrained request its sampled token; the ids whose grammar is now complete."""
    terminated = set()
    for r, s in zip(reqs, sampled):
        if r.thinking is not None and not r.thinking.accept(s.token_id):
            continue  # a thinking token: the grammar starts after the thinking
        m: Any = r.matcher
        if m is None or m.is_terminated():  # complete already (see grammar_mask)
            continue
        if not m.accept_token(s.token_id):  # only reachable if a processor overrode the mask
            logger.warning("request %s: token %d rejected by its grammar", r.request_id, s.token_id)
            terminated.add(r.request_id)
        elif m.is_terminated():
            terminated.add(r.request_id)
    return terminated
