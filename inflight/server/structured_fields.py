"""Structured-output fields of a request body -> one StructuredOutputsParams (or None).

Accepted, at most one of them per request:
- `response_format`: {"type": "text"} | {"type": "json_object"} |
  {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (a keyword that cannot
  be enforced is a 400, unless `strict` is false: then it is dropped and logged) |
  {"type": "structural_tag", "format": {...}} (xgrammar's format, as vLLM);
- `structured_outputs`: {"json" | "regex" | "choice" | "grammar" | "json_object" | "structural_tag"};
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
Shapes are checked here; whether the schema / regex / grammar compiles is checked by the
grammar backend (still a 400 naming the same field).
"""

from __future__ import annotations

import logging
from typing import Any

from inflight.errors import ParamError
from inflight.structured.params import StructuredOutputsParams
from inflight.structured.schema_check import normalize_schema

logger = logging.getLogger(__name__)

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs(body: dict[str, Any]) -> StructuredOutputsParams | None:
    found: list[StructuredOutputsParams] = []
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        found.append(fmt)
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise ParamError("structured_outputs: must be an object", "structured_outputs")
        found.append(StructuredOutputsParams.from_dict(so, source="structured_outputs"))
    for name, kind in GUIDED.items():
        if body.get(name) is not None:
            found.append(StructuredOutputsParams(**{kind: body[name]}, source=name))  # type: ignore[arg-type]
    if len(found) > 1:
        names = ", ".join(f.source for f in found)
        raise ParamError(f"{found[1].source}: only one output constraint per request (got {names})", found[1].source)
    return found[0] if found else None


def _response_format(fmt: Any) -> StructuredOutputsParams | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ParamError("response_format: must be an object", "response_format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True, source="response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise ParamError("response_format.json_schema: must be an object", "response_format")
        schema = spec.get("schema", spec.get("json_schema"))
        if not isinstance(schema, dict):
            raise ParamError("response_format.json_schema.schema: must be a JSON schema object", "response_format")
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise ParamError("response_format.json_schema.name: must be a string", "response_format")
        if not isinstance(spec.get("strict", False), (bool, type(None))):
            raise ParamError("response_format.json_schema.strict: must be a boolean", "response_format")
        if spec.get("strict") is False:  # OpenAI: best effort; what cannot be enforced is dropped
            dropped: list[str] = []
            schema = normalize_schema(schema, "response_format", dropped=dropped)
            for what in dropped:
                logger.info("response_format: %s is not enforced (strict is false)", what)
        return StructuredOutputsParams(json=schema, source="response_format")
    if kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=fmt, source="response_format")
    raise ParamError(
        'response_format.type: must be "text", "json_object", "json_schema" or "structural_tag"', "response_format"
    )
