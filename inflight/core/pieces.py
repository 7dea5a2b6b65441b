"""What the runner is told of a request each step (outputs.py's contract): its piece of the
step, and what the runner has not seen of it yet (new requests whole, then only appended token
ids and new block ids); and the token-level stop checks and draft acceptance applied to what the
step sampled. Pure functions of a `Request`: the scheduler (core/scheduler.py) calls them."""

from __future__ import annotations

from inflight.outputs import NewRequestData, SampledToken, ScheduledRequest
from inflight.request import FinishReason, Request


def make_piece(req: Request, n: int, new: list[NewRequestData], slot_of: dict[int, int], lookahead: int) -> ScheduledRequest:
    """The step's piece of `req`; what the runner has not seen of it yet goes along."""
    end = req.num_tokens + req.num_pending
    k = len(req.draft_token_ids) if req.num_computed_tokens + n > end else 0
    appended: list[int] = []
    sent = req.num_sent_tokens
    if not req.num_sent_tokens:
        new.append(
            NewRequestData(
                request_id=req.request_id,
                inputs=req.inputs,
                output_token_ids=list(req.output_token_ids),
                seq_index=req.seq_index,
                is_beam=req.beam_group_id is not None,
            )
        )
    else:
        appended = req.all_token_ids[req.num_sent_tokens :]
    req.num_sent_tokens = req.num_tokens
    blocks_from, req.num_sent_blocks = req.num_sent_blocks, len(req.block_ids)
    piece = ScheduledRequest(
        request_id=req.request_id,
        num_computed_tokens=req.num_computed_tokens,
        num_tokens=n,
        new_block_ids=req.block_ids[blocks_from:],
        new_blocks_from=blocks_from,
        samples=req.num_computed_tokens + n - k == end,
        num_draft_tokens=k,
        draft_token_ids=req.draft_token_ids[:k],
        draft_logits=req.draft_logits if k else None,
        new_token_ids=appended,
        new_tokens_from=sent,
        lora_slot=slot_of[req.lora.uid] if req.lora is not None else -1,
        serial=req.serial,
        num_lookahead=lookahead,
    )
    req.metrics.num_tokens_run += n  # the model runs them whatever comes of the step (wasted if aborted)
    if not k:  # what this piece computes does not depend on its output: counted now, so the
        # next step can be scheduled while this one runs (drafts: counted once verified)
        req.num_computed_tokens += n
        req.num_pending += piece.samples
    return piece


def stop_after(req: Request, token_id: int, grammar_done: bool = False) -> tuple[FinishReason, int | str | None] | None:
    """Whether `req` ends with `token_id`, its newest token: (reason, stop reason), or None.
    `grammar_done`: its grammar completed at this token (the step's last: the runner cuts a run of
    drafts there)."""
    p = req.params
    if grammar_done:
        return FinishReason.STOP, None
    if req.num_output_tokens >= p.min_tokens:
        eos = (p.end_id,) if p.end_id is not None else req.eos_token_ids
        if not p.ignore_eos and token_id in eos:
            return FinishReason.STOP, None
        if token_id in p.stop_token_ids:
            return FinishReason.STOP, token_id
        out = req.output_token_ids
        for seq in p.stop_token_sequences or ():
            if out[len(out) - len(seq) :] == seq:
                return FinishReason.STOP, str(seq)
    if req.num_output_tokens >= req.max_tokens:
        return FinishReason.LENGTH, None
    return None


def accepted_drafts(req: Request, sampled: list[SampledToken]) -> list[SampledToken]:
    """Drafts agreeing with the runner's tokens, then its next token. Greedy: the model's argmax;
    sampled: the runner already applied the speculative-sampling rule (sample/sampler.py), so a
    rejected draft's row holds a token that differs from it."""
    drafts, req.draft_token_ids, req.draft_logits = req.draft_token_ids, [], None
    accepted = 0
    # sampled may end early: the runner cuts a run at the token that completes its grammar
    while accepted < min(len(drafts), len(sampled) - 1) and sampled[accepted].token_id == drafts[accepted]:
        accepted += 1
    req.metrics.num_draft_tokens += len(drafts)
    req.metrics.num_drafts += 1
    req.metrics.num_accepted_draft_tokens += accepted
    return sampled[: accepted + 1]
