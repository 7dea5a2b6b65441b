"""Thinking before a constrained answer: the grammar starts after the end-of-thinking token, and a
thinking budget forces that token (vLLM's `thinking_token_budget`).

The server sets `SamplingParams.thinking` for a reasoning model's request that has a grammar or a
budget; the runner keeps one `ThinkingState` per request, fed every sampled token (before the
grammar matcher, which sees only the answer's tokens):

    open --start token first--> thinking --end token (sampled, or forced past the budget)--> answer
      `--any other first token (the grammar's, or the start token: both are allowed)--> answer
"""

from __future__ import annotations

from dataclasses import dataclass

BEGINS = ("thinking", "answer", "open")


@dataclass(frozen=True)
class ThinkingParams:
    start_id: int  # the start-of-thinking token
    end_id: int  # the end-of-thinking token
    # where generation begins: "thinking" (the prompt opened it), "answer" (the prompt closed it),
    # "open" (the first token may open it: Qwen3 writes <think> itself)
    begins: str = "open"
    budget: int | None = None  # thinking tokens allowed (tags not counted); then `end_id` is forced

    def __post_init__(self) -> None:
        if self.begins not in BEGINS:
            raise ValueError(f"thinking.begins: must be one of {BEGINS}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 0):
            raise ValueError("thinking_token_budget: must be an integer >= 0")


class ThinkingState:
    """One request's place in its thinking, advanced by each sampled token."""

    def __init__(self, params: ThinkingParams) -> None:
        self.params = params
        self.phase = params.begins
        self.num_thinking = 0  # tokens sampled inside the thinking, tags excluded

    @property
    def answering(self) -> bool:
        """The grammar applies to the next token (as it is, or with the start token allowed: `open`)."""
        return self.phase != "thinking"

    def must_end(self) -> bool:
        b = self.params.budget
        return self.phase == "thinking" and b is not None and self.num_thinking >= b

    def accept(self, token_id: int) -> bool:
        """Feed a sampled token; True when it belongs to the answer (the grammar's to accept)."""
        p = self.params
        if self.phase == "open":
            if token_id == p.start_id:
                self.phase = "thinking"
                return False
            self.phase = "answer"
            return True
        if self.phase == "thinking":
            if token_id == p.end_id:
                self.phase = "answer"
            elif not (token_id == p.start_id and self.num_thinking == 0):  # R1 may repeat its prompt's tag
                self.num_thinking += 1
            return False
        return True
