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
    """A logits processor masking each constrained row to the tokens its grammar allows next."""
    # a complete grammar allows nothing more: such a row (async scheduling ran the request one
    # step past its end; the scheduler drops that token) is left unmasked
    rows = [i for i, r in enumerate(reqs) if r.matcher is not None and not r.matcher.is_terminated()]
    if not rows:
        return None
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(reqs), vocab_size)
    for i in rows:
        reqs[i].matcher.fill_next_token_bitmask(bitmask, i)

    banned = [(i, t) for i in rows for t in reqs[i].matcher.banned_ids]

    def apply(logits: torch.Tensor) -> torch.Tensor:
        xgr.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device), vocab_size=vocab_size, indices=rows
        )
        if banned:
            r, t = zip(*banned)
            logits[list(r), list(t)] = float("-inf")
        return logits

    return apply


def advance_matchers(reqs: list[RunnerRequest], sampled: list[SampledToken]) -> set[str]:
    """Feed each constrained request its sampled token; the ids whose grammar is now complete."""
    terminated = set()
    for r, s in zip(reqs, sampled):
        m: Any = r.matcher
        if m is None or m.is_terminated():  # complete already (see grammar_mask)
            continue
        if not m.accept_token(s.token_id):  # only reachable if a processor overrode the mask
            logger.warning("request %s: token %d rejected by its grammar", r.request_id, s.token_id)
            terminated.add(r.request_id)
        elif m.is_terminated():
            terminated.add(r.request_id)
    return terminated
