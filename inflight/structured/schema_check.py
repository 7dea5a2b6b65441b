"""Reject JSON-schema features that xgrammar 0.2.8 would not enforce.

A constraint that is silently looser than the schema the user sent is worse than an error:
the caller would trust outputs that may not validate. Keywords outside SUPPORTED (and the
formats outside FORMATS) are a 400 naming the field.
"""

from __future__ import annotations

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


def check_schema(schema: Any, source: str, path: str = "") -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ParamError(f"{source}: schema{path} must be an object", source)
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
