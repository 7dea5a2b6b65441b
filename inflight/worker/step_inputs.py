"""A step's flat-batch inputs from its pieces and the runner's persistent batch: token ids,
positions, which rows sample and what each sample row's processors read.

Two ways to the same lists: the general loop (prefill chunks, drafts, M-RoPE deltas) and, for a
step of one-token decodes of plain requests (the all-decode steps of a large batch: 256 rows a
step at 256 running requests), list comprehensions over the pieces, with the per-request checks
the runner would make on each row answered at once by the batch's count of special requests
(`InputBatch.num_special`). tests/unit/test_step_inputs.py pins the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from inflight.outputs import ScheduledRequest
from inflight.sample.processors import DraftedHistory, TokenHistory
from inflight.sample.sampler import DraftRows
from inflight.spec_decode.picker import verify_rows
from inflight.worker.input_batch import InputBatch, RunnerRequest


@dataclass
class StepInputs:
    pieces: list[ScheduledRequest]  # flat-batch order: decodes (single-token pieces) first, then prefill chunks
    reqs: list[RunnerRequest]  # each piece's request
    ids: list[int]  # (T) the tokens the step runs
    positions: list[int]  # (T) their rotary index (position + the request's M-RoPE delta)
    sample_rows: list[int]  # flat rows whose logits are sampled
    sample_reqs: list[RunnerRequest]  # the request of each sample row (repeated for its draft rows)
    drafts: list[DraftRows]  # draft rows verified against the draft's own q (sampled drafts)
    histories: list[TokenHistory]  # what each sample row's processors read (with drafts: the row's)
    row_drafts: list[list[int]]  # the drafts before each sample row (its grammar state follows them)
    # every piece a one-token decode that samples, every request `one_call` plain (greedy, nothing
    # captured, token embeddings, 1-D positions): the checks on each row need not be made
    plain_decodes: bool = False


def step_inputs(batch: InputBatch, scheduled: list[ScheduledRequest], proposer: bool) -> StepInputs:
    """The step's inputs; `proposer`: the runner has a draft proposer (its draws' q are consumed
    by the step, whether it verifies them or not)."""
    if not batch.num_special and all(sr.num_tokens == 1 and sr.samples for sr in scheduled):
        return plain_decodes(batch, scheduled, proposer)
    return general_inputs(batch, scheduled)


def general_inputs(batch: InputBatch, scheduled: list[ScheduledRequest]) -> StepInputs:
    """Any step's inputs, piece by piece."""
    # decodes (single-token pieces) first, then prefill chunks: see models/attention.py
    pieces = sorted(scheduled, key=lambda s: s.num_tokens > 1)
    reqs = [batch[sr.request_id] for sr in pieces]
    s = StepInputs(pieces, reqs, [], [], [], [], [], [], [])
    for sr, req in zip(pieces, reqs):
        start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
        s.ids.extend(batch.piece_tokens(sr))
        # after an image prompt, all three M-RoPE components are index + delta: plain RoPE
        s.positions.extend(range(start + req.mrope_delta, end + req.mrope_delta))
        if sr.samples:  # with drafts: the K + 1 positions from the last known token on
            k = sr.num_draft_tokens
            mine = verify_rows(sr, len(s.sample_rows), req)  # drafts the proposer drew from q
            if k and sr.draft_logits is not None:
                s.drafts.append(DraftRows(len(s.sample_rows), sr.draft_token_ids[:k], sr.draft_logits, req.params.temperature))
            elif mine is not None:
                s.drafts.append(mine)
            s.sample_rows.extend(range(len(s.ids) - 1 - k, len(s.ids)))
            s.sample_reqs.extend([req] * (k + 1))
            s.histories.append(req)
            if k:
                s.histories.extend(DraftedHistory(req, sr.draft_token_ids[:j]) for j in range(1, k + 1))
            s.row_drafts.extend(list(sr.draft_token_ids[:j]) for j in range(k + 1))
    return s


def plain_decodes(batch: InputBatch, pieces: list[ScheduledRequest], proposer: bool) -> StepInputs:
    """What the general loop makes of one-token decodes of plain requests: a piece per row, each
    row sampling, its token the request's token at its position (no drafts: a piece with drafts
    has more than one token), its position that index (no M-RoPE delta: not `one_call`)."""
    requests = batch.requests
    reqs = [requests[sr.request_id] for sr in pieces]
    positions = [sr.num_computed_tokens for sr in pieces]
    ids = [r.all_token_ids[p] for r, p in zip(reqs, positions)]
    if proposer:  # as verify_rows: a step consumes the q of drafts it does not verify
        for r in reqs:
            r.draft_q = None
    rows = list(range(len(pieces)))
    return StepInputs(list(pieces), reqs, ids, positions, rows, reqs, [], list(reqs), [[] for _ in rows], plain_decodes=True)
