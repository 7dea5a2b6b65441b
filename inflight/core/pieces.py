"""What the runner is told of a request each step (outputs.py's contract): its piece of the
step, and what the runner has not seen of it yet (new requests whole, then only appended token
ids and new block ids); and the token-level stop checks and draft acceptance applied to what the
step sampled. Pure functions of a `Request`: the scheduler (core/scheduler.py) calls them."""

from __future__ import annotations

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.outputs import NewRequestData, SampledToken, ScheduledRequest
from inflight.request import FinishReason, Request


def make_piece(req: Request, n: int, new: list[NewRequestData], slot_of: dict[int, int], lookahead: int) -> ScheduledRequest:
    """The step's piece of `req`; what the runner has not seen of it yet goes along. (Once per
    running request per step: attributes read once, the piece built from positional arguments,
    ~0.7 us less than keywords at 256 a step; offline_host_cost.py)"""
    computed, tokens, drafts = req.num_computed_tokens, req.all_token_ids, req.draft_token_ids
    end = len(tokens) + req.num_pending
    k = len(drafts) if drafts and computed + n > end else 0
    sent = req.num_sent_tokens
    if not sent:
        new.append(
            NewRequestData(
                request_id=req.request_id,
                inputs=req.inputs,
                output_token_ids=list(req.output_token_ids),
                seq_index=req.seq_index,
                is_beam=req.beam_group_id is not None,
            )
        )
        appended: list[int] = []
    else:
        appended = tokens[sent:]
    req.num_sent_tokens = len(tokens)
    blocks = req.block_ids
    blocks_from, req.num_sent_blocks = req.num_sent_blocks, len(blocks)
    samples = computed + n - k == end
    lora = req.inputs.lora
    piece = ScheduledRequest(
        req.request_id, computed, n, samples, k, drafts[:k], req.draft_logits if k else None, appended, sent,
        blocks[blocks_from:], blocks_from, slot_of[lora.uid] if lora is not None else -1, lookahead, req.serial,
    )  # fmt: skip
    req.metrics.num_tokens_run += n  # the model runs them whatever comes of the step (wasted if aborted)
    if not k:  # what this piece computes does not depend on its output: counted now, so the
        # next step can be scheduled while this one runs (drafts: counted once verified)
        req.num_computed_tokens = computed + n
        req.num_pending += samples
    return piece


def multistep_request(req: Request) -> bool:
    """Whether `req` may decode several tokens in one engine step (docs/MULTISTEP.md): plain
    greedy (its token is the argmax alone, fed back on the device) on the plain path (no LoRA,
    images, p-tuning table, drafts, beams, prompt logits or pooling: the runner's `captures`)."""
    p = req.params
    return (
        p.is_plain_greedy and not p.uses_processors(req.bad_words_ids) and req.grammar is None
        and not p.needs_prompt_logits and p.pooling is None
        and req.beam_group_id is None and req.lora is None and not req.mm_items and req.prompt_embedding_table is None
        and not req.draft_token_ids and not req.num_lookahead
    )  # fmt: skip


def multistep_ok(req: Request) -> bool:
    """`multistep_request`, with no token in flight and its next piece a one-token decode."""
    return multistep_request(req) and not req.num_pending and req.num_computed_tokens + 1 == req.num_tokens


def multistep_passes(pieces: dict[str, int], requests: dict[str, Request], n: int, kv: KVCacheManager) -> int:
    """Decode passes a step runs (SchedulerConfig.num_scheduler_steps, `pieces` its request id ->
    tokens): n when every piece is a one-token decode that `multistep_ok`, at most the tokens each
    may still generate (max_tokens is capped by max_model_len), with KV slots for the n - 1 tokens
    fed back reserved now; else 1. Reserving never preempts: a pool without room for every
    request's passes runs one pass (and reserves nothing)."""
    if n == 1 or not pieces or any(k != 1 for k in pieces.values()):
        return 1
    reqs = [requests[rid] for rid in pieces]
    if not all(multistep_ok(r) for r in reqs):
        return 1
    n = min(n, *(r.max_tokens - r.num_output_tokens for r in reqs))
    # all or nothing: a block taken for one request's passes while another's do not fit would run
    # the pool dry for the next step's pieces (which may then preempt)
    if n == 1 or sum(kv.num_blocks_needed(r, n) for r in reqs) > kv.pool.num_free_blocks:
        return 1
    for r in reqs:
        kv.allocate(r, n)
        r.metrics.num_tokens_run += n - 1  # the passes after the piece's own token (make_piece counts it)
    return n


def encoder_fit(req: Request, start: int, n: int, left: int, config: SchedulerConfig) -> tuple[int, int]:
    """The piece [start, start + n) cut before the first image / video it would start whose
    encoder run no longer fits this step's encoder budget (the step's token budget, counted
    in image tokens; `left` of it remains), so a large image waits for a later step instead of
    stalling this one's decodes; the first image of a step always runs, however large. Without
    chunked prefill a prompt runs whole, so it is never cut. Returns (tokens, budget left)."""
    if not config.enable_chunked_prefill:
        return n, left
    for item in req.mm_items:  # in prompt order
        if item.offset < start:
            continue  # reached (and encoded) by an earlier piece
        if item.offset >= start + n:
            break
        untouched = left == config.max_num_batched_tokens
        if item.length > left and not untouched:
            return item.offset - start, left
        left -= item.length
    return n, left


def drafts_fitting(req: Request, n: int, budget: int, computed: int | None = None) -> int:
    """Draft tokens to verify after this piece: all of them, if it reaches the end and they fit
    the step's `budget` (tokens left); `computed`: its computed tokens, if not yet counted."""
    base = req.num_computed_tokens if computed is None else computed
    k = len(req.draft_token_ids)
    if k and req.num_pending:
        return 0  # verified once the token in flight is known
    if k and req.drafts_proposed and n > 1:
        # the engine's drafts join one-token pieces only (a decode, a prompt's last token after a
        # prefix hit): a longer prompt or recompute piece runs as without speculation, on the same
        # path (bf16 / Q8_0: 8 prompt rows + 4 drafts left the C kernel for the eager model, whose
        # rounding differs: greedy tokens changed). They are proposed again for the next piece.
        return 0
    if k and req.num_tokens + k > req.num_prompt_tokens + req.max_tokens:
        req.draft_token_ids = []  # more drafts than tokens left to generate: never verified
        return 0
    if k and base + n == req.num_tokens and n + k <= budget:
        return k
    return 0


def append_tokens(req: Request, tokens: list[SampledToken], now: float, batch_size: int) -> tuple[FinishReason, int | str | None] | None:
    """Append a step's tokens (one, or accepted drafts, or a multi-step run's) to `req` with their
    metrics, up to the first that ends it: that one's (reason, stop reason), else None."""
    m = req.metrics
    if m.first_token_time is None:
        m.first_token_time = now
    if len(tokens) == 1:  # a decode's (most calls): the loop's steps without the loop
        st = tokens[0]
        req.output_token_ids.append(st.token_id)
        req.all_token_ids.append(st.token_id)  # (append_token's two appends)
        req.cumulative_logprob += st.logprob
        req.num_new_tokens = 1
        m.token_times.append(now)
        m.batch_sizes.append(batch_size)
        return stop_after(req, st.token_id, req.grammar_terminated)
    req.num_new_tokens = 0
    last = len(tokens) - 1
    for i, st in enumerate(tokens):
        req.append_token(st.token_id)
        req.cumulative_logprob += st.logprob
        req.num_new_tokens += 1
        m.token_times.append(now)
        m.batch_sizes.append(batch_size)
        # the grammar completed at the step's last token (the runner cuts a run of drafts there)
        stop = stop_after(req, st.token_id, req.grammar_terminated and i == last)
        if stop is not None:
            return stop
    return None


def stop_after(req: Request, token_id: int, grammar_done: bool = False) -> tuple[FinishReason, int | str | None] | None:
    """Whether `req` ends with `token_id`, its newest token: (reason, stop reason), or None.
    `grammar_done`: its grammar completed at this token (the step's last: the runner cuts a run of
    drafts there)."""
    if grammar_done:
        return FinishReason.STOP, None
    inputs, out = req.inputs, req.output_token_ids  # (once each: every running request, every token)
    p, num_out = inputs.params, len(out)
    if num_out >= p.min_tokens:
        if not p.ignore_eos and token_id in ((p.end_id,) if p.end_id is not None else inputs.eos_token_ids):
            return FinishReason.STOP, None
        if token_id in p.stop_token_ids:
            return FinishReason.STOP, token_id
        for seq in p.stop_token_sequences or ():
            if out[len(out) - len(seq) :] == seq:
                return FinishReason.STOP, str(seq)
    if num_out >= inputs.max_tokens:
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
