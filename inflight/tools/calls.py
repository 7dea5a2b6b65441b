"""What a tool-call parser returns: calls, the extraction of one output, streaming deltas."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

_ID_ALPHABET = string.ascii_letters + string.digits


def make_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, as the model wrote it (not re-serialized)
    id: str  # make_call_id()


@dataclass
class ExtractedToolCalls:
    content: str | None  # text outside call markup; None if empty or whitespace-only
    calls: list[ToolCall]
    # set when call markup started but is malformed; calls then holds the calls before it
    error: str | None = None


@dataclass
class ToolDelta:
    """One streaming event: content text, or a piece of tool call `index`."""

    content: str | None = None
    index: int | None = None  # 0-based tool call index within the response
    id: str | None = None  # first delta of a call only
    name: str | None = None  # first delta of a call only
    arguments: str | None = None  # a raw fragment of the arguments JSON text
