"""Logits processors: batched edits of the (B, V) logits before sampling.

Built once per step from the rows that use each control; rows that don't cost
nothing. Order follows Hugging Face `generate` (so greedy outputs match it):

    allowed_token_ids -> logit_bias / embedding_bias -> repetition_penalty -> presence/frequency -> no_repeat_ngram
    -> bad_words -> min_tokens -> watermark (HF also applies its watermark last)

Each processor gathers its (row, token) pairs in Python from the request's
token history, then makes one indexed tensor update.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import torch

from inflight.sample.watermark import watermark_processor

if TYPE_CHECKING:
    from inflight.sampling_params import SamplingParams

LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]  # (B, V) -> (B, V), may work in place


class TokenHistory(Protocol):
    """What the processors read of a request (the runner's RunnerRequest)."""

    params: SamplingParams
    all_token_ids: list[int]
    bad_words_ids: list[list[int]]
    eos_token_ids: tuple[int, ...]

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def num_output_tokens(self) -> int: ...


class DraftedHistory:
    """A request's history as the row verifying its draft j sees it: its tokens, then drafts[:j].
    Row j's target distribution is the one decoding would give after those drafts, so penalties,
    bans and min_tokens apply at draft positions as they would without drafts."""

    def __init__(self, req: TokenHistory, drafted: list[int]) -> None:
        self.params = req.params
        self.bad_words_ids = req.bad_words_ids
        self.eos_token_ids = req.eos_token_ids
        self.all_token_ids = req.all_token_ids + drafted
        self.embedding_bias = getattr(req, "embedding_bias", None)
        self._output = req.output_token_ids + drafted

    @property
    def output_token_ids(self) -> list[int]:
        return self._output

    @property
    def num_output_tokens(self) -> int:
        return len(self._output)


def build_processors(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> list[LogitsProcessor]:
    """Processors for this step's rows; p-tuning's virtual ids (>= vocab_size) are never indexed."""
    builders = (
        allowed_tokens, logit_bias, embedding_bias, repetition_penalty, openai_penalties, no_repeat_ngram, bad_words, min_tokens_ban,
        watermark_processor,
    )  # fmt: skip
    procs = [b(reqs, device, vocab_size) for b in builders]
    return [p for p in procs if p is not None]


def uses_processors(params: SamplingParams, bad_words_ids: list[list[int]]) -> bool:
    """Whether any builder above can make a processor for a request with these settings (checked
    once per request by the runner: a step whose rows use none skips them all)."""
    return params.uses_processors(bad_words_ids)


def _index(rows: list[int], cols: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(rows, device=device), torch.tensor(cols, device=device)


def _ban(
    reqs: list[TokenHistory], device: torch.device, vocab_size: int, banned_of: Callable[[TokenHistory], Iterable[int]]
) -> LogitsProcessor | None:
    """-inf at every (row, token) that `banned_of(request)` names (virtual ids >= vocab skipped)."""
    rows: list[int] = []
    cols: list[int] = []
    for row, r in enumerate(reqs):
        for tok in banned_of(r):
            if tok < vocab_size:
                rows.append(row)
                cols.append(tok)
    if not rows:
        return None
    index = _index(rows, cols, device)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        logits[index] = float("-inf")
        return logits

    return apply


def _add(rows: list[int], cols: list[int], vals: list[float], device: torch.device) -> LogitsProcessor | None:
    """Add vals at (row, token) pairs, as one indexed update."""
    if not rows:
        return None
    index, delta = _index(rows, cols, device), torch.tensor(vals, device=device)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put_(index, delta, accumulate=True)

    return apply


def allowed_tokens(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    """vLLM's allowed_token_ids: every other token of the row is -inf (ids >= vocab never occur)."""
    rows = [i for i, r in enumerate(reqs) if r.params.allowed_token_ids]
    if not rows:
        return None
    keep = torch.zeros(len(rows), vocab_size, dtype=torch.bool)
    for j, i in enumerate(rows):
        keep[j, [t for t in reqs[i].params.allowed_token_ids or [] if t < vocab_size]] = True
    row_t, keep = torch.tensor(rows, device=device), keep.to(device)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        part = logits[row_t]
        part[:, :vocab_size].masked_fill_(~keep, float("-inf"))
        part[:, vocab_size:] = float("-inf")  # padded lm_head rows are no tokens
        logits[row_t] = part
        return logits

    return apply


def logit_bias(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    rows, cols, vals = [], [], []
    for row, r in enumerate(reqs):
        for tok, bias in (r.params.logit_bias or {}).items():
            rows.append(row)
            cols.append(tok)
            vals.append(bias)
    return _add(rows, cols, vals, device)


def embedding_bias(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    rows = [i for i, r in enumerate(reqs) if r.params.embedding_bias is not None]
    if not rows:
        return None
    row_t = torch.tensor(rows, device=device)
    bias = torch.stack([_bias_row(reqs[i], device) for i in rows])  # (R, V)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        logits[row_t] += bias
        return logits

    return apply


def _bias_row(req: TokenHistory, device: torch.device) -> torch.Tensor:
    """The runner keeps each request's bias as a tensor (a vocabulary-long list takes ms to convert)."""
    kept = getattr(req, "embedding_bias", None)
    return kept if kept is not None else torch.tensor(req.params.embedding_bias, dtype=torch.float32, device=device)


def repetition_penalty(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    """HF/CTRL: every token seen in prompt or output: logit / p if positive, else logit * p."""
    rows, cols, pens = [], [], []
    for row, r in enumerate(reqs):
        p = r.params.repetition_penalty
        if p != 1.0:
            seen = {t for t in r.all_token_ids if t < vocab_size}
            rows.extend([row] * len(seen))
            cols.extend(seen)
            pens.extend([p] * len(seen))
    if not rows:
        return None
    index, pen = _index(rows, cols, device), torch.tensor(pens, device=device)

    def apply(logits: torch.Tensor) -> torch.Tensor:
        vals = logits[index]
        logits[index] = torch.where(vals < 0, vals * pen, vals / pen)
        return logits

    return apply


def openai_penalties(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    """OpenAI: logit -= presence * [count > 0] + frequency * count, over output tokens."""
    rows, cols, vals = [], [], []
    for row, r in enumerate(reqs):
        pres, freq = r.params.presence_penalty, r.params.frequency_penalty
        if pres == 0.0 and freq == 0.0:
            continue
        for tok, count in Counter(r.output_token_ids).items():
            rows.append(row)
            cols.append(tok)
            vals.append(-(pres + freq * count))
    return _add(rows, cols, vals, device)


def banned_ngram_tokens(tokens: list[int], n: int) -> set[int]:
    """Tokens that would complete an n-gram already present in `tokens` (HF semantics)."""
    if n <= 0 or len(tokens) + 1 < n:
        return set()
    if n == 1:
        return set(tokens)
    prefix = tuple(tokens[len(tokens) - n + 1 :])
    return {
        tokens[i + n - 1]
        for i in range(len(tokens) - n + 1)
        if tuple(tokens[i : i + n - 1]) == prefix
    }


def no_repeat_ngram(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    return _ban(reqs, device, vocab_size, lambda r: banned_ngram_tokens(r.all_token_ids, r.params.no_repeat_ngram_size))


def bad_words(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    return _ban(reqs, device, vocab_size, _bad_word_bans)


def _bad_word_bans(r: TokenHistory) -> list[int]:
    """A banned sequence's last token is masked when its prefix ends the sequence so far."""
    tokens = r.all_token_ids
    return [
        seq[-1] for seq in r.bad_words_ids if len(seq) == 1 or tokens[len(tokens) - len(seq) + 1 :] == seq[:-1]
    ]


def min_tokens_ban(reqs: list[TokenHistory], device: torch.device, vocab_size: int) -> LogitsProcessor | None:
    return _ban(reqs, device, vocab_size, _min_tokens_bans)


def _min_tokens_bans(r: TokenHistory) -> set[int]:
    """EOS and stop ids, while the request has fewer than `min_tokens` output tokens."""
    p = r.params
    if r.num_output_tokens >= p.min_tokens:
        return set()
    banned = set(p.stop_token_ids)
    if not p.ignore_eos:
        banned.update((p.end_id,) if p.end_id is not None else r.eos_token_ids)
    return banned
