"""What a request constrains its output to: one of a JSON schema, any JSON object, a regex, a
choice list, an EBNF grammar, or an xgrammar structural tag (vLLM's `StructuredOutputsParams`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from inflight.errors import ParamError

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (object or its text)
    json_object: bool | None = None  # any JSON object
    regex: str | None = None
    choice: list[str] | None = None  # exactly one of these strings
    grammar: str | None = None  # EBNF (GBNF-style, `root ::= ...`)
    structural_tag: str | dict[str, Any] | None = None  # xgrammar's structural tag format
    # where the constraint came from in the request ("response_format", "guided_json", "tools"):
    # errors name it; it does not change the grammar
    source: str = "structured_outputs"

    def __post_init__(self) -> None:
        set_kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise ParamError(f"{self.source}: set exactly one of {', '.join(KINDS)}", self.source)
        self._validate_shape(set_kinds[0])

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def _validate_shape(self, kind: str) -> None:
        value = getattr(self, kind)
        ok = {
            "json": isinstance(value, (str, dict)),
            "json_object": value is True,
            "regex": isinstance(value, str) and value != "",
            "choice": isinstance(value, list)
            and bool(value)
            and all(isinstance(c, str) for c in value),
            "grammar": isinstance(value, str) and value.strip() != "",
            "structural_tag": isinstance(value, (str, dict)),
        }[kind]
        if not ok:
            raise ParamError(f"{self.source}: invalid {kind} constraint", self.source)
        if kind in ("json", "structural_tag") and isinstance(value, str):
            try:
                json.loads(value)
            except json.JSONDecodeError as e:
                raise ParamError(
                    f"{self.source}: {kind} is not valid JSON ({e})", self.source
                ) from e

    def key(self) -> tuple[str, str]:
        """Cache key: the kind and a canonical text of the constraint."""
        value = getattr(self, self.kind)
        if isinstance(value, str) and self.kind in ("json", "structural_tag"):
            value = json.loads(value)
        return self.kind, json.dumps(value, sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_dict(
        cls, d: dict[str, Any], source: str = "structured_outputs"
    ) -> StructuredOutputsParams:
        names = {f.name for f in fields(cls)} - {"source"}
        given = {k: v for k, v in d.items() if k in names and v is not None}
        return cls(**given, source=source)
