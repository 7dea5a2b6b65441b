"""Opt-in logits outputs: prompt logprobs, context logits, generation logits.

Prompt positions are captured as their (possibly chunked) prefill runs. A request
that needs them never takes prompt tokens from the prefix cache (those positions
would have no logits), and a recompute after preemption skips positions already
captured (`RunnerRequest.num_prompt_logits`). What a step captures goes into its
`ModelRunnerOutput`; the engine appends it to the request's outputs.
"""

from __future__ import annotations

import torch

from inflight.outputs import ModelRunnerOutput, SampledToken, ScheduledRequest
from inflight.worker.input_batch import RunnerRequest

# Largest logits tensor one request may ask for (float32 elements): 2^26 = 256 MiB,
# e.g. 440 prompt tokens of a 152k vocabulary.
MAX_LOGITS_ELEMENTS = 1 << 26


def capture_prompt_logits(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    pieces: list[ScheduledRequest],
    reqs: list[RunnerRequest],
    out: ModelRunnerOutput,
) -> None:
    offset = 0
    for sr, req in zip(pieces, reqs):
        start = max(sr.num_computed_tokens, req.num_prompt_logits)
        end = min(sr.num_computed_tokens + sr.num_tokens, req.num_prompt_tokens)
        if req.params.needs_prompt_logits and start < end:
            rows = torch.arange(start, end, device=hidden.device) - sr.num_computed_tokens + offset
            logits = model.compute_logits(hidden[rows])  # type: ignore[operator]  # (n, V) float32
            if req.params.return_context_logits:
                out.context_logits[req.request_id] = logits.cpu()
            if req.params.prompt_logprobs is not None:
                out.prompt_logprobs[req.request_id] = _prompt_logprobs(req, logits, start, end)
            req.num_prompt_logits = end
        offset += sr.num_tokens


def capture_pooled(
    hidden: torch.Tensor, pieces: list[ScheduledRequest], reqs: list[RunnerRequest], out: ModelRunnerOutput
) -> None:
    """Decoder embeddings: last-token or mean pooling of the final (normed) hidden states."""
    offset = 0
    for sr, req in zip(pieces, reqs):
        end = min(sr.num_computed_tokens + sr.num_tokens, req.num_prompt_tokens)
        if req.params.pooling is not None and not req.embedded:
            start = max(sr.num_computed_tokens, req.num_pooled)
            rows = hidden[offset + start - sr.num_computed_tokens : offset + end - sr.num_computed_tokens].float()
            if req.params.pooling == "mean" and len(rows):
                total = rows.sum(dim=0)
                req.pooled_sum = total if req.pooled_sum is None else req.pooled_sum + total
            req.num_pooled = max(req.num_pooled, end)
            if end == req.num_prompt_tokens:
                pooled = rows[-1] if req.params.pooling == "last" else req.pooled_sum / req.num_prompt_tokens
                out.embeddings[req.request_id] = torch.nn.functional.normalize(pooled, dim=0).cpu()
                req.embedded = True
        offset += sr.num_tokens


def _prompt_logprobs(req: RunnerRequest, logits: torch.Tensor, start: int, end: int) -> list[SampledToken]:
    """Position p's logits score prompt token p + 1; the last prompt position scores nothing."""
    last = min(end, req.num_prompt_tokens - 1)
    if last <= start:
        return []
    n_top = req.params.prompt_logprobs or 0
    if n_top == -1:  # the whole vocabulary (vLLM)
        n_top = logits.shape[-1]
    logprobs = torch.log_softmax(logits[: last - start], dim=-1)
    targets = torch.tensor(req.prompt_token_ids[start + 1 : last + 1], device=logits.device)
    chosen = logprobs.gather(1, targets[:, None])  # (n, 1)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    top_v, top_i = logprobs.topk(n_top, dim=-1) if n_top else (logprobs[:, :0], logprobs[:, :0].long())
    return [
        SampledToken(t, lp, list(zip(ids, vals)), rank)
        for t, lp, rank, ids, vals in zip(
            targets.tolist(), chosen[:, 0].tolist(), ranks.tolist(), top_i.tolist(), top_v.tolist()
        )
    ]


def capture_generation_logits(logits: torch.Tensor, reqs: list[RunnerRequest], out: ModelRunnerOutput) -> None:
    """Raw (pre-processor) logits of each sampled row that asked for them."""
    for row, req in enumerate(reqs):
        if req.params.return_generation_logits:
            out.generation_logits.setdefault(req.request_id, []).append(logits[row].cpu())

def drop_rejected_logits(pieces: list[ScheduledRequest], result: ModelRunnerOutput) -> None:
    """Generation logits only for tokens that stay: a piece with K drafts captured K + 1 rows; the
    scheduler keeps the drafts that match the sampled tokens, then one more (core/scheduler.py)."""
    for sr in pieces:
        rows = result.generation_logits.get(sr.request_id)
        if sr.num_draft_tokens and sr.samples and rows:
            got = result.sampled[sr.request_id]
            kept = next((i for i, d in enumerate(sr.draft_token_ids) if got[i].token_id != d), len(sr.draft_token_ids))
            del rows[kept + 1 :]
