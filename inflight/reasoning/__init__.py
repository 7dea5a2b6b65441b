"""Reasoning models: split thinking from the answer (pure Python; server/ and engine read it)."""

from inflight.reasoning.parsers import (
    PARSER_NAMES,
    ReasoningParser,
    ReasoningSplit,
    detect_reasoning_parser,
    get_reasoning_parser,
    resolve_reasoning_parser,
)
from inflight.reasoning.stream import ReasoningStreamer

__all__ = [
    "PARSER_NAMES",
    "ReasoningParser",
    "ReasoningSplit",
    "ReasoningStreamer",
    "detect_reasoning_parser",
    "get_reasoning_parser",
    "resolve_reasoning_parser",
]
