"""tools + tool_choice -> the grammar that makes every started call valid (an xgrammar
structural tag), for one tool-call format.

- auto: free text; once the format's trigger appears, the call must be one of the declared
  functions with arguments matching its parameter schema (triggered tags);
- required: only calls, at least one (tags with a separator);
- named: exactly one call of that function;
- parallel_tool_calls false: one call at most.
Parameter schemas go through the same normalization as response_format schemas. For a function
with `strict: true` a keyword that cannot be enforced is a 400 naming `tools`; otherwise (OpenAI
accepts such schemas for non-strict tools) it is dropped from the constraint and reported in
`relaxed`. Arguments are JSON with the same fixed separators as `response_format` output
(`{"a": 1, "b": 2}`: no free whitespace), so a call is as short as it can be.
"""

from __future__ import annotations

import json
from typing import Any

from inflight.errors import ParamError
from inflight.structured.params import StructuredOutputsParams
from inflight.structured.schema_check import normalize_schema
from inflight.tools.parsers import ToolParser

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def tool_constraint(
    parser: ToolParser,
    tools: list[dict[str, Any]],
    choice: str | dict[str, Any],
    parallel: bool = True,
    relaxed: list[str] | None = None,
) -> StructuredOutputsParams | None:
    """None for tool_choice "none" (plain text). `relaxed` collects what non-strict schemas lost."""
    if choice == "none" or not tools:
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tools = [t for t in tools if t["function"]["name"] == name]
    tags = [_tag(parser, t["function"], relaxed if relaxed is not None else []) for t in tools]
    if choice == "auto":
        fmt: dict[str, Any] = {
            "type": "triggered_tags", "triggers": [parser.trigger], "tags": tags,
            "at_least_one": False, "stop_after_first": not parallel,
        }  # fmt: skip
    else:  # required, or one named function
        fmt = {
            "type": "tags_with_separator", "tags": tags, "separator": "\n",
            "at_least_one": True, "stop_after_first": isinstance(choice, dict) or not parallel,
        }  # fmt: skip
    return StructuredOutputsParams(
        structural_tag={"type": "structural_tag", "format": fmt}, source="tools"
    )


def _tag(parser: ToolParser, fn: dict[str, Any], relaxed: list[str]) -> dict[str, Any]:
    import xgrammar

    strict = fn.get("strict") is True
    dropped: list[str] = []
    schema = normalize_schema(
        fn.get("parameters") or ANY_OBJECT, "tools", dropped=None if strict else dropped
    )
    relaxed += [
        f"tools: function {fn['name']!r}: {what} is not enforced (not strict)" for what in dropped
    ]
    try:  # the JSON schema's grammar with fixed separators, as response_format compiles it
        grammar = str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types
        raise ParamError(
            f"tools: function {fn['name']!r}: invalid parameters schema: {str(e).strip().splitlines()[0]}",
            "tools",
        ) from e
    return {
        "type": "tag",
        "begin": parser.call_begin(fn["name"]),
        "content": {"type": "grammar", "grammar": grammar},
        "end": parser.call_end(),
    }
