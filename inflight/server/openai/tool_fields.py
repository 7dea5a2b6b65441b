"""`tools`, `tool_choice`, `parallel_tool_calls` of a chat request, validated (SPEC §2)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from inflight.errors import ParamError
from inflight.server.openai.protocol import OpenAIRequest
from inflight.tools import ToolParser, detect_parser, get_parser
from inflight.tools.constraint import tool_constraint

MAX_TOOLS = 32
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]]  # OpenAI shape, as given (for the chat template)
    choice: str | dict[str, Any]  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel: bool

    @property
    def active(self) -> bool:
        """Calls are parsed (and constrained) from the output."""
        return bool(self.tools) and self.choice != "none"


def tool_request(body: dict[str, Any]) -> ToolRequest:
    tools = _tools(body.get("tools"))
    choice = _choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else parallel  # null: the default, as for every optional field
    if not isinstance(parallel, bool):
        raise ParamError("parallel_tool_calls: must be a boolean", "parallel_tool_calls")
    return ToolRequest(tools, choice, parallel)


DATABRICKS_MAX_PROPERTIES = 15  # "properties is limited to 15 keys" (Databricks FunctionObject.parameters)


def documented_limits(body: dict[str, Any], tools: ToolRequest) -> None:
    """Databricks' and MindIE's documented chat limits, applied under `mindie_defaults` (our own
    defaults are wider: any number of properties, empty content as OpenAI accepts it)."""
    for i, t in enumerate(tools.tools):
        props = (t["function"].get("parameters") or {}).get("properties")
        if isinstance(props, dict) and len(props) > DATABRICKS_MAX_PROPERTIES:
            raise ParamError(
                f"tools[{i}].function.parameters: {len(props)} properties; at most {DATABRICKS_MAX_PROPERTIES}", "tools"
            )
    for i, m in enumerate(body.get("messages") or []):
        # MindIE: content may be left out only by an assistant message with tool_calls; never empty
        if isinstance(m, dict) and m.get("content") in ("", [], None) and not (m.get("role") == "assistant" and m.get("tool_calls")):
            raise ParamError(f"messages[{i}].content: must not be empty", "messages")


def _tools(v: Any) -> list[dict[str, Any]]:
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_TOOLS:
        raise ParamError(f"tools: must be an array of at most {MAX_TOOLS} tools", "tools")
    names = set()
    for i, t in enumerate(v):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ParamError(f'tools[{i}]: must be {{"type": "function", "function": {{...}}}}', "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ParamError(f"tools[{i}].function.name: 1-64 letters, digits, '_' or '-'", "tools")
        if name in names:
            raise ParamError(f"tools[{i}].function.name: {name!r} is declared twice", "tools")
        names.add(name)
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ParamError(f"tools[{i}].function.parameters: must be a JSON schema object", "tools")
        if not isinstance(fn.get("description", ""), str) or not isinstance(fn.get("strict", False), (bool, type(None))):
            raise ParamError(f"tools[{i}].function: description must be a string, strict a boolean", "tools")
    return v


def _choice(v: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if v is None:
        return "auto" if tools else "none"
    if v in ("none", "auto", "required"):
        if v != "none" and not tools:
            raise ParamError(f'tool_choice: "{v}" needs tools', "tool_choice")
        return v
    fn = v.get("function") if isinstance(v, dict) and v.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None  # a list or string there was an AttributeError (500)
    if not isinstance(name, str):
        raise ParamError('tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice")
    if name not in {t["function"]["name"] for t in tools}:
        raise ParamError(f"tool_choice: function {name!r} is not in tools", "tool_choice")
    return v


def tool_parser(tools: ToolRequest, req: OpenAIRequest, configured: str | None, tok: Any, relaxed: list[str]) -> ToolParser | None:
    """The tool-call format when calls are to be parsed; the request gets the call grammar.
    `relaxed` collects what non-strict tool schemas lost from their constraint."""
    if not tools.active:
        return None
    name = configured or detect_parser(getattr(tok, "chat_template", None))
    if name is None:
        raise ParamError(
            "tools: this model's chat template shows no tool-call format (start the server with --tool-call-parser)",
            "tools",
        )
    if req.params.structured_outputs is not None:
        raise ParamError('response_format: cannot be combined with tools unless tool_choice is "none"', "response_format")
    if req.params.is_beam_search:
        raise ParamError("tools: not available with beam search", "tools")
    parser = get_parser(name)
    req.params.structured_outputs = tool_constraint(parser, tools.tools, tools.choice, tools.parallel, relaxed)
    if parser.name == "mistral":
        req.params.skip_special_tokens = False  # [TOOL_CALLS] is a special token
    return parser
