"""A reasoning model's chat reply: thinking in `reasoning_content` (and vLLM's newer `reasoning`),
the answer in `content`, `usage.completion_tokens_details.reasoning_tokens`.

The split runs before tool-call parsing: calls are read from the answer only. `include_reasoning`
false (vLLM) drops the thinking from the reply; it is still counted in usage.
"""

from __future__ import annotations

from typing import Any

from inflight.outputs import RequestOutput
from inflight.reasoning import ReasoningParser, ReasoningStreamer
from inflight.sampling_params import ParamError, SamplingParams
from inflight.server.fields import get_int
from inflight.structured.thinking import ThinkingParams

PROMPT_TAIL_TOKENS = 8  # enough for "<think>\n\n</think>\n\n" at the prompt's end in any tokenizer we know


def prompt_tail(tok: Any, prompt_token_ids: list[int]) -> str:
    """The prompt's last tokens as text, special tokens kept (where the template left off)."""
    return str(tok.decode(prompt_token_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False))


class ChatReasoning:
    """One response's split: a streamer per choice, and the usage figure."""

    def __init__(self, parser: ReasoningParser, tail: str, include: bool = True) -> None:
        self.parser = parser
        self.in_reasoning = parser.begins_in_reasoning(tail)
        self.include = include
        self.streamers: dict[int, ReasoningStreamer] = {}

    def whole(self, text: str) -> tuple[dict[str, Any], str | None]:
        """(message fields, the answer text; None when the output had only thinking)."""
        split = self.parser.split(text, self.in_reasoning)
        return self.fields(split.reasoning), split.content

    def delta(self, index: int, text: str, finished: bool) -> tuple[dict[str, Any], str]:
        """(delta fields, the answer's new text) of one streamed choice."""
        st = self.streamers.get(index)
        if st is None:
            st = self.streamers[index] = self.parser.streamer(self.in_reasoning)
        reasoning, content = st.feed(text)
        if finished:
            more_reasoning, more_content = st.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        return self.fields(reasoning or None), content

    def fields(self, reasoning: str | None) -> dict[str, Any]:
        if reasoning is None or not self.include:
            return {}
        return {"reasoning_content": reasoning, "reasoning": reasoning}

    def num_tokens(self, outs: list[RequestOutput]) -> int:
        return sum(self.parser.count_reasoning_tokens(c.token_ids, self.in_reasoning) for o in outs for c in o.outputs)


# OpenAI's reasoning effort -> thinking tokens allowed (OpenAI gives no numbers; these follow the
# spacing of Anthropic's budget_tokens examples). "none": the answer at once.
EFFORT_BUDGET = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768}


def effort_budget(effort: Any, parser: ReasoningParser | None, name: str) -> int:
    """The thinking budget an OpenAI `reasoning_effort` / `reasoning.effort` stands for."""
    if not isinstance(effort, str) or effort not in EFFORT_BUDGET:
        raise ParamError(f"{name}: must be one of {', '.join(EFFORT_BUDGET)}", name)
    if parser is None:
        raise ParamError(f"{name}: this model has no reasoning parser (start the server with --reasoning-parser)", name)
    return EFFORT_BUDGET[effort]


def thinking_budget(body: dict[str, Any], parser: ReasoningParser | None, name: str = "thinking_token_budget") -> int | None:
    """vLLM's `thinking_token_budget`: thinking tokens allowed before the end tag is forced; else
    OpenAI's `reasoning_effort` (chat) as a budget (EFFORT_BUDGET)."""
    budget = get_int(body, name, lo=0)
    if budget is not None and parser is None:
        raise ParamError(f"{name}: this model has no reasoning parser (start the server with --reasoning-parser)", name)
    if budget is None and body.get("reasoning_effort") is not None:
        budget = effort_budget(body["reasoning_effort"], parser, "reasoning_effort")
    return budget


def set_thinking(params: SamplingParams, parser: ReasoningParser | None, tail: str, budget: int | None) -> None:
    """Tell the runner about the thinking when it matters: a grammar (which starts after it) or a budget."""
    if parser is None or (params.structured_outputs is None and budget is None):
        return
    if params.is_beam_search:
        raise ParamError("thinking_token_budget: not available with beam search", "thinking_token_budget")
    params.thinking = ThinkingParams(parser.start_id, parser.end_id, parser.begins(tail), budget)
