"""Reasoning parsers: vLLM's `--reasoning-parser` names over one tag-pair parser.

    qwen3        <think>...</think>; thinking only when the output (or the prompt) opens it, so
                 `chat_template_kwargs: {"enable_thinking": false}` (the template then closes an
                 empty <think></think> in the prompt) gives an answer with no reasoning
    deepseek_r1  <think>...</think>; the output starts inside thinking (R1's template opens it)
                 unless the prompt closed it; an output with no end tag is all reasoning
    tags         any start / end token strings (`--reasoning-start-token`, `--reasoning-end-token`)

Where a generation begins is read from the prompt's tail: a prompt ending in the start tag
(Qwen3-Thinking-2507, newer R1 templates) begins in thinking, one ending in the end tag begins in
the answer, otherwise the parser's default holds. The tags must each be one token of the
vocabulary (as vLLM requires): the thinking budget forces the end token and the grammar of
structured output starts after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from inflight.reasoning.stream import ReasoningStreamer

logger = logging.getLogger(__name__)

PARSER_NAMES = ("qwen3", "deepseek_r1", "tags")
THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: this output had no thinking section
    content: str | None  # None: nothing after the thinking (cut by max_tokens, or a budget of 0 answer)


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str
    end: str
    start_id: int
    end_id: int
    default_in_reasoning: bool  # deepseek_r1: True
    special: bool  # the tags are special tokens: requests must keep them in the text

    def begins(self, prompt_tail: str) -> str:
        """Where a generation after this prompt starts (`prompt_tail`: its last few tokens, decoded
        with specials): "thinking", "answer" (the prompt closed the thinking) or "open" (the
        output may open it)."""
        tail = prompt_tail.rstrip()
        if tail.endswith(self.start):
            return "thinking"
        if tail.endswith(self.end):
            return "answer"
        return "thinking" if self.default_in_reasoning else "open"

    def begins_in_reasoning(self, prompt_tail: str) -> bool:
        return self.begins(prompt_tail) == "thinking"

    def streamer(self, in_reasoning: bool) -> ReasoningStreamer:
        return ReasoningStreamer(self.start, self.end, in_reasoning)

    def split(self, text: str, in_reasoning: bool) -> ReasoningSplit:
        st = self.streamer(in_reasoning)
        r1, c1 = st.feed(text)
        r2, c2 = st.finish()
        reasoning, content = r1 + r2, c1 + c2
        if not st.saw_reasoning:
            return ReasoningSplit(None, content)
        return ReasoningSplit(reasoning, content or None)

    def count_reasoning_tokens(self, token_ids: list[int], in_reasoning: bool) -> int:
        """Tokens of the thinking section, its tags included (OpenAI's `reasoning_tokens`)."""
        if not in_reasoning:
            head = token_ids[:4]  # the start tag comes first, after a whitespace token at most
            if self.start_id not in head:
                return 0
        try:
            return token_ids.index(self.end_id) + 1
        except ValueError:
            return len(token_ids)


def _vocab(tok: Any) -> dict[str, int]:
    try:
        return dict(tok.get_vocab())
    except (AttributeError, NotImplementedError, TypeError):
        return {}


def get_reasoning_parser(name: str, tok: Any, start: str | None = None, end: str | None = None) -> ReasoningParser:
    """The parser `name` for this tokenizer; ValueError when its tags are not tokens of it."""
    if name not in PARSER_NAMES:
        raise ValueError(f"reasoning_parser: {name!r} is not one of {', '.join(PARSER_NAMES)}")
    if name == "tags":
        if not start or not end:
            raise ValueError("reasoning_parser tags: needs --reasoning-start-token and --reasoning-end-token")
    else:
        start, end = THINK
    assert start is not None and end is not None
    vocab = _vocab(tok) if tok is not None else {}
    missing = [t for t in (start, end) if t not in vocab]
    if missing:
        raise ValueError(f"reasoning_parser {name}: {missing} not a token of this model's vocabulary")
    specials = set(getattr(tok, "all_special_tokens", []) or [])
    return ReasoningParser(name, start, end, vocab[start], vocab[end], name == "deepseek_r1",
                           start in specials or end in specials)  # fmt: skip


def detect_reasoning_parser(tok: Any) -> str | None:
    """The parser a chat template shows: <think> tags that are tokens (DeepSeek-R1's markers: deepseek_r1)."""
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str) or THINK[0] not in template or THINK[1] not in template:
        return None
    vocab = _vocab(tok)
    if any(t not in vocab for t in THINK):
        return None
    return "deepseek_r1" if "Assistant｜>" in template else "qwen3"


def resolve_reasoning_parser(name: str | None, tok: Any, start: str | None = None, end: str | None = None) -> ReasoningParser | None:
    """The configured parser, else the one the chat template shows (logged), else None."""
    if name is None:
        name = detect_reasoning_parser(tok)
        if name is None:
            return None
        logger.info("reasoning parser %s: detected from the chat template (--reasoning-parser to choose)", name)
    return get_reasoning_parser(name, tok, start, end)
