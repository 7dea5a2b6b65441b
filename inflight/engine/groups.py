"""n / best_of: one user request fans out into sibling sequences, and their outputs merge back.

Sequence i runs as its own Request `"{id}#{i}"` on the same `RequestInputs` (seed + i when seeded). Siblings 1.. are
held by the scheduler until sequence 0 has computed the prompt, then fork from it: they
share its full prompt blocks by reference (core/kv_cache_manager.py `fork`). With best_of,
nothing is streamed; when all sequences finish, the n with the highest cumulative logprob
are returned, re-indexed 0..n-1.
"""

from __future__ import annotations

import dataclasses

from inflight.engine.output_processor import OutputProcessor
from inflight.outputs import RequestOutput
from inflight.request import Request


def fan_out(request: Request) -> list[Request]:
    """The request's sequences: they share its inputs; sequence i > 0 is held on sequence 0."""
    first = f"{request.request_id}#0"
    return [
        Request.from_inputs(f"{request.request_id}#{i}", request.inputs, seq_index=i, parent_id=first if i else None)
        for i in range(request.params.num_sequences)
    ]

# per-sequence counts a group's output sums over its sequences (the rest are the first one's)
SUMMED = ("num_tokens_run", "num_draft_tokens", "num_accepted_draft_tokens", "num_drafts")


class SequenceGroup:
    def __init__(self, request: Request, children: list[Request]) -> None:
        self.request = request
        self.children = children
        self.n = request.params.n
        self.best_of = request.params.num_sequences > request.params.n

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finished(self) -> bool:
        return all(c.is_finished for c in self.children)

    def make_output(self, processor: OutputProcessor) -> RequestOutput | None:
        """The merged output, or None while best_of (or final_only) sequences are still running."""
        if (self.best_of or self.request.inputs.final_only) and not self.finished:
            return None
        outs = [processor.make_output(c) for c in self.children]
        completions = [o.outputs[0] for o in outs]
        if self.best_of:
            completions = sorted(completions, key=lambda c: c.cumulative_logprob or 0.0, reverse=True)
            completions = completions[: self.n]
        for i, c in enumerate(completions):
            c.index = i
        first = outs[0]
        return RequestOutput(
            request_id=self.request_id,
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=completions,
            finished=self.finished,
            # sequence 0's figures, but the work of every sequence (what an abort wastes)
            metrics=dataclasses.replace(first.metrics, **{k: sum(getattr(c.metrics, k) for c in self.children) for k in SUMMED}),
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=first.prompt_logprobs,  # sequence 0 computed the prompt
            context_logits=first.context_logits,
        )
