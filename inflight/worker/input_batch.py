"""The runner's own per-request state, kept from a request's first step until it is freed.

Built from `NewRequestData`, advanced by the tokens it samples itself (and, on ranks that do not
sample, by each `ScheduledRequest`'s tokens appended since the runner last saw it), dropped when the scheduler lists the id in `freed_ids`. Attribute
names follow `Request`'s where both hold the same thing, so the logits processors
(sample/processors.py) read either.
"""

from __future__ import annotations

from typing import Any

import torch

from inflight.outputs import NewRequestData, SampledToken, ScheduledRequest, SchedulerOutput
from inflight.sampling_params import SamplingParams
from inflight.structured.thinking import ThinkingState


class RunnerRequest:
    def __init__(self, data: NewRequestData, device: torch.device) -> None:
        inputs = data.inputs
        self.request_id = data.request_id
        self.inputs = inputs  # what the client asked for (request_inputs.py): a new field is read from here
        self.params: SamplingParams = inputs.params
        self.all_token_ids: list[int] = data.token_ids
        self.num_prompt_tokens = data.num_prompt_tokens
        self.eos_token_ids = inputs.eos_token_ids
        self.bad_words_ids = inputs.bad_words_ids
        self.is_beam = data.is_beam
        self.seed = inputs.sequence_seed(data.seq_index)
        bias = inputs.params.embedding_bias  # a vocabulary-long list: a tensor once, not every step
        self.embedding_bias = None if bias is None else torch.tensor(bias, dtype=torch.float32, device=device)
        table = inputs.prompt_embedding_table
        self.prompt_embedding_table: torch.Tensor | None = None if table is None else table.to(device)
        # vision-language prompts: items (placeholder spans + pixels), M-RoPE positions, and the
        # encoder output of each item once computed (kept through preemption; worker/vision.py)
        self.mm_items = inputs.mm_items
        self.mrope_positions = inputs.mrope_positions
        self.mrope_delta = inputs.mrope_delta
        self.mm_embeds: dict[int, torch.Tensor] = {}
        self.matcher: Any = None
        if inputs.grammar is not None:
            from inflight.structured.backend import new_matcher

            self.matcher = new_matcher(inputs.grammar)
        # a reasoning model's thinking: the grammar waits for its end, a budget forces that end
        self.thinking = None if inputs.params.thinking is None else ThinkingState(inputs.params.thinking)
        self.generator: torch.Generator | None = None  # seeded sampling: made on first use
        # logits outputs: prompt positions captured so far (a recompute after preemption skips them)
        self.num_prompt_logits = 0
        # decoder embeddings: running sum over pooled positions; done once the vector is sent
        self.pooled_sum: torch.Tensor | None = None
        self.num_pooled = 0
        self.embedded = False

    def progress(self) -> tuple[Any, ...]:
        """What running a step changes (besides the grammar matcher, advanced last): a failed
        step's retry restores it first (`ModelRunner.execute`)."""
        gen_state = None if self.generator is None else self.generator.get_state()
        return (
            self.num_prompt_logits,
            self.pooled_sum,
            self.num_pooled,
            self.embedded,
            self.generator,
            gen_state,
        )

    def restore(self, saved: tuple[Any, ...]) -> None:
        (
            self.num_prompt_logits,
            self.pooled_sum,
            self.num_pooled,
            self.embedded,
            self.generator,
            gen_state,
        ) = saved
        if self.generator is not None:
            self.generator.set_state(gen_state)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens


class InputBatch:
    """Every live request's RunnerRequest, updated from each SchedulerOutput."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.requests: dict[str, RunnerRequest] = {}

    def update(self, out: SchedulerOutput, failed: dict[str, str]) -> None:
        """Apply `out`; a request whose state can't be built is put in `failed` (id -> error)."""
        for rid in out.freed_ids:  # first: a new request may reuse a freed id
            self.requests.pop(rid, None)
        for data in out.new_requests:
            try:
                self.requests[data.request_id] = RunnerRequest(data, self.device)
            except Exception as e:  # e.g. its grammar or embedding table: fails this request only
                failed[data.request_id] = f"{type(e).__name__}: {e}"
        for sr in out.scheduled:
            if sr.new_token_ids and sr.request_id in self.requests:
                start = sr.new_tokens_from
                self.requests[sr.request_id].all_token_ids[start : start + len(sr.new_token_ids)] = sr.new_token_ids

    def append_sampled(self, pieces: list[ScheduledRequest], sampled: dict[str, list[SampledToken]]) -> None:
        """Append the tokens this step sampled to their requests, as the scheduler will: with
        drafts, those that match the sampled tokens and one more. The runner needs no message to
        know them, so the next step can be scheduled before this one's output is read."""
        for sr in pieces:
            got = sampled.get(sr.request_id)
            if not got or not sr.samples:
                continue
            keep = 0
            while keep < sr.num_draft_tokens and got[keep].token_id == sr.draft_token_ids[keep]:
                keep += 1
            self.requests[sr.request_id].all_token_ids.extend(t.token_id for t in got[: keep + 1])

    def __getitem__(self, request_id: str) -> RunnerRequest:
        return self.requests[request_id]

    def piece_tokens(self, sr: ScheduledRequest) -> list[int]:
        """The token ids a piece runs: known tokens, then its draft tokens."""
        req = self.requests[sr.request_id]
        start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
        k = sr.num_draft_tokens
        return req.all_token_ids[start : end - k] + sr.draft_token_ids[:k]
