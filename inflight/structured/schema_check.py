"""Make a JSON schema safe for xgrammar 0.2.8: reject what it would not enforce, rewrite what
it enforces wrongly.

A constraint that is silently looser than the schema the user sent is worse than an error:
the caller would trust outputs that may not validate. Keywords outside SUPPORTED (and the
formats outside FORMATS) are a 400 naming the field.

Rewrites (xgrammar 0.2.8 bugs found by tests/unit/test_structured_corpus.py and the API tests):
- a string with minLength/maxLength compiles to a character class that admits raw control
  characters (invalid JSON); it becomes the equivalent `pattern` over plain characters;
- a `pattern` with minLength/maxLength drops the lengths (with a warning): rejected.
"""

from __future__ import annotations

import copy
from typing import Any

from inflight.errors import ParamError

# structural and annotation keywords xgrammar enforces or may ignore harmlessly
SUPPORTED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minItems", "maxItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "format",
    "minProperties", "maxProperties", "patternProperties", "propertyNames", "unevaluatedProperties",
    # annotations: no effect on validity
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "strict",
}  # fmt: skip
FORMATS = {"date", "date-time", "time", "email", "uuid", "ipv4", "ipv6", "uri", "hostname", "duration", "uri-reference"}
SUB_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUB_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
SUB_SCHEMAS = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties")


def normalize_schema(schema: Any, source: str) -> Any:
    """A checked copy of `schema` with the rewrites above applied; ParamError if unenforceable."""
    schema = copy.deepcopy(schema)
    check_schema(schema, source)
    return schema


def _rewrite_lengths(node: dict[str, Any], source: str, path: str) -> None:
    lo, hi = node.get("minLength", 0), node.get("maxLength")
    if "pattern" in node or "format" in node:
        raise ParamError(f"{source}: minLength/maxLength with a pattern or format at {path or '/'} cannot be enforced", source)
    if isinstance(lo, bool) or not isinstance(lo, int) or not (hi is None or (isinstance(hi, int) and not isinstance(hi, bool))):
        raise ParamError(f"{source}: minLength/maxLength at {path or '/'} must be integers", source)
    node.pop("minLength", None)
    node.pop("maxLength", None)
    # no quotes or backslashes: the raw JSON text and the string have the same length
    node["pattern"] = "^[^\\x00-\\x1f\"\\\\]{%d,%s}$" % (lo, "" if hi is None else hi)


def check_schema(schema: Any, source: str, path: str = "") -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ParamError(f"{source}: schema{path} must be an object", source)
    if "minLength" in schema or "maxLength" in schema:
        _rewrite_lengths(schema, source, path)
    for key, value in schema.items():
        if key not in SUPPORTED:
            raise ParamError(f"{source}: schema keyword {key!r} at {path or '/'} cannot be enforced", source)
        if key == "format" and value not in FORMATS:
            raise ParamError(f"{source}: string format {value!r} at {path or '/'} cannot be enforced", source)
        if key in SUB_SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                check_schema(sub, source, f"{path}/{key}/{i}")
        elif key in SUB_SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                check_schema(sub, source, f"{path}/{key}/{name}")
        elif key in SUB_SCHEMAS:
            check_schema(value, source, f"{path}/{key}")
