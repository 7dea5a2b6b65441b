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
    reqs: list[RunnerRequest], vocab_size: int, row_drafts: list[list[int]] | None = None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A logits processor masking each constrained row to the tokens its grammar allows next, and
    each row past its thinking budget to the end-of-thinking token (structured/thinking.py).

    `row_drafts[i]`: the drafts before row i (row j of a request verifying K drafts sees drafts[:j]);
    its mask is the grammar's after them: the matcher and the thinking state are advanced draft by
    draft while the rows are filled, then rolled back. After a draft the grammar rejects, the rows
    are left unmasked: verification ends the run there (the row before masks that draft out)."""
    if not any(r.matcher is not None or r.thinking is not None for r in reqs):
        return None
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(max(len(reqs), 1), vocab_size)
    rows: list[int] = []
    forced: list[tuple[int, int]] = []
    walk = _DraftWalk()
    for i, r in enumerate(reqs):
        if r.matcher is None and r.thinking is None:
            continue
        drafted = row_drafts[i] if row_drafts is not None else []
        if not walk.at(r, drafted):
            continue  # past a draft its grammar rejects
        if r.thinking is not None and r.thinking.must_end():
            forced.append((i, r.thinking.params.end_id))
        # a complete grammar allows nothing more: such a row (async scheduling ran the request one
        # step past its end; the scheduler drops that token) is left unmasked; a row still thinking
        # is free (its grammar starts after the thinking)
        if r.matcher is not None and not r.matcher.is_terminated() and (r.thinking is None or r.thinking.answering):
            r.matcher.fill_next_token_bitmask(bitmask, i)
            rows.append(i)
            th = r.thinking
            if th is not None and th.phase == "open":  # the answer, or the start of thinking
                _allow(bitmask, i, th.params.start_id)
    walk.done()
    if not rows and not forced:
        return None
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


class _DraftWalk:
    """Moves one request's grammar and thinking state along its drafts, row by row, and puts them
    back (xgrammar's rollback; the thinking state's two fields) when the next request starts."""

    def __init__(self) -> None:
        self.req: Any = None
        self.seen = 0  # drafts accepted into the state so far
        self.accepted = 0  # of them, tokens the matcher took (its rollback count)
        self.saved: tuple[str, int] | None = None
        self.broken = False

    def at(self, r: Any, drafted: list[int]) -> bool:
        """Bring `r`'s state to after `drafted`; False when a draft was rejected on the way."""
        if r is not self.req or len(drafted) < self.seen:
            self.done()
            self.req, th = r, r.thinking
            self.saved = None if th is None else (th.phase, th.num_thinking)
        while not self.broken and self.seen < len(drafted):
            took = _feed(r, drafted[self.seen])
            self.seen += 1
            if took is None:
                self.broken = True
            else:
                self.accepted += took
        return not self.broken

    def done(self) -> None:
        r = self.req
        if r is not None:
            if self.accepted:
                r.matcher.rollback(self.accepted)
            if self.saved is not None:
                r.thinking.phase, r.thinking.num_thinking = self.saved
        self.__init__()  # type: ignore[misc]


def _feed(r: Any, token_id: int) -> int | None:
    """Advance `r` by one token: 1 if its matcher took it, 0 if it was a thinking token (or the
    grammar is complete), None if the grammar rejects it."""
    if r.thinking is not None and not r.thinking.accept(token_id):
        return 0
    m = r.matcher
    if m is None or m.is_terminated():
        return 0
    return 1 if m.accept_token(token_id) else None


def _allow(bitmask: torch.Tensor, row: int, token_id: int) -> None:
    """Set one token's bit in an xgrammar bitmask row (int32 words, bit i of word i // 32)."""
    word = int(bitmask[row, token_id // 32]) & 0xFFFFFFFF | (1 << (token_id % 32))
    bitmask[row, token_id // 32] = word - (1 << 32) if word >= 1 << 31 else word


def advance_matchers(
    reqs: list[RunnerRequest], sampled: list[SampledToken], row_drafts: list[list[int]] | None = None
) -> tuple[set[str], dict[str, int]]:
    """Feed each constrained request the tokens it keeps: with drafts, the rows up to the first
    one whose token differs from its draft (the scheduler's rule). Returns the ids whose grammar
    is now complete, and for those completed before their last kept token, how many tokens to
    keep (the rest is past the grammar's end)."""
    terminated: set[str] = set()
    cut: dict[str, int] = {}
    stopped: set[int] = set()  # requests (by id()) whose kept run ended at an earlier row
    for i, (r, s) in enumerate(zip(reqs, sampled)):
        if (r.matcher is None and r.thinking is None) or id(r) in stopped or r.request_id in terminated:
            continue
        nxt = row_drafts[i + 1] if row_drafts is not None and i + 1 < len(reqs) and reqs[i + 1] is r else None
        if nxt is None or s.token_id != nxt[-1]:
            stopped.add(id(r))  # this row's token is the last one kept
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
        if r.request_id in terminated and id(r) not in stopped:
            cut[r.request_id] = len(row_drafts[i]) + 1 if row_drafts is not None else 1
    return terminated, cut
