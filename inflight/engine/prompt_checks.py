"""Prompt-level validation the engine runs in make_request: token ids (with p-tuning's virtual
ids) and external drafts. Pure functions; every failure is a ParamError naming the field."""

from __future__ import annotations

from typing import Any

import torch

from inflight.errors import ParamError
from inflight.sampling_params import SamplingParams


def prompt_table(prompt: Any, hidden: int) -> torch.Tensor | None:
    """The p-tuning table of a prompt dict, as (rows, hidden): TensorRT-LLM's [1, rows, hidden]
    (float16, any float dtype) and arrays are accepted."""
    table = prompt.get("prompt_embedding_table") if isinstance(prompt, dict) else None
    if table is None:
        return None
    if not isinstance(table, torch.Tensor):
        try:
            table = torch.as_tensor(table)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ParamError("prompt_embedding_table: must be a tensor", "prompt_embedding_table") from e
    if table.dim() == 3 and table.shape[0] == 1:
        table = table[0]
    if table.dim() != 2 or table.shape[1] != hidden or not table.is_floating_point() or table.shape[0] == 0:
        raise ParamError(
            f"prompt_embedding_table: must be a (rows, {hidden}) or (1, rows, {hidden}) float tensor",
            "prompt_embedding_table",
        )
    rows = prompt.get("prompt_vocab_size")
    if hasattr(rows, "tolist"):
        rows = rows.tolist()
    while isinstance(rows, list) and len(rows) == 1:
        rows = rows[0]
    if rows is not None and rows != table.shape[0]:
        raise ParamError(f"prompt_vocab_size: {rows} but the table has {table.shape[0]} rows", "prompt_vocab_size")
    return table


def check_prompt_ids(ids: list[int], table: Any, vocab: int, hidden: int) -> None:
    """Ids in [0, vocab); with a p-tuning table also [vocab, vocab + rows) (virtual tokens)."""
    limit = vocab
    if table is not None:
        limit = vocab + table.shape[0]
    if any(t < 0 or t >= limit for t in ids):
        raise ParamError(f"prompt: token ids must be in [0, {limit})", "prompt")


def check_drafts(
    prompt: dict, params: SamplingParams, max_tokens: int, vocab: int
) -> tuple[list[int], torch.Tensor | None]:
    """(draft ids, draft logits (K, vocab) float32 or None). Greedy requests keep drafts that match
    the model's own tokens; sampled requests verify them by speculative sampling (against
    `draft_logits`, or by matching independent samples without them: sample/sampler.py), which keeps
    the target distribution. Penalties, bans and min_tokens apply at each draft position over the
    tokens before it, drafts included (sample/processors.DraftedHistory). Sibling sequences and beams are
    refused (a 400 naming `n` / `beam_width`); a grammar masks each draft row by its state after
    the drafts before it (structured/runtime.py)."""
    drafts = prompt["draft_input_ids"]
    if hasattr(drafts, "tolist"):
        drafts = drafts.tolist()
    if (
        not isinstance(drafts, list)
        or not drafts
        or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in drafts)
    ):
        raise ParamError(
            f"draft_input_ids: must be a non-empty list of token ids < {vocab}", "draft_input_ids"
        )
    if len(drafts) >= max_tokens:
        raise ParamError("draft_input_ids: must be shorter than max_tokens", "draft_input_ids")
    logits = _draft_logits(prompt.get("draft_logits"), len(drafts), vocab)
    conflicts = {"n": params.num_sequences > 1, "beam_width": params.is_beam_search}
    for name, bad in conflicts.items():
        if bad:
            raise ParamError(f"draft_input_ids: cannot be combined with {name}", name)
    return list(drafts), logits


def _draft_logits(logits: Any, k: int, vocab: int) -> torch.Tensor | None:
    """(K, vocab) float32; TensorRT-LLM's [1, K, vocab] is accepted."""
    if logits is None:
        return None
    try:
        t = torch.as_tensor(logits).detach().to("cpu", torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ParamError("draft_logits: must be a (num_draft_tokens, vocab) array of numbers", "draft_logits") from e
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if tuple(t.shape) != (k, vocab):
        raise ParamError(f"draft_logits: must be ({k}, {vocab}), one row per draft", "draft_logits")
    if bool(t.isnan().any()) or bool((t == float("inf")).any()) or not bool(t.isfinite().any(dim=-1).all()):
        raise ParamError("draft_logits: numbers (-inf allowed, a finite one in every row), no NaN or +inf", "draft_logits")
    return t
