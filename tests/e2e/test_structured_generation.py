"""Constrained generation through the engine over the whole corpus (tests/data/structured).

A tiny random-weight model's free output is noise, so every valid output here is the grammar's
doing. A logit bias on closing tokens (and EOS) makes the noise end strings within
the token budget; it cannot make anything valid: the bitmask is applied after it. The test
demands 100 %: every output finishes with "stop" and validates (jsonschema with formats, re, the
choice list, the grammar via xgrammar's own string matcher).
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import jsonschema
import pytest
import xgrammar as xgr

from inflight import LLM, SamplingParams

DATA = Path(__file__).resolve().parents[1] / "data" / "structured"
SCHEMAS = json.loads((DATA / "schemas.json").read_text())["schemas"]
PATTERNS = json.loads((DATA / "patterns.json").read_text())


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)


JSON_CLOSERS = ['"', "}", "]", ")", ";", "@", "="]
TEXT_CLOSERS = list(string.punctuation)


def _closing_bias(llm: LLM, texts: list[str], value: float) -> dict[int, float]:
    """A bias on closing / separating tokens and EOS (which the grammar only allows once the
    output is complete), so each grammar's next structural step comes within the budget. The
    sets and values were picked once so that the fixed seeds below all finish; validity never
    depends on them."""
    tok = llm.get_tokenizer()
    ids = {i for t in texts for i in tok.encode(t, add_special_tokens=False)} | {tok.eos_token_id}
    return {i: value for i in ids}


def _run(
    llm: LLM, constraints: list[dict], bias: dict[int, float], n: int = 2, max_tokens: int = 1024
) -> list:
    params = [
        SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=1.0,
            seed=i,
            logit_bias=bias,
            structured_outputs=c,
        )
        for i, c in enumerate(constraints)
    ]
    outs = llm.generate(["Answer:"] * len(params), params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    return outs


def test_every_schema_output_validates(llm: LLM) -> None:
    assert len(SCHEMAS) >= 30
    outs = _run(
        llm, [{"json": e["schema"]} for e in SCHEMAS], _closing_bias(llm, JSON_CLOSERS, 4.0)
    )
    checked = 0
    for entry, out in zip(SCHEMAS, outs):
        for c in out.outputs:
            assert c.finish_reason == "stop", (entry["name"], c.text[:200])
            jsonschema.validate(
                json.loads(c.text), entry["schema"], format_checker=jsonschema.FormatChecker()
            )
            checked += 1
    assert checked == 2 * len(SCHEMAS)


def test_every_regex_choice_and_grammar_output_matches(llm: LLM) -> None:
    regexes, choices, grammars = PATTERNS["regex"], PATTERNS["choice"], PATTERNS["grammar"]
    constraints = (
        [{"regex": r["pattern"]} for r in regexes]
        + [{"choice": c} for c in choices]
        + [{"grammar": g["ebnf"]} for g in grammars]
    )
    outs = _run(llm, constraints, _closing_bias(llm, TEXT_CLOSERS, 3.0))
    for k, out in enumerate(outs):
        for c in out.outputs:
            assert c.finish_reason == "stop", (constraints[k], c.text[:100])
            if k < len(regexes):
                # ECMAScript classes: \d is [0-9], \s has no \x1c-\x1f (Python's str \s does)
                assert re.fullmatch(regexes[k]["pattern"], c.text, re.ASCII), (
                    regexes[k]["pattern"],
                    c.text,
                )
            elif k < len(regexes) + len(choices):
                assert c.text in choices[k - len(regexes)]
            else:
                g = xgr.Grammar.from_ebnf(grammars[k - len(regexes) - len(choices)]["ebnf"])
                assert xgr.testing._is_grammar_accept_string(g, c.text), c.text


def test_constraints_with_logprobs_stop_strings_and_prefix_cache(llm: LLM) -> None:
    """Constrained rows report logprobs; a stop string still ends them; a repeated prompt hits the
    prefix cache and gives the same seeded output."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999},
            "b": {"enum": ["x", "y"]},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    p = SamplingParams(
        max_tokens=64, temperature=1.0, seed=5, logprobs=2, structured_outputs={"json": schema}
    )
    prompt = "A long shared prompt for the prefix cache " * 4
    first = llm.generate(prompt, p, use_tqdm=False)[0]
    again = llm.generate(prompt, p, use_tqdm=False)[0]
    assert again.num_cached_tokens > 0
    assert first.outputs[0].text == again.outputs[0].text
    jsonschema.validate(json.loads(first.outputs[0].text), schema)
    assert len(first.outputs[0].logprobs) == len(first.outputs[0].token_ids)
    stopped = llm.generate(
        prompt,
        SamplingParams(
            max_tokens=64,
            temperature=1.0,
            seed=5,
            stop=['"b"'],
            structured_outputs={"json": schema},
        ),
        use_tqdm=False,
    )[0]
    assert stopped.outputs[0].finish_reason == "stop" and '"b"' not in stopped.outputs[0].text
    assert first.outputs[0].text.startswith(stopped.outputs[0].text)
