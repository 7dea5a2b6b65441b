"""The constrained-decoding corpus in tests/data/structured, checked against jsonschema and xgrammar.

schemas.json holds JSON Schemas as users send them in ``response_format: {"type": "json_schema"}``
with instances that jsonschema (Draft 2020-12, with format checking) and xgrammar 0.2.8 agree on,
plus an ``unsupported`` list that pins down what xgrammar ignores, gets wrong or refuses.
patterns.json holds regexes, choice lists and EBNF grammars with accepted / rejected strings.

xgrammar's own string-level test helper (``xgrammar.testing._is_grammar_accept_string``: a
matcher over an empty vocabulary, accept_string, then is_terminated) decides acceptance, so these
tests need no tokenizer; one test at the end drives the token-level API with the demo tokenizer.
"""

import json
import re
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr

_accepts = xgr.testing._is_grammar_accept_string

DATA = Path(__file__).resolve().parents[1] / "data" / "structured"
SCHEMAS = json.loads((DATA / "schemas.json").read_text(encoding="utf-8"))
PATTERNS = json.loads((DATA / "patterns.json").read_text(encoding="utf-8"))
DEMO_MODEL = Path(__file__).resolve().parents[2] / "inflight" / "demo_model"

FORMAT_CHECKER = jsonschema.FormatChecker()

# Schemas with untyped values ({}, bare "object"/"array"): xgrammar keeps the default ", " / ": "
# inside those values even when separators=(",", ":") is requested (see the unsupported entry
# compact_separators_in_untyped_values), so their compact layout is not checked.
UNTYPED_VALUES = {"untyped_any_value_fields"}


def _ids(entries):
    return [e["name"] for e in entries]


def _dumps(value, **kwargs):
    # What a model emits: raw UTF-8, not \uXXXX escapes (length-bounded strings reject escapes).
    return json.dumps(value, ensure_ascii=False, **kwargs)


def _serializations(value):
    """The same instance in the layouts a model might produce with any_whitespace=True."""
    return {
        _dumps(value),
        _dumps(value, separators=(",", ":")),
        _dumps(value, indent=2),
    }


def _formats(node):
    """Every ``format`` value used anywhere in a schema."""
    if isinstance(node, dict):
        found = {node["format"]} if isinstance(node.get("format"), str) else set()
        for value in node.values():
            found |= _formats(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_formats, node)) if node else set()
    return set()


def _keywords(node):
    if isinstance(node, dict):
        found = set(node)
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                for sub in value.values():
                    found |= _keywords(sub)
            else:
                found |= _keywords(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_keywords, node)) if node else set()
    return set()


def _validator(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    missing = _formats(schema) - set(FORMAT_CHECKER.checkers)
    # the test extras install rfc3339-validator, which jsonschema needs for date-time
    assert not missing, f"jsonschema cannot check formats {sorted(missing)}: install the test extras"
    return jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)


def _json_grammar(schema, **kwargs):
    kwargs.setdefault("strict_mode", True)
    return xgr.Grammar.from_json_schema(json.dumps(schema), **kwargs)


# --------------------------------------------------------------------------------------------
# corpus shape


def test_corpus_shape_and_coverage():
    schemas = SCHEMAS["schemas"]
    assert len(schemas) >= 34
    assert len(PATTERNS["regex"]) >= 10
    assert len(PATTERNS["choice"]) >= 5
    assert len(PATTERNS["grammar"]) >= 6
    names = _ids(schemas) + _ids(SCHEMAS["unsupported"])
    assert len(names) == len(set(names)), "duplicate names"
    for entry in schemas:
        assert 1 <= len(entry["valid"]) <= 3, entry["name"]
        assert 1 <= len(entry["invalid"]) <= 3, entry["name"]

    keywords = _keywords([e["schema"] for e in schemas])
    for keyword in (
        "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "const", "anyOf", "oneOf", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "multipleOf", "pattern", "format", "minLength", "maxLength", "$defs",
        "$ref", "definitions", "propertyNames", "patternProperties", "minProperties",
        "maxProperties",
    ):  # fmt: skip
        assert keyword in keywords, keyword
    assert {"date", "date-time", "email", "uuid", "ipv4"} <= _formats(
        [e["schema"] for e in schemas]
    )
    assert {"array"} <= {e["schema"].get("type") for e in schemas}  # a top-level array schema

    kinds = {"not_enforced", "partially_enforced", "over_restrictive", "compile_error"}
    for entry in SCHEMAS["unsupported"]:
        assert entry["kind"] in kinds, entry["name"]
        assert entry["note"] and entry["keyword"], entry["name"]
        if entry["kind"] == "compile_error":
            assert "compile_error" in entry, entry["name"]
        elif entry["kind"] == "over_restrictive":
            assert entry.get("rejected_valid"), entry["name"]
        else:
            assert entry.get("accepted_invalid"), entry["name"]


# --------------------------------------------------------------------------------------------
# supported schemas


@pytest.mark.parametrize("entry", SCHEMAS["schemas"], ids=_ids(SCHEMAS["schemas"]))
def test_schema_jsonschema(entry):
    validator = _validator(entry["schema"])
    for instance in entry["valid"]:
        errors = [e.message for e in validator.iter_errors(instance)]
        assert not errors, f"valid instance {instance!r} fails jsonschema: {errors}"
    for instance in entry["invalid"]:
        assert not validator.is_valid(instance), f"invalid instance {instance!r} passes jsonschema"


@pytest.mark.parametrize("entry", SCHEMAS["schemas"], ids=_ids(SCHEMAS["schemas"]))
def test_schema_xgrammar_any_whitespace(entry):
    grammar = _json_grammar(entry["schema"], any_whitespace=True)
    for instance in entry["valid"]:
        for text in _serializations(instance):
            assert _accepts(grammar, text), f"xgrammar rejects valid {text!r}"
    for instance in entry["invalid"]:
        for text in (_dumps(instance), _dumps(instance, separators=(",", ":"))):
            assert not _accepts(grammar, text), f"xgrammar accepts invalid {text!r}"


@pytest.mark.parametrize("entry", SCHEMAS["schemas"], ids=_ids(SCHEMAS["schemas"]))
def test_schema_xgrammar_fixed_layout(entry):
    # any_whitespace=False pins the layout: default separators (", ", ": ") match json.dumps.
    spaced = _json_grammar(entry["schema"], any_whitespace=False)
    compact = _json_grammar(entry["schema"], any_whitespace=False, separators=(",", ":"))
    check_compact = entry["name"] not in UNTYPED_VALUES
    for instance in entry["valid"]:
        assert _accepts(spaced, _dumps(instance))
        if check_compact:
            assert _accepts(compact, _dumps(instance, separators=(",", ":")))
        if _dumps(instance) != _dumps(instance, separators=(",", ":")):
            assert not _accepts(compact, _dumps(instance)), "compact grammar allows spaces"
    for instance in entry["invalid"]:
        assert not _accepts(spaced, _dumps(instance))
        assert not _accepts(compact, _dumps(instance, separators=(",", ":")))


# --------------------------------------------------------------------------------------------
# what xgrammar 0.2.8 does not enforce


@pytest.mark.parametrize("entry", SCHEMAS["unsupported"], ids=_ids(SCHEMAS["unsupported"]))
def test_unsupported_schema_behaviour_is_pinned(entry):
    """Each entry records a gap; if xgrammar starts enforcing one, move it into ``schemas``."""
    schema = entry["schema"]
    if not entry.get("ecma_only"):  # an ECMA-262-only pattern fails Python's "regex" format
        jsonschema.Draft202012Validator.check_schema(schema)
    options = dict(entry.get("options", {}))
    if "separators" in options:
        options["separators"] = tuple(options["separators"])
    if entry["kind"] == "compile_error":
        with pytest.raises(RuntimeError, match=re.escape(entry["compile_error"])):
            _json_grammar(schema, **options)
        return

    grammar = _json_grammar(schema, **options)
    layout = {"separators": options["separators"]} if "separators" in options else {}
    # A remote $ref cannot be resolved offline (and jsonschema would try to download it).
    validator = None if entry.get("offline_unresolvable") else _validator(schema)
    for instance in entry.get("valid", []):
        assert validator is None or validator.is_valid(instance), instance
        assert _accepts(grammar, _dumps(instance, **layout)), f"xgrammar rejects {instance!r}"
    for instance in entry.get("accepted_invalid", []):
        assert validator is None or not validator.is_valid(instance), instance
        assert _accepts(grammar, _dumps(instance, **layout)), (
            f"xgrammar now rejects {instance!r}: {entry['keyword']} may be enforced now"
        )
    for instance in entry.get("rejected_valid", []):
        assert validator is None or validator.is_valid(instance), instance
        assert not _accepts(grammar, _dumps(instance, **layout)), (
            f"xgrammar now accepts {instance!r}: {entry['keyword']} may be fixed now"
        )


# --------------------------------------------------------------------------------------------
# regex / choice / EBNF


@pytest.mark.parametrize("entry", PATTERNS["regex"], ids=_ids(PATTERNS["regex"]))
def test_regex(entry):
    grammar = xgr.Grammar.from_regex(entry["pattern"])
    python = re.compile(entry["pattern"])
    for text in entry["valid"]:
        assert python.fullmatch(text), f"corpus error: re rejects {text!r}"
        assert _accepts(grammar, text), f"xgrammar rejects {text!r}"
    for text in entry["invalid"]:
        assert not python.fullmatch(text), f"corpus error: re accepts {text!r}"
        assert not _accepts(grammar, text), f"xgrammar accepts {text!r}"


@pytest.mark.parametrize("entry", PATTERNS["unsupported_regex"], ids=lambda e: e["pattern"])
def test_unsupported_regex_features_raise(entry):
    with pytest.raises(RuntimeError, match=re.escape(entry["error"])):
        xgr.Grammar.from_regex(entry["pattern"])


def choice_ebnf(choices):
    """``root ::= "a" | "b"``: JSON string escapes are valid GBNF string-literal escapes."""
    return "root ::= " + " | ".join(_dumps(c) for c in choices)


def choice_regex(choices):
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def _choice_negatives(choices):
    candidates = {"", choices[0] + choices[-1], choices[0] + " ", " " + choices[0]}
    for c in choices:
        candidates |= {c[:-1], c + "x", c.upper(), c.lower(), c + "\n"}
    return sorted(candidates - set(choices))


@pytest.mark.parametrize("choices", PATTERNS["choice"], ids=lambda c: "|".join(c)[:40])
def test_choice(choices):
    assert len(set(choices)) == len(choices)
    for grammar in (
        xgr.Grammar.from_ebnf(choice_ebnf(choices)),
        xgr.Grammar.from_regex(choice_regex(choices)),
    ):
        for text in choices:
            assert _accepts(grammar, text), f"rejects choice {text!r}"
        for text in _choice_negatives(choices):
            assert not _accepts(grammar, text), f"accepts non-choice {text!r}"


@pytest.mark.parametrize("entry", PATTERNS["grammar"], ids=_ids(PATTERNS["grammar"]))
def test_ebnf_grammar(entry):
    grammar = xgr.Grammar.from_ebnf(entry["ebnf"])
    for text in entry["valid"]:
        assert _accepts(grammar, text), f"rejects {text!r}"
    for text in entry["invalid"]:
        assert not _accepts(grammar, text), f"accepts {text!r}"


# --------------------------------------------------------------------------------------------
# token level, with a real (tiny) tokenizer


def test_token_level_masks_with_demo_tokenizer():
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(DEMO_MODEL))
    vocab_size = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id]
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    entry = next(e for e in SCHEMAS["schemas"] if e["name"] == "classification_result")
    compiled = compiler.compile_json_schema(
        json.dumps(entry["schema"]), any_whitespace=False, separators=(",", ":")
    )
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.find_jump_forward_string() == '{"label":"'  # forced prefix; state unchanged
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    assert bitmask.shape == xgr.get_bitmask_shape(1, vocab_size)
    assert bitmask.dtype == torch.int32

    ids = tokenizer.encode(
        _dumps(entry["valid"][0], separators=(",", ":")), add_special_tokens=False
    )
    for token in ids:
        matcher.fill_next_token_bitmask(bitmask)
        logits = torch.zeros(1, vocab_size)
        xgr.apply_token_bitmask_inplace(logits, bitmask)  # CPU kernel; masked -> -inf
        assert torch.isfinite(logits[0, token]), tokenizer.decode([token])
        assert matcher.accept_token(token)
    assert matcher.is_completed() and not matcher.is_terminated()

    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    assert matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()

    matcher.rollback(2)  # undo EOS and the closing brace
    assert not matcher.is_terminated() and not matcher.is_completed()
    assert matcher.accept_token(ids[-1]) and matcher.is_completed()
    matcher.reset()
    assert not matcher.accept_token(tokenizer.encode("[", add_special_tokens=False)[0])
