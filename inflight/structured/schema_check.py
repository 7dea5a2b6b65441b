"""Make a JSON schema safe for xgrammar 0.2.8: reject what it would not enforce, rewrite what
it enforces wrongly.

A constraint that is silently looser than the schema the user sent is worse than an error:
the caller would trust outputs that may not validate. So every keyword or combination that
xgrammar ignores is a 400 naming the field (the list comes from tests/data/structured/
schemas.json "unsupported", pinned by tests/unit/test_structured_corpus.py):
uniqueItems, not, if/then/else, dependentRequired/Schemas, contains, multipleOf on numbers,
allOf with several branches, oneOf whose branches are not discriminated by a const property,
keywords beside $ref or beside enum/const, pattern or format with lengths, format with pattern,
required names missing from properties, remote $ref, unknown formats.

With `dropped` (a list; the tools of a function that is not `strict`, as OpenAI accepts any
schema there) nothing is refused: each such keyword is removed from the constraint instead
(`oneOf` becomes `anyOf`), which only loosens it, and `dropped` says what and where.

Rewrites, where xgrammar is wrong but a stricter equivalent exists:
- strings with minLength/maxLength admit raw control characters (invalid JSON): they become a
  pattern over plain characters (no quotes, backslashes or controls: raw length = length);
- an optional group `(X)?` in a pattern can match without its head: written `(X|)`;
- formats `date`, `date-time` and `ipv4` accept impossible values (2024-02-30, second 60,
  leading zeros): they become patterns that do not (February stops at the 28th).
"""

from __future__ import annotations

import copy
from typing import Any

from inflight.errors import ParamError

ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "strict",
}  # fmt: skip
SUPPORTED = ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "minItems", "maxItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "format", "multipleOf",
    "minProperties", "maxProperties", "patternProperties", "propertyNames", "unevaluatedProperties",
}  # fmt: skip
FORMATS = {
    "date",
    "date-time",
    "time",
    "email",
    "uuid",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "hostname",
    "duration",
}
SUB_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUB_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
SUB_SCHEMAS = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties")

_DATE = r"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "ipv4": f"^({_OCTET}[.]){{3}}{_OCTET}$",  # [.]: xgrammar reads an escaped dot as any character
}


def normalize_schema(schema: Any, source: str, dropped: list[str] | None = None) -> Any:
    """A checked copy of `schema` with the rewrites above applied; ParamError if unenforceable
    (or, given `dropped`, the unenforceable keywords removed and listed there)."""
    schema = copy.deepcopy(schema)
    _Checker(schema, source, dropped).check(schema, "")
    return schema


class _Checker:
    def __init__(self, root: Any, source: str, dropped: list[str] | None = None) -> None:
        self.root, self.source, self.dropped = root, source, dropped

    def fail(self, what: str, path: str) -> ParamError:
        return ParamError(f"{self.source}: {what} at {path or '/'} cannot be enforced", self.source)

    def loosen(self, s: dict[str, Any], keys: Any, what: str, path: str) -> None:
        """Refuse (strict), or drop `keys` from `s` and record it."""
        if self.dropped is None:
            raise self.fail(what, path)
        for k in list(keys):
            s.pop(k, None)
        self.dropped.append(f"{what} at {path or '/'}")

    def check(self, schema: Any, path: str) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, dict):
            raise ParamError(
                f"{self.source}: schema at {path or '/'} must be an object", self.source
            )
        self._combinations(schema, path)
        self._rewrite(schema, path)
        for key, value in list(schema.items()):
            if key not in SUPPORTED:
                self.loosen(schema, [key], f"schema keyword {key!r}", path)
                continue
            if key in SUB_SCHEMA_LISTS and isinstance(value, list):
                for i, sub in enumerate(value):
                    self.check(sub, f"{path}/{key}/{i}")
            elif key in SUB_SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    self.check(sub, f"{path}/{key}/{name}")
            elif key in SUB_SCHEMAS:
                self.check(value, f"{path}/{key}")

    def _combinations(self, s: dict[str, Any], path: str) -> None:
        keys = set(s) - ANNOTATIONS
        if "$ref" in s:
            if not str(s["$ref"]).startswith("#"):
                self.loosen(s, ["$ref"], f"remote $ref {s['$ref']!r}", path)
            elif keys - {"$ref", "$defs", "definitions"}:
                self.loosen(s, keys - {"$ref", "$defs", "definitions"}, "keywords beside $ref", path)
        keys = set(s) - ANNOTATIONS
        if ("enum" in s or "const" in s) and keys - {"enum", "const", "type"}:
            self.loosen(s, keys - {"enum", "const", "type"}, "constraints beside enum/const", path)
        if "format" in s and s["format"] not in FORMATS:
            kind = "string format" if s.get("type") in ("string", None) else f"format on a {s.get('type')}"
            self.loosen(s, ["format"], f"{kind} {s['format']!r}", path)
        if "format" in s and "pattern" in s:
            self.loosen(s, ["format"], "format with pattern", path)
        if ("minLength" in s or "maxLength" in s) and ("pattern" in s or "format" in s):
            self.loosen(s, ["minLength", "maxLength"], "minLength/maxLength with a pattern or format", path)
        if "multipleOf" in s and s.get("type") != "integer":
            self.loosen(s, ["multipleOf"], "multipleOf on a non-integer", path)
        if isinstance(s.get("allOf"), list) and len(s["allOf"]) > 1:
            self.loosen(s, ["allOf"], "allOf with several schemas", path)
        if isinstance(s.get("required"), list):
            missing = [r for r in s["required"] if r not in (s.get("properties") or {})]
            if missing:
                kept = [r for r in s["required"] if r not in missing]
                self.loosen(s, ["required"], f"required {missing} not in properties", path)
                if kept:
                    s["required"] = kept
        if "oneOf" in s and not self._discriminated(s["oneOf"]):
            if self.dropped is None:
                raise self.fail("oneOf with overlapping branches (only anyOf semantics)", path)
            self.dropped.append(f"oneOf with overlapping branches at {path or '/'} (enforced as anyOf)")
            s["anyOf"] = s.pop("oneOf")

    def _discriminated(self, branches: Any) -> bool:
        """Branches cannot overlap: distinct JSON types, and object branches told apart by a
        required property fixed to a distinct const / one-value enum."""
        if not isinstance(branches, list) or not branches:
            return False
        resolved = [self._resolve(b) for b in branches]
        types = [b.get("type") if isinstance(b, dict) else None for b in resolved]
        if not all(isinstance(t, str) for t in types):
            return False
        kinds = ["number" if t == "integer" else t for t in types]
        objects = [b for b, k in zip(resolved, kinds) if k == "object"]
        others = [k for k in kinds if k != "object"]
        if len(set(others)) != len(others):
            return False
        return len(objects) <= 1 or self._discriminator(objects)

    def _discriminator(self, objects: list[dict[str, Any]]) -> bool:
        if not all(isinstance(b.get("properties"), dict) for b in objects):
            return False
        for name in objects[0]["properties"]:
            values = [_fixed_value(self._resolve(b["properties"].get(name))) for b in objects]
            required = all(name in b.get("required", []) for b in objects)
            if required and all(v is not None for v in values) and len(set(values)) == len(values):
                return True
        return False

    def _resolve(self, s: Any) -> Any:
        ref = s.get("$ref") if isinstance(s, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return s
        node = self.root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def _rewrite(self, s: dict[str, Any], path: str) -> None:
        if "minLength" in s or "maxLength" in s:
            lo, hi = s.pop("minLength", 0), s.pop("maxLength", None)
            if (not _is_int(lo) or not (hi is None or _is_int(hi))) and self.dropped is not None:
                self.dropped.append(f"minLength/maxLength that are not integers at {path or '/'}")
                lo, hi = 0, None
            if not _is_int(lo) or not (hi is None or _is_int(hi)):
                raise ParamError(
                    f"{self.source}: minLength/maxLength at {path or '/'} must be integers",
                    self.source,
                )
            s["pattern"] = length_pattern(lo, hi)
        if s.get("format") in FORMAT_PATTERNS:
            s["pattern"] = FORMAT_PATTERNS[s.pop("format")]
        if isinstance(s.get("pattern"), str):
            s["pattern"] = optional_groups_as_alternation(s["pattern"])


PLAIN_CHAR = '[^\\x00-\\x1f"\\\\]'
MAX_REPEAT = 128  # xgrammar 0.2.8 fails to compile a regex repetition above this


def length_pattern(lo: int, hi: int | None) -> str:
    """lo..hi plain characters (no quotes, backslashes, controls), as repetitions <= MAX_REPEAT."""
    parts, need = [], lo
    while need > 0:
        k = min(need, MAX_REPEAT)
        parts.append(f"{PLAIN_CHAR}{{{k}}}")
        need -= k
    if hi is None:
        parts.append(f"{PLAIN_CHAR}*")
    else:
        extra = hi - lo
        while extra > 0:
            k = min(extra, MAX_REPEAT)
            parts.append(f"{PLAIN_CHAR}{{0,{k}}}")
            extra -= k
    return "^" + "".join(parts) + "$"


def optional_groups_as_alternation(pattern: str) -> str:
    """`(X)?` -> `(X|)`: xgrammar 0.2.8 lets `(-[0-9]+)?` match "1" (the group's head skipped)
    in JSON-schema patterns; the alternation form is enforced correctly."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == ")" and pattern[i + 1 : i + 2] == "?" and pattern[i + 2 : i + 3] != "?":
            out.append("|)")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _fixed_value(s: Any) -> str | None:
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return repr(s["const"])
    enum = s.get("enum")
    return repr(enum[0]) if isinstance(enum, list) and len(enum) == 1 else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
