"""Parsed tool calls -> OpenAI chat message / streaming delta fields."""

from __future__ import annotations

from typing import Any

from inflight.outputs import CompletionOutput
from inflight.tools import ExtractedToolCalls, ToolDelta
from inflight.tools.calls import ToolCall, make_call_id


def tool_finish(ex: ExtractedToolCalls, c: CompletionOutput) -> dict[str, Any]:
    """finish_reason "tool_calls" when the output ended in calls; "error" + an error object when
    the model wrote call markup that does not parse (never returned as content). A call cut by
    max_tokens keeps "length" (OpenAI's semantics): the parser returned it unfinished, no error."""
    if ex.error:
        return {"finish_reason": "error", "error": {"message": f"malformed tool call: {ex.error}", "type": "tool_call_parse_error"}}
    if ex.calls and c.finish_reason == "stop":
        return {"finish_reason": "tool_calls"}
    return {}


def named_cut_off(name: str, text: str) -> ExtractedToolCalls:
    """A named tool_choice cut by max_tokens before the parser saw a whole call: OpenAI still returns
    the call (the name is forced) with the arguments as far as they got ("" before they started)."""
    args = ""
    for key in ('"arguments"', '"parameters"'):  # hermes / mistral, llama3_json
        at = text.find(key)
        if at >= 0:
            rest = text[at + len(key) :].lstrip()
            args = rest[1:].lstrip() if rest.startswith(":") else ""
            break
    return ExtractedToolCalls(None, [ToolCall(name, args, make_call_id())])


def tool_message(ex: ExtractedToolCalls, c: CompletionOutput) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ex.content, "refusal": None}
    if ex.calls:
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in ex.calls
        ]
    return {"message": message} | tool_finish(ex, c)


def tool_delta(deltas: list[ToolDelta]) -> dict[str, Any]:
    """Merge one step's parser events into a chat delta: content and/or tool_calls fragments."""
    out: dict[str, Any] = {}
    text = "".join(d.content for d in deltas if d.content)
    if text:
        out["content"] = text
    calls = []
    for d in deltas:
        if d.index is None:
            continue
        call: dict[str, Any] = {"index": d.index}
        fn: dict[str, Any] = {}
        if d.id is not None:
            call |= {"id": d.id, "type": "function"}
            fn["name"] = d.name
        if d.arguments is not None:
            fn["arguments"] = d.arguments
        call["function"] = fn
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out
