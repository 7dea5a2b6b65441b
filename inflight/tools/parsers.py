"""Tool-call formats: Hermes (Qwen2.5 / Qwen3), Llama 3 JSON, Mistral.

A `ToolParser` is stateless: it extracts calls from a finished output,
gives a `ToolStreamParser` (formats.py) for one generation, renders calls the
way the model writes them, and tells the grammar layer what text surrounds a
call's arguments object (`call_begin` + arguments + `call_end`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from inflight.tools.calls import ExtractedToolCalls
from inflight.tools.formats import (
    ARGS,
    HERMES_CLOSE,
    HERMES_OPEN,
    PYTHON_TAG,
    TOOL_CALLS,
    HermesStreamParser,
    Llama3JsonStreamParser,
    MistralStreamParser,
)
from inflight.tools.stream import ToolStreamParser


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class ToolParser(ABC):
    """One tool-call format. Stateless; `streamer()` gives a parser for one generation."""

    name: ClassVar[str]
    trigger: ClassVar[str]  # the text that starts any call
    triggers: ClassVar[tuple[str, ...]]  # the canonical texts that start a call (trigger first)

    def extract(self, text: str, truncated: bool = False) -> ExtractedToolCalls:
        """Split a finished output into content and calls (`truncated`: cut by max_tokens)."""
        parser = self.streamer()
        parser.feed(text)
        return parser.finish(truncated)[1]

    @abstractmethod
    def streamer(self) -> ToolStreamParser: ...

    @abstractmethod
    def call_begin(self, function_name: str) -> str:
        """What the model writes before a call's arguments object."""

    @abstractmethod
    def call_end(self) -> str:
        """What the model writes after a call's arguments object."""

    @abstractmethod
    def format_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """Render (name, arguments) calls the way the model writes them."""


class HermesToolParser(ToolParser):
    name = "hermes"
    trigger = HERMES_OPEN
    triggers = (HERMES_OPEN,)

    def streamer(self) -> ToolStreamParser:
        return HermesStreamParser()

    def call_begin(self, function_name: str) -> str:
        return f'{HERMES_OPEN}\n{{"name": {_dumps(function_name)}, "arguments": '

    def call_end(self) -> str:
        return "}\n" + HERMES_CLOSE

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(self.call_begin(n) + _dumps(a) + self.call_end() for n, a in calls)


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    trigger = '{"name"'
    triggers = ('{"name"', PYTHON_TAG)

    def streamer(self) -> ToolStreamParser:
        return Llama3JsonStreamParser()

    def call_begin(self, function_name: str) -> str:
        return f'{{"name": {_dumps(function_name)}, "parameters": '

    def call_end(self) -> str:
        return "}"

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "; ".join(self.call_begin(n) + _dumps(a) + self.call_end() for n, a in calls)


class MistralToolParser(ToolParser):
    """Reads both layouts; `v11` picks the one the constraint helpers and renderer write."""

    name = "mistral"
    trigger = TOOL_CALLS
    triggers = (TOOL_CALLS,)

    def __init__(self, v11: bool = False) -> None:
        self.v11 = v11  # tokenizer v11+ (Mistral Small 3.1+, Devstral, ...): name[ARGS]{...}

    def streamer(self) -> ToolStreamParser:
        return MistralStreamParser()

    def call_begin(self, function_name: str) -> str:
        if self.v11:
            return f"{TOOL_CALLS}{function_name}{ARGS}"
        return f'{TOOL_CALLS}[{{"name": {_dumps(function_name)}, "arguments": '

    def call_end(self) -> str:
        return "" if self.v11 else "}]"

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        if self.v11:
            return "".join(self.call_begin(n) + _dumps(a) for n, a in calls)
        items = ", ".join(_dumps({"name": n, "arguments": a}) for n, a in calls)
        return f"{TOOL_CALLS}[{items}]"


# ---------------------------------------------------------------------- registry
_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}
PARSER_NAMES: tuple[str, ...] = tuple(_PARSERS)


def get_parser(name: str) -> ToolParser:
    """A parser by name; ValueError listing the valid names for anything else."""
    try:
        return _PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool call parser {name!r}; choose one of {', '.join(PARSER_NAMES)}"
        ) from None


def detect_parser(chat_template: str | None) -> str | None:
    """Guess the format from the markup a chat template writes; None when it shows none."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if TOOL_CALLS in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template:
        return "llama3_json"
    if '"parameters"' in chat_template and any(
        marker in chat_template for marker in ("ipython", "<|eom_id|>", "tool_call")
    ):
        return "llama3_json"
    return None
