"""Request: one prompt's state as the engine moves it through the scheduler.

There is no prefill phase nor decode phase: a request has `num_tokens`
(prompt + generated) and `num_computed_tokens` (those whose KV is in the
cache) and each step moves the second towards the first.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import TYPE_CHECKING, Any

from inflight.outputs import RequestMetrics
from inflight.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, stop token id or stop string (stop_reason says which)
    LENGTH = "length"
    ABORT = "abort"
    TIMEOUT = "timeout"


# one number per Request object: a request id can be reused once its request finished, while
# (async scheduling) a step with a row of the old one is still running (ScheduledRequest.serial)
_serials = itertools.count()


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        priority: int = 5,
        timeout_s: float = 600.0,
        arrival_time: float | None = None,
        eos_token_ids: tuple[int, ...] = (),
        max_tokens: int = 16,
    ) -> None:
        self.request_id = request_id
        self.serial = next(_serials)
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.deadline = self.arrival_time + timeout_s
        self.max_tokens = max_tokens  # already capped by the model length
        self.eos_token_ids = eos_token_ids
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.cumulative_logprob = 0.0
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        # tokens of all_token_ids the runner holds (0: it has never seen this request): the
        # scheduler sends the rest with the next piece (outputs.ScheduledRequest.new_token_ids)
        self.num_sent_tokens = 0
        # async scheduling (engine/llm_engine.py): tokens the runner samples in a step that is
        # still running; num_computed_tokens already counts that step's piece (core/scheduler.py)
        self.num_pending = 0
        # banned token sequences: params.bad_words_ids plus the engine's tokenization of bad_words
        self.bad_words_ids: list[list[int]] = list(params.bad_words_ids or [])
        # n / best_of: siblings wait (held) until the first sequence has computed the prompt,
        # then fork from it, sharing its full prompt blocks (see KVCacheManager.fork)
        self.parent_id: str | None = None
        self.held = False
        # p-tuning: prompt ids >= vocab size read row (id - vocab size) of this (P, hidden) table
        self.prompt_embedding_table: torch.Tensor | None = None
        self.cache_salt = b""  # keys the prefix cache on whatever besides token ids shapes the KV
        # images / videos (multimodal.inputs.MultiModalItem, by prompt position): the runner
        # encodes them; each item's hash keys the prefix-cache blocks from its first token on
        self.mm_items: list[Any] = []
        self.mrope_positions: Any = None  # (3, prompt len) M-RoPE positions, with mm_items
        self.mrope_delta = 0  # tokens after the prompt run at index + delta
        # speculative decoding with external drafts: verified once, at the first step that
        # reaches the end of the known tokens with budget to spare (core/scheduler.py)
        self.draft_token_ids: list[int] = []
        self.draft_logits: torch.Tensor | None = None  # (K, vocab): sampled drafts verified against them
        self.drafts_proposed = False  # the engine's own proposer made them (spec_decode/); else a client's
        self.num_new_tokens = 0  # tokens appended by the last update (> 1 after accepted drafts)
        # beam search member: the engine's BeamGroup appends its tokens, not the scheduler
        self.beam_group_id: str | None = None
        # structured output: (compiled grammar, banned ids); the runner keeps each sequence's
        # matcher, masks logits with it and reports when the grammar is complete
        self.grammar: Any = None
        self.grammar_terminated = False  # the grammar is complete: the scheduler finishes with "stop"
        # LoRA adapter (lora.registry.LoRARequest): its uid keys the device slots and the prefix cache
        self.lora: Any = None
        self.error: str | None = None  # why the engine failed this request (its output carries it)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def sort_key(self) -> tuple[int, float]:
        """Scheduling order: priority 1 (highest) .. 5, then arrival."""
        return (self.priority, self.arrival_time)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, prio={self.priority}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
