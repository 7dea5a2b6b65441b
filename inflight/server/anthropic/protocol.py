"""A /v1/messages body -> the chat-completions body its engine request is built from.

Honoured: `model`, `messages` (text / image / tool_use / tool_result blocks; thinking and
redacted_thinking blocks are dropped from the prompt, as chat templates drop past thinking),
`system`, `max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k`, `tools`
(custom tools), `tool_choice` (auto / any / tool / none, `disable_parallel_tool_use`), `thinking`
(enabled + budget_tokens, adaptive, disabled), `output_config` (`format` json_schema, `effort`),
`metadata`, `stream`, `service_tier` auto / standard_only, and this server's chat extensions
(seed, min_p, priority, timeout, ...). Other Anthropic fields are a 400 naming them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from inflight.reasoning import ReasoningParser
from inflight.sampling_params import ParamError
from inflight.server.fields import MAX_TOKENS, get_bool, get_dict, get_float, get_int, get_list
from inflight.server.openai.protocol import CHAT_FIELDS

MIN_THINKING_BUDGET = 1024
EFFORT_BUDGET = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": None}
REFUSED: dict[str, tuple[Any, ...]] = {
    "container": (), "mcp_servers": ([],), "context_management": (), "cache_control": (), "inference_geo": (),
    "service_tier": ("auto", "standard_only"), "speed": ("standard",), "diagnostics": (),
}  # fmt: skip
CHAT_ONLY = ("max_completion_tokens", "response_format", "n", "best_of", "logprobs", "stop", "tools_choice")
OWN = ("messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking", "output_config",
       "metadata", *REFUSED)  # fmt: skip


# The keys Anthropic defines on each object (cache_control and citations: hints, the prefix cache is
# automatic); any other is a 400 in its words, as on the top level
BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"}, "image": {"type", "source", "cache_control"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"}, "redacted_thinking": {"type", "data"},
}  # fmt: skip
THINKING_KEYS = {"enabled": {"type", "budget_tokens"}, "adaptive": {"type"}, "disabled": {"type"}}
TOOL_KEYS = {"type", "name", "description", "input_schema", "strict", "cache_control"}
TOOL_CHOICE_KEYS = {"auto": {"type", "disable_parallel_tool_use"}, "any": {"type", "disable_parallel_tool_use"},
                    "tool": {"type", "name", "disable_parallel_tool_use"}, "none": {"type"}}  # fmt: skip


def known(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    """Anthropic's answer to a key it does not define: `thinking.foo: Extra inputs are not permitted`."""
    for key in obj:
        if key not in allowed:
            raise ParamError(f"{where}.{key}: Extra inputs are not permitted", f"{where}.{key}")


@dataclass
class MessagesRequest:
    chat_body: dict[str, Any]
    budget: int | None  # thinking tokens allowed
    stream: bool


def _check_names(body: dict[str, Any]) -> None:
    """The top level's names: refused values, chat-only names, unknown names, `model`."""
    for name, accepted in REFUSED.items():
        if body.get(name) is not None and body[name] not in accepted:
            raise ParamError(f"{name}: not supported by this server", name)
    for name in CHAT_ONLY:
        if name in body:
            raise ParamError(f"{name}: not a Messages API field", name)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ParamError("model: required (a string)", "model")
    for name in body:  # Anthropic's answer to a name it does not know
        if name not in OWN and name not in CHAT_FIELDS:
            raise ParamError(f"{name}: Extra inputs are not permitted", name)


def parse(body: dict[str, Any], think: ReasoningParser | None, count_only: bool = False) -> MessagesRequest:
    _check_names(body)
    _sampling(body)
    chat = {k: v for k, v in body.items() if k not in OWN}
    max_tokens = get_int(body, "max_tokens", lo=1, hi=MAX_TOKENS)
    if max_tokens is None and not count_only:
        raise ParamError("max_tokens: Field required", "max_tokens")
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    chat["messages"] = _system(body.get("system")) + messages(body.get("messages"))
    stops = get_list(body, "stop_sequences")
    if stops and not all(isinstance(x, str) for x in stops):
        raise ParamError("stop_sequences: must be an array of strings", "stop_sequences")
    if stops:
        chat["stop"] = stops
    tools = _tools(get_list(body, "tools"))
    if tools:
        chat["tools"] = tools
    choice = get_dict(body, "tool_choice")
    if choice is not None:
        chat["tool_choice"], parallel = _tool_choice(choice)
        if tools and parallel is not None:
            chat["parallel_tool_calls"] = parallel
    metadata = get_dict(body, "metadata") or {}  # user_id: abuse monitoring there; nothing to do here
    if set(metadata) - {"user_id"} or not isinstance(metadata.get("user_id", ""), (str, type(None))):
        raise ParamError("metadata: only user_id (a string)", "metadata")
    budget = _thinking(get_dict(body, "thinking"), think, chat)
    if budget and max_tokens is not None and budget >= max_tokens:  # Anthropic's rule
        raise ParamError(f"thinking.budget_tokens: must be less than max_tokens ({max_tokens}), got {budget}", "thinking.budget_tokens")
    out = get_dict(body, "output_config") or {}
    if set(out) - {"format", "effort"}:
        raise ParamError(f"output_config.{sorted(set(out) - {'format', 'effort'})[0]}: not supported", "output_config")
    fmt = out.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ParamError("output_config.format: must be {type: json_schema, schema}", "output_config.format")
        known(fmt, {"type", "schema"}, "output_config.format")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}
    if out.get("effort") is not None:
        if not isinstance(out["effort"], str) or out["effort"] not in EFFORT_BUDGET:
            raise ParamError(f"output_config.effort: must be one of {', '.join(EFFORT_BUDGET)}", "output_config.effort")
        if think is None:
            raise ParamError("output_config.effort: this model has no reasoning parser", "output_config.effort")
        budget = EFFORT_BUDGET[out["effort"]] if budget is None else budget
    return MessagesRequest(chat, budget, bool(get_bool(body, "stream", False)))


def _sampling(body: dict[str, Any]) -> None:
    """Anthropic's ranges, narrower than chat's: temperature and top_p in [0, 1], top_k >= 0."""
    get_float(body, "temperature", lo=0.0, hi=1.0)
    get_float(body, "top_p", lo=0.0, hi=1.0)
    get_int(body, "top_k", lo=0)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in system):
        for i, b in enumerate(system):
            known(b, BLOCK_KEYS["text"], f"system[{i}]")
        return [{"role": "system", "content": "".join(b["text"] for b in system)}]
    raise ParamError("system: must be a string or an array of text blocks", "system")


def messages(value: Any) -> list[dict[str, Any]]:
    """Anthropic messages -> chat messages (tool results become tool messages, in order)."""
    if not isinstance(value, list) or not value:
        raise ParamError("messages: must be a non-empty array", "messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ParamError(f"messages[{i}].role: must be user or assistant", f"messages[{i}].role")
        known(m, {"role", "content"}, f"messages[{i}]")
        content = m.get("content")
        if content in ("", []) and not (i == len(value) - 1 and m["role"] == "assistant"):  # Anthropic's rule
            raise ParamError(f"messages[{i}].content: must be non-empty (only a final assistant message may be empty)", f"messages[{i}].content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise ParamError(f"messages[{i}].content: must be a string or an array of content blocks", f"messages[{i}].content")
        out += _blocks(m["role"], content, i)
    return out


def _blocks(role: str, blocks: list[Any], i: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind in BLOCK_KEYS:
            known(b, BLOCK_KEYS[kind], where)
        if kind == "text" and b.get("text") == "":
            raise ParamError(f"{where}.text: text content blocks must be non-empty", f"{where}.text")
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image(b, where))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                raise ParamError(f"{where}: tool_use needs id, name and an input object", where)
            calls.append({"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": _tool_use_id(b, where), "content": _result_text(b.get("content"), where)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # past thinking: templates drop it from the prompt
        else:
            raise ParamError(f"{where}.type: {kind!r} is not supported in a {role} message", f"{where}.type")
    out: list[dict[str, Any]] = list(results)
    if calls:
        out.append({"role": "assistant", "content": _joined(parts), "tool_calls": calls})
    elif parts or not results:
        out.append({"role": role, "content": parts if any(p["type"] != "text" for p in parts) else _joined(parts) or ""})
    return out


def _joined(parts: list[dict[str, Any]]) -> str | None:
    text = "".join(p.get("text", "") for p in parts)
    return text or None


def _image(b: dict[str, Any], where: str) -> dict[str, Any]:
    src = b.get("source") if isinstance(b.get("source"), dict) else {}
    if src.get("type") == "base64" and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{src['media_type']};base64,{src['data']}"}}
    if src.get("type") == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise ParamError(f"{where}.source: must be base64 (media_type, data) or url", f"{where}.source")


def _tool_use_id(b: dict[str, Any], where: str) -> str:
    if not isinstance(b.get("tool_use_id"), str):
        raise ParamError(f"{where}.tool_use_id: required (a string)", f"{where}.tool_use_id")
    return str(b["tool_use_id"])


def _result_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(c, dict) and c.get("type") == "text" for c in content):
        return "".join(str(c.get("text", "")) for c in content)
    raise ParamError(f"{where}.content: a string or text blocks (images in tool results are not supported)", f"{where}.content")


def _tools(tools: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or not isinstance(t.get("name"), str):
            raise ParamError(f"tools[{i}]: only custom tools (name, input_schema) are supported", f"tools[{i}]")
        known(t, TOOL_KEYS, f"tools[{i}]")
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        if t.get("strict") is not None:
            fn["strict"] = t["strict"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    """(chat tool_choice, parallel_tool_calls or None)."""
    kind = choice.get("type")
    if kind in TOOL_CHOICE_KEYS:
        known(choice, TOOL_CHOICE_KEYS[kind], "tool_choice")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise ParamError("tool_choice.disable_parallel_tool_use: must be a boolean", "tool_choice.disable_parallel_tool_use")
    parallel = None if disable is None else not disable
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise ParamError("tool_choice.type: must be auto, any, tool (with name) or none", "tool_choice")


def _thinking(t: dict[str, Any] | None, think: ReasoningParser | None, chat: dict[str, Any]) -> int | None:
    """The thinking budget; `disabled` closes the thinking in the prompt (Qwen3's enable_thinking)."""
    if t is None:
        return None
    kind = t.get("type")
    if kind in THINKING_KEYS:
        known(t, THINKING_KEYS[kind], "thinking")
    if kind == "disabled":
        if think is not None:
            chat["chat_template_kwargs"] = {**(get_dict(chat, "chat_template_kwargs") or {}), "enable_thinking": False}
            return 0  # a template with no switch: the end tag comes at once
        return None
    if kind not in ("enabled", "adaptive"):
        raise ParamError("thinking.type: must be enabled, adaptive or disabled", "thinking.type")
    if think is None:
        raise ParamError("thinking: this model has no reasoning parser (start the server with --reasoning-parser)", "thinking")
    if kind == "adaptive":
        return None
    try:  # Anthropic's floor: a budget under 1024 tokens is refused there
        budget = get_int(t, "budget_tokens", lo=MIN_THINKING_BUDGET)
    except ParamError as e:  # the reader names the inner key alone
        raise ParamError(f"thinking.{e}", "thinking.budget_tokens") from e
    if budget is None:
        raise ParamError("thinking.budget_tokens: required with type enabled", "thinking.budget_tokens")
    return budget
