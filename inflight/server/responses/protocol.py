"""A /v1/responses body -> the chat-completions body its engine request is built from.

Honoured: `input` (a string, or items: messages with input_text / output_text / input_image
parts, function_call, function_call_output; reasoning items are dropped from the prompt, as chat
templates drop past thinking), `instructions`, `max_output_tokens`, `temperature`, `top_p`,
`text.format` (text, json_object, json_schema), function `tools`, `tool_choice`,
`parallel_tool_calls`, `reasoning.effort` (-> the thinking budget), `store`,
`previous_response_id`, `metadata`, `stream`, `user`, `truncation`, and this server's chat extensions (top_k,
min_p, seed, stop, priority, timeout, ...) as on /v1/chat/completions. Anything else OpenAI defines
is a 400 naming it unless it asks for nothing (`REFUSED`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from inflight.reasoning import ReasoningParser
from inflight.sampling_params import ParamError
from inflight.server.fields import (
    MAX_TOKENS,
    get_bool,
    get_dict,
    get_float,
    get_int,
    get_list,
    get_str,
)
from inflight.server.openai.protocol import CHAT_FIELDS
from inflight.server.openai.reasoning_output import effort_budget

# OpenAI fields with the values that ask for nothing: any other value is a 400 naming the field
REFUSED: dict[str, tuple[Any, ...]] = {
    "background": (False,), "conversation": (), "prompt": (), "include": ([],), "top_logprobs": (0,),
    "truncation": ("disabled", "auto"), "service_tier": ("auto", "default"), "max_tool_calls": (),
    "stream_options": ({}, {"include_obfuscation": False}), "context_management": (),
}  # fmt: skip
# chat-completions names a Responses client should not send (OpenAI answers "Unknown parameter")
CHAT_ONLY = ("messages", "max_tokens", "max_completion_tokens", "response_format", "n", "best_of", "logprobs",
             "functions", "function_call", "echo", "use_beam_search", "include_reasoning", "thinking_token_budget", "reasoning_effort")  # fmt: skip
# this API's own names: translated below, never passed on as chat fields
OWN = ("input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "reasoning", "store",
       "previous_response_id", "metadata", "prompt_cache_key", "safety_identifier", *REFUSED)  # fmt: skip


# The keys OpenAI defines on each object (ids and status: items and parts a client echoes back from
# an earlier response); any other is a 400 in its words, as on the top level
ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}  # fmt: skip
PART_KEYS = {"input_text": {"type", "text"}, "output_text": {"type", "text", "annotations", "logprobs"}, "text": {"type", "text"},
             "input_image": {"type", "image_url", "detail"}}  # fmt: skip
FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "name", "schema", "strict", "description"}}


def known(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    """OpenAI's answer to a key it does not define: `Unknown parameter: 'reasoning.foo'.`"""
    for key in obj:
        if key not in allowed:
            raise ParamError(f"Unknown parameter: '{where}.{key}'.", f"{where}.{key}", code="unknown_parameter")


@dataclass
class ResponsesRequest:
    chat_body: dict[str, Any]  # what the engine request is built from (ChatRun)
    turn: list[dict[str, Any]]  # this turn's chat messages, after the previous response's, no instructions
    budget: int | None  # thinking tokens allowed (reasoning.effort)
    store: bool
    stream: bool
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response object repeats
    input_items: list[dict[str, Any]] = field(default_factory=list)  # `input` as items with ids (GET input_items)


def parse(body: dict[str, Any], history: list[dict[str, Any]], think: ReasoningParser | None) -> ResponsesRequest:
    """`history`: the chat messages of the previous response's conversation (none: [])."""
    _check_names(body)
    get_float(body, "temperature", lo=0.0, hi=2.0)  # OpenAI's range (chat's own check has no ceiling)
    chat = {k: v for k, v in body.items() if k not in OWN}
    for name in ("prompt_cache_key", "safety_identifier"):
        get_str(body, name)  # hints: the prefix cache is automatic; no abuse monitoring here
    instructions = get_str(body, "instructions")
    turn = [*history, *input_messages(body.get("input"))]
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + turn
    if body.get("truncation") == "auto":  # too long for the context: the beginning goes (OpenAI drops early items)
        chat["truncate_prompt_tokens"], chat["truncation_side"] = -1, "left"
    max_out = get_int(body, "max_output_tokens", lo=1, hi=MAX_TOKENS)
    if max_out is not None:
        chat["max_tokens"] = max_out
    fmt = text_format(get_dict(body, "text"))
    if fmt is not None:
        chat["response_format"] = fmt
    tools = _tools(get_list(body, "tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    budget, effort, summary = _reasoning(get_dict(body, "reasoning"), think)
    metadata = get_dict(body, "metadata") or {}
    if len(metadata) > 16 or not all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
        raise ParamError("metadata: at most 16 string values (keys up to 64, values up to 512 characters)", "metadata")
    echo = {
        "instructions": instructions, "max_output_tokens": max_out, "metadata": metadata,
        "parallel_tool_calls": bool(get_bool(body, "parallel_tool_calls", True)),
        "previous_response_id": get_str(body, "previous_response_id"),
        "reasoning": {"effort": effort, "summary": summary}, "temperature": get_float(body, "temperature", 1.0),
        "text": {"format": (get_dict(body, "text") or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto", "tools": get_list(body, "tools") or [],
        "top_p": get_float(body, "top_p", 1.0), "truncation": body.get("truncation") or "disabled", "user": get_str(body, "user"),
    }  # fmt: skip
    store, stream = bool(get_bool(body, "store", True)), bool(get_bool(body, "stream", False))
    return ResponsesRequest(chat, turn, budget, store, stream, echo, _items(body["input"]))


def _check_names(body: dict[str, Any]) -> None:
    """The top level's names: refused values, chat-only names, unknown names."""
    for name, accepted in REFUSED.items():
        if body.get(name) is not None and body[name] not in accepted:
            raise ParamError(f"{name}: not supported by this server", name)
    for name in CHAT_ONLY:
        if name in body:
            raise ParamError(f"{name}: not a Responses API field (see max_output_tokens, text.format, reasoning)", name)
    for name in body:  # OpenAI's answer to a name it does not know, body and all
        if name not in OWN and name not in CHAT_FIELDS:
            raise ParamError(f"Unknown parameter: '{name}'.", name, code="unknown_parameter")


def _items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input` (valid by now) as OpenAI lists it back: items with ids, messages with content parts."""
    raw = [{"role": "user", "content": value}] if isinstance(value, str) else value
    out = []
    for item in raw:
        item = {"type": "message", **item}
        if item["type"] == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(item["type"], "rs")
        out.append({"id": f"{prefix}_{uuid.uuid4().hex}", **item} if "id" not in item else item)
    return out


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` -> chat messages: a string is one user message; items in order."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ParamError("input: must be a string or a non-empty array of input items", "input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ParamError(f"input[{i}]: must be an object", f"input[{i}]")
        kind = item.get("type", "message")
        if kind in ITEM_KEYS:
            known(item, ITEM_KEYS[kind], f"input[{i}]")
        if kind == "message":
            out.append(_message(item, i))
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", i), "type": "function",
                    "function": {"name": _str(item, "name", i), "arguments": _str(item, "arguments", i)}}  # fmt: skip
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output) if output is not None else ""
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", i), "content": text})
        elif kind != "reasoning":  # past thinking: templates drop it from the prompt
            raise ParamError(f"input[{i}].type: {kind!r} is not supported (message, function_call, function_call_output, reasoning)", f"input[{i}].type")
    return out


def _str(item: dict[str, Any], name: str, i: int) -> str:
    v = item.get(name)
    if not isinstance(v, str):
        raise ParamError(f"input[{i}].{name}: required (a string)", f"input[{i}].{name}")
    return v


def _message(item: dict[str, Any], i: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ParamError(f"input[{i}].role: must be user, assistant, system or developer", f"input[{i}].role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ParamError(f"input[{i}].content: must be a string or an array of content parts", f"input[{i}].content")
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        where = f"input[{i}].content[{j}]"
        if kind in PART_KEYS:
            known(p, PART_KEYS[kind], where)
        if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            raise ParamError(f"{where}: must be input_text / output_text with text, or input_image with image_url", where)
    return {"role": role, "content": parts}


def text_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` -> chat's response_format (None: plain text)."""
    if not text:
        return None
    if set(text) - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise ParamError("text: only format is supported (verbosity medium)", "text")
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") in FORMAT_KEYS:
        known(fmt, FORMAT_KEYS[fmt["type"]], "text.format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise ParamError("text.format.type: must be text, json_object or json_schema", "text.format")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def _tools(tools: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise ParamError(f"tools[{i}].type: only function tools are supported", f"tools[{i}].type")
        known(t, {"type", "name", "description", "parameters", "strict"}, f"tools[{i}]")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        known(choice, {"type", "name"}, "tool_choice")
        if not isinstance(choice.get("name"), str):
            raise ParamError("tool_choice.name: required (a string) with type function", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("auto", "none", "required"):
        return choice
    raise ParamError('tool_choice: must be "auto", "none", "required" or {"type": "function", "name": ...}', "tool_choice")


def _reasoning(r: dict[str, Any] | None, think: ReasoningParser | None) -> tuple[int | None, str | None, str | None]:
    """(thinking budget, effort, summary) from `reasoning`."""
    if not r:
        return None, None, None
    known(r, {"effort", "summary", "generate_summary"}, "reasoning")
    effort, summary = r.get("effort"), r.get("summary", r.get("generate_summary"))
    if summary is not None and summary != "auto":  # "auto": the server picks, and gives none
        raise ParamError("reasoning.summary: summaries are not generated here (the thinking itself is returned)", "reasoning.summary")
    if effort is None:
        return None, None, summary
    return effort_budget(effort, think, "reasoning.effort"), effort, summary
