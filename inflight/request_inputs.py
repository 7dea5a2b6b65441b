"""RequestInputs: everything a client asked for, as one frozen record.

Built once by the input processor (engine/input_processor.py) after validation; from then on
nothing changes it. The sequences of one user request share it (n / best_of siblings and the
beams of a search point at the same object), the scheduler reads it through `Request`, and it
reaches the runner once, in `NewRequestData` (it pickles: an `mp` worker or a tensor-parallel
rank gets the same record; siblings sent in one step pickle it once).

Adding a per-request field: a field here, the line of `InputProcessor.make_request` that reads
it from the prompt / options, and the code that uses it (scheduler, runner, sampler). Nothing
in between copies it (docs/ARCHITECTURE.md, "Adding a per-request field").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inflight.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=False)  # eq=False: identity, its tensors have no useful ==
class RequestInputs:
    prompt_token_ids: list[int]  # after placeholder expansion; never mutated
    params: SamplingParams
    prompt: str | None = None  # the text, when the client sent text
    priority: int = 5  # 1 (highest) .. 5
    arrival_time: float = field(default_factory=time.perf_counter)
    timeout_s: float = 600.0  # the request times out at arrival_time + timeout_s
    max_tokens: int = 16  # params.max_tokens capped by the model length
    eos_token_ids: tuple[int, ...] = ()
    # banned token sequences: params.bad_words_ids plus the engine's tokenization of bad_words
    # (None: params.bad_words_ids alone)
    bad_words_ids: list[list[int]] | None = None
    # keys the prefix cache on whatever besides token ids shapes the KV: the client's cache_salt
    # (vLLM: hits only within one salt) and a p-tuning table's digest
    cache_salt: bytes = b""
    # p-tuning: prompt ids >= vocab size read row (id - vocab size) of this (P, hidden) table
    prompt_embedding_table: torch.Tensor | None = None
    # images / videos (multimodal.inputs.MultiModalItem, by prompt position): the runner encodes
    # them; each item's hash keys the prefix-cache blocks from its first token on
    mm_items: tuple[Any, ...] = ()
    mrope_positions: Any = None  # (3, prompt len) M-RoPE positions, with mm_items
    mrope_delta: int = 0  # tokens after the prompt run at index + delta
    # structured output: a structured.backend.GrammarRef (set by compile_grammar, before the
    # request enters the engine); the runner makes each sequence's matcher from it
    grammar: Any = None
    # LoRA adapter (lora.registry.LoRARequest): its uid keys the device slots and the prefix cache;
    # it pickles without its weights (those travel in SchedulerOutput.lora_loads)
    lora: Any = None
    # external drafts, verified once (core/scheduler.py); logits: (K, vocab) float32 or None
    draft_token_ids: tuple[int, ...] = ()
    draft_logits: torch.Tensor | None = None
    # the sampler computes the chosen tokens' logprobs (their sum: cumulative_logprob): asked for
    # (the Python API reports it always; the servers only where their API shows it), or read by
    # logprobs, best_of's ranking or a beam search. A step none of whose rows needs them skips the
    # log-softmax over the vocabulary (sample/sampler.py)
    chosen_logprobs: bool = True
    # vLLM's RequestOutputKind.FINAL_ONLY: the engine makes this request's RequestOutput once, when
    # it finishes (LLM.generate reads nothing else), and detokenizes it then unless stop strings
    # need the text as it grows: at 256 running requests the per-step outputs cost ~2.5 ms a step
    # (benchmarks/offline_host_cost.py)
    final_only: bool = False

    def __post_init__(self) -> None:
        if self.bad_words_ids is None:  # frozen: set once, here
            object.__setattr__(self, "bad_words_ids", list(self.params.bad_words_ids or []))

    @property
    def deadline(self) -> float:
        return self.arrival_time + self.timeout_s

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def sequence_seed(self, index: int) -> int | None:
        """The seed of sequence `index` of the request (n / best_of: seed + i, as before)."""
        seed = self.params.seed
        return None if seed is None else (seed + index) % 2**64
