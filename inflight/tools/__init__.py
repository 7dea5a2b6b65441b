"""Tool calls in model output: extraction, streaming deltas, and format helpers (pure Python)."""

from inflight.tools.calls import ExtractedToolCalls, ToolCall, ToolDelta, make_call_id
from inflight.tools.parsers import (
    PARSER_NAMES,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ToolParser,
    detect_parser,
    get_parser,
)
from inflight.tools.stream import ToolStreamParser

__all__ = [
    "PARSER_NAMES",
    "ExtractedToolCalls",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ToolCall",
    "ToolDelta",
    "ToolParser",
    "ToolStreamParser",
    "detect_parser",
    "get_parser",
    "make_call_id",
]
