"""Request: one prompt's state as the engine moves it through the scheduler.

What the client asked for is a frozen `RequestInputs` (request_inputs.py), shared by the
sequences of one user request; `Request` holds the rest: scheduler and output state.

There is no prefill phase nor decode phase: a request has `num_tokens`
(prompt + generated) and `num_computed_tokens` (those whose KV is in the
cache) and each step moves the second towards the first.
"""

from __future__ import annotations

import enum
import itertools
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from inflight.outputs import RequestMetrics
from inflight.request_inputs import RequestInputs
from inflight.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


# the sort key of scheduling order (`Request.sort_key` without the call): the scheduler sorts its
# running set by it every step (core/scheduler.py) and its waiting set at admission (core/admission.py)
order_key = attrgetter("order")


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
    """The scheduler's and the output path's state of one sequence; what the client asked for is
    `inputs` (read through the properties below). Written by core/ and the engine's step and
    output path only (tests/unit/test_request_writers.py)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        timeout_s: float = 600.0,
        arrival_time: float | None = None,
        **inputs: Any,
    ) -> None:
        """A request from its inputs' fields (tests, offline code); the engine uses `from_inputs`."""
        if arrival_time is not None:
            inputs["arrival_time"] = arrival_time
        self._start(request_id, RequestInputs(list(prompt_token_ids), params, timeout_s=timeout_s, **inputs))

    @classmethod
    def from_inputs(
        cls,
        request_id: str,
        inputs: RequestInputs,
        *,
        seq_index: int = 0,
        parent_id: str | None = None,
        output_token_ids: list[int] | None = None,
        cumulative_logprob: float = 0.0,
        beam_group_id: str | None = None,
    ) -> Request:
        """A sequence of `inputs`: sibling `seq_index` held on `parent_id` (n / best_of), or a beam
        of search `beam_group_id` with its tokens and score so far."""
        self = cls.__new__(cls)
        self._start(request_id, inputs, seq_index, parent_id)
        for t in output_token_ids or ():
            self.append_token(t)
        self.cumulative_logprob = cumulative_logprob
        self.beam_group_id = beam_group_id
        return self

    def _start(self, request_id: str, inputs: RequestInputs, seq_index: int = 0, parent_id: str | None = None) -> None:
        self.request_id = request_id
        self.inputs = inputs
        # scheduling order: priority 1 (highest) .. 5, then arrival; fixed (inputs are frozen), kept
        # as a tuple because the scheduler sorts the running set by it every step
        self.order = (inputs.priority, inputs.arrival_time)
        self.serial = next(_serials)
        self.seq_index = seq_index  # n / best_of: which sibling (its seed is seed + index)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(inputs.prompt_token_ids)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.cumulative_logprob = 0.0
        self.metrics = RequestMetrics(arrival_time=inputs.arrival_time)
        # tokens of all_token_ids the runner holds (0: it has never seen this request): the
        # scheduler sends the rest with the next piece (outputs.ScheduledRequest.new_token_ids)
        self.num_sent_tokens = 0
        self.num_sent_blocks = 0  # of block_ids, likewise (ScheduledRequest.new_block_ids)
        # async scheduling (engine/llm_engine.py): tokens the runner samples in a step that is
        # still running; num_computed_tokens already counts that step's piece (core/scheduler.py)
        self.num_pending = 0
        # n / best_of: siblings wait (held) until the first sequence has computed the prompt,
        # then fork from it, sharing its full prompt blocks (see KVCacheManager.fork)
        self.parent_id = parent_id
        self.held = parent_id is not None
        # speculative decoding with external drafts: verified once, at the first step that
        # reaches the end of the known tokens with budget to spare (core/scheduler.py)
        self.draft_token_ids: list[int] = list(inputs.draft_token_ids)
        self.draft_logits: torch.Tensor | None = inputs.draft_logits
        self.drafts_proposed = False  # the engine's own proposer made them (spec_decode/); else a client's
        self.num_lookahead = 0  # draft model: drafts the runner proposes after this step (spec_decode/)
        self.num_new_tokens = 0  # tokens appended by the last update (> 1 after accepted drafts)
        # beam search member: the engine's BeamGroup appends its tokens, not the scheduler
        self.beam_group_id: str | None = None
        self.grammar_terminated = False  # the grammar is complete: the scheduler finishes with "stop"
        self.error: str | None = None  # why the engine failed this request (its output carries it)

    # ------------------------------------------------------------ what the client asked for
    @property
    def params(self) -> SamplingParams:
        return self.inputs.params

    @property
    def prompt(self) -> str | None:
        return self.inputs.prompt

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.inputs.prompt_token_ids

    @property
    def priority(self) -> int:
        return self.inputs.priority

    @property
    def arrival_time(self) -> float:
        return self.inputs.arrival_time

    @property
    def deadline(self) -> float:
        return self.inputs.deadline

    @property
    def max_tokens(self) -> int:
        return self.inputs.max_tokens

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.inputs.eos_token_ids

    @property
    def bad_words_ids(self) -> list[list[int]]:
        return self.inputs.bad_words_ids  # type: ignore[return-value]  # set in __post_init__

    @property
    def cache_salt(self) -> bytes:
        return self.inputs.cache_salt

    @property
    def prompt_embedding_table(self) -> torch.Tensor | None:
        return self.inputs.prompt_embedding_table

    @property
    def mm_items(self) -> tuple[Any, ...]:
        return self.inputs.mm_items

    @property
    def mrope_positions(self) -> Any:
        return self.inputs.mrope_positions

    @property
    def mrope_delta(self) -> int:
        return self.inputs.mrope_delta

    @property
    def grammar(self) -> Any:
        return self.inputs.grammar

    @property
    def lora(self) -> Any:
        return self.inputs.lora

    # ------------------------------------------------------------ state
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
        return self.order

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def drop_last(self, dropped: list[float]) -> None:
        """Take back the newest len(dropped) tokens (their logprobs): a stop string ended the text
        before them (a step that brought several: accepted drafts, multi-step decodes)."""
        k = len(dropped)
        del self.output_token_ids[-k:], self.all_token_ids[-k:]
        del self.metrics.token_times[-k:], self.metrics.batch_sizes[-k:]
        self.cumulative_logprob -= sum(dropped)
        self.num_new_tokens -= k

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, prio={self.priority}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
