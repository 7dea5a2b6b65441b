"""tools + tool_choice -> the grammar that makes every started call valid (an xgrammar
structural tag), for one tool-call format.

- auto: free text; once the format's trigger appears, the call must be one of the declared
  functions with arguments matching its parameter schema (triggered tags);
- required: only calls, at least one (tags with a separator);
- named: exactly one call of that function;
- parallel_tool_calls false: one call at most.
Parameter schemas go through the same normalization as response_format schemas, so a feature
that cannot be enforced is a 400 naming `tools`.
"""

from __future__ import annotations

from typing import Any

from inflight.structured.params import StructuredOutputsParams
from inflight.structured.schema_check import normalize_schema
from inflight.tools.parsers import ToolParser

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def tool_constraint(
    parser: ToolParser, tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool = True
) -> StructuredOutputsParams | None:
    """None for tool_choice "none" (plain text)."""
    if choice == "none" or not tools:
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tools = [t for t in tools if t["function"]["name"] == name]
    tags = [_tag(parser, t["function"]) for t in tools]
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
    return StructuredOutputsParams(structural_tag={"type": "structural_tag", "format": fmt}, source="tools")


def _tag(parser: ToolParser, fn: dict[str, Any]) -> dict[str, Any]:
    schema = normalize_schema(fn.get("parameters") or ANY_OBJECT, "tools")
    return {
        "type": "tag",
        "begin": parser.call_begin(fn["name"]),
        # at most one whitespace character in a row: a weak model cannot pad a call forever
        "content": {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1},
        "end": parser.call_end(),
    }
