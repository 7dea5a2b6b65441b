"""Prompt-level validation the engine runs in make_request: token ids (with p-tuning's virtual
ids) and external drafts. Pure functions; every failure is a ParamError naming the field."""

from __future__ import annotations

from typing import Any

import torch

from inflight.errors import ParamError
from inflight.sampling_params import SamplingParams


def check_prompt_ids(ids: list[int], table: Any, vocab: int, hidden: int) -> None:
    """Ids in [0, vocab); with a p-tuning table also [vocab, vocab + rows) (virtual tokens)."""
    limit = vocab
    if table is not None:
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] != hidden:
            raise ParamError(
                f"prompt_embedding_table: must be a (rows, {hidden}) tensor",
                "prompt_embedding_table",
            )
        limit = vocab + table.shape[0]
    if any(t < 0 or t >= limit for t in ids):
        raise ParamError(f"prompt: token ids must be in [0, {limit})", "prompt")


def check_drafts(prompt: dict, params: SamplingParams, max_tokens: int, vocab: int) -> list[int]:
    """Drafts are verified greedily in one step; controls that need per-position history
    (penalties, bans, sampling) can't apply to tokens that were only drafted, so they are refused."""
    drafts = prompt["draft_input_ids"]
    if (
        not isinstance(drafts, list)
        or not drafts
        or not all(isinstance(t, int) and 0 <= t < vocab for t in drafts)
    ):
        raise ParamError(
            f"draft_input_ids: must be a non-empty list of token ids < {vocab}", "draft_input_ids"
        )
    if len(drafts) >= max_tokens:
        raise ParamError("draft_input_ids: must be shorter than max_tokens", "draft_input_ids")
    logits = prompt.get("draft_logits")
    if logits is not None and tuple(torch.as_tensor(logits).shape) != (len(drafts), vocab):
        # greedy verification compares tokens, so the draft model's logits are checked but not
        # needed; they matter for sampled verification, which is refused below (temperature)
        raise ParamError(
            f"draft_logits: must be ({len(drafts)}, {vocab}), one row per draft", "draft_logits"
        )
    conflicts = {
        "temperature": params.temperature != 0.0, "n": params.num_sequences > 1,
        "repetition_penalty": params.repetition_penalty != 1.0,
        "presence_penalty": params.presence_penalty != 0.0, "frequency_penalty": params.frequency_penalty != 0.0,
        "logit_bias": bool(params.logit_bias), "no_repeat_ngram_size": params.no_repeat_ngram_size > 0,
        "bad_words": bool(params.bad_words or params.bad_words_ids), "min_tokens": params.min_tokens > 0,
        "watermark": params.watermark, "structured_outputs": params.structured_outputs is not None,
    }  # fmt: skip
    for name, bad in conflicts.items():
        if bad:
            raise ParamError(
                f"draft_input_ids: cannot be combined with {name} (greedy verification)", name
            )
    return list(drafts)
