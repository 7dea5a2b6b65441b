"""How the runner's proposers (draft model, EAGLE heads) choose drafts, and the q they drew from.

Greedy requests get the proposer's argmax. Sampled requests get a draw from q = softmax(logits /
T) at the request's temperature (its seeded generator, if any), and q is kept so that the next
step verifies with the full speculative-sampling rule: keep d with probability min(1, p(d) /
q(d)), else draw from norm(max(0, p - q)) (sample/sampler.py). Exact only because d ~ q; an argmax
draft with a one-hot q would be exact too, but keeps fewer drafts than p(d) / q(d) does when the
proposer agrees with the target in distribution rather than in argmax.
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.sample.sampler import DraftRows


def pick_drafts(logits: torch.Tensor, reqs: list[Any]) -> list[int]:
    """One draft per row of `logits` (R, V) for `reqs` (a RunnerRequest per row); a sampled
    request's draws and their logits are appended to its `draft_q` (reset by the proposer)."""
    tokens = logits.argmax(dim=-1)
    drawn = [i for i, r in enumerate(reqs) if r.params.temperature > 0]
    kept = {}
    for i in drawn:
        r = reqs[i]
        row = kept[i] = _top_k(logits[i].float(), r.params.top_k)
        q = torch.softmax(row / r.params.temperature, dim=-1)
        tokens[i] = torch.multinomial(q, 1, generator=r.generator)[0]
    out: list[int] = tokens.tolist()
    for i in drawn:
        if reqs[i].draft_q is None:
            reqs[i].draft_q = ([], [])
        reqs[i].draft_q[0].append(out[i])
        reqs[i].draft_q[1].append(kept[i])
    return out


def _top_k(row: torch.Tensor, k: int) -> torch.Tensor:
    """The request's top-k applied to q as it is to p: drafts outside p's support are never kept,
    so drawing them only wastes the slot (any q is exact; this one is kept more often)."""
    if k <= 0 or k >= row.shape[-1]:
        return row
    return row.masked_fill(row < row.topk(k).values[-1], float("-inf"))


def verify_rows(sr: Any, row: int, req: Any) -> DraftRows | None:
    """The verification rows of `sr`'s drafts (its first sample row is `row`) with the q they
    were drawn from; None for greedy requests and drafts not drawn here (a client's, n-gram's).
    Read once: the step that verifies them consumes them."""
    entry, req.draft_q = req.draft_q, None
    k = sr.num_draft_tokens
    if entry is None or not k or req.params.temperature <= 0 or entry[0][:k] != list(sr.draft_token_ids[:k]):
        return None
    return DraftRows(row, list(sr.draft_token_ids[:k]), torch.stack(entry[1][:k]), req.params.temperature)
