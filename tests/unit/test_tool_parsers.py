"""Tool-call parsers: extraction per format, and streaming that adds up to it for every split."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from inflight.tools import (
    PARSER_NAMES,
    ExtractedToolCalls,
    MistralToolParser,
    ToolDelta,
    ToolParser,
    detect_parser,
    get_parser,
    make_call_id,
)

WEATHER = {"city": "Paris", "unit": "celsius"}
NESTED = {
    "filter": {"and": [{"field": "a", "ops": [{"gt": 1}, {"lt": [2, 3.5]}]}, {"not": {"x": None}}]},
    "flags": [True, False],
    "deep": [[[{"k": [{}]}]]],
}
TRICKY = {
    "code": 'if (x) { return "}"; } else { y = [1, 2]; }',
    "quote": 'say "hi" \\ back\\slash',
    "markup": "</tool_call> <tool_call> [TOOL_CALLS] <|python_tag|> [ARGS] ;",
    "newline": "line1\nline2\ttab",
}
UNICODE = {"city": "Zürich", "alt": "東京", "emoji": "🌧️☔ 👍🏽", "escaped": "caf\u00e9"}


@dataclass
class Case:
    id: str
    text: str
    content: str | None
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: bool = False


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------------- cases per format
def hermes(name: str, args: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {dumps(args)}}}\n</tool_call>'


HERMES = [
    Case("single", hermes("get_weather", WEATHER), None, [("get_weather", WEATHER)]),
    Case(
        "text_before",
        "I'll look that up for you.\n\n" + hermes("get_weather", WEATHER),
        "I'll look that up for you.",
        [("get_weather", WEATHER)],
    ),
    Case(
        "parallel_3",
        hermes("a", {"x": 1}) + "\n" + hermes("b", {"y": [1]}) + "\n\n" + hermes("c", {}),
        None,
        [("a", {"x": 1}), ("b", {"y": [1]}), ("c", {})],
    ),
    Case("nested", hermes("search", NESTED), None, [("search", NESTED)]),
    Case("tricky_strings", "Run:" + hermes("run", TRICKY), "Run:", [("run", TRICKY)]),
    Case(
        "unicode",
        "Wetter in Zürich? " + hermes("w", UNICODE),
        "Wetter in Zürich?",
        [("w", UNICODE)],
    ),
    Case(
        "ascii_escapes",
        '<tool_call>\n{"name": "w", "arguments": {"city": "Z\\u00fcrich \\ud83d\\ude00"}}\n</tool_call>',
        None,
        [("w", {"city": "Zürich 😀"})],
    ),
    Case("empty_args", hermes("now", {}), None, [("now", {})]),
    Case(
        "qwen3_think",
        "<think>\nThe user wants weather; call get_weather.\n</think>\n\n"
        + hermes("get_weather", WEATHER),
        "<think>\nThe user wants weather; call get_weather.\n</think>",
        [("get_weather", WEATHER)],
    ),
    Case(
        "args_before_name",
        '<tool_call>\n{"arguments": {"q": "x}"}, "name": "find"}\n</tool_call>',
        None,
        [("find", {"q": "x}"})],
    ),
    Case(
        "args_as_string",
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1, \\"b\\": \\"}\\"}"}\n</tool_call>',
        None,
        [("f", {"a": 1, "b": "}"})],
    ),
    Case(
        "no_ws", '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>', None, [("f", {"a": 1})]
    ),
    Case(
        "extra_keys",
        '<tool_call>\n{"id": 7, "name": "f", "meta": {"x": [1, "}"]}, "arguments": {"a": true}}\n</tool_call>',
        None,
        [("f", {"a": True})],
    ),
    Case("no_arguments_key", '<tool_call>\n{"name": "ping"}\n</tool_call>', None, [("ping", {})]),
    Case(
        "text_between_and_after",
        "A\n" + hermes("a", {}) + "\nB <b>bold</b>\n" + hermes("b", {"k": "v"}) + "\nDone.\n",
        "A\n\nB <b>bold</b>\n\nDone.",
        [("a", {}), ("b", {"k": "v"})],
    ),
    Case(
        "plain_text",
        "No tools <tool>needed</tool> here, 1 < 2 {x}.\n",
        "No tools <tool>needed</tool> here, 1 < 2 {x}.\n",
    ),
    Case("plain_whitespace_only", " \n\t ", None),
    Case(
        "missing_close_tag", hermes("f", {"a": 1})[: -len("</tool_call>")], None, [("f", {"a": 1})]
    ),
    Case("partial_close_tag", hermes("f", {"a": 1})[:-4], None, [("f", {"a": 1})]),
    # malformed
    Case("unclosed", 'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1', "Hi", error=True),
    Case("only_open_tag", "Checking...\n<tool_call>", "Checking...", error=True),
    Case("open_tag_prefix_at_end", "Checking <tool_ca", "Checking <tool_ca"),
    Case(
        "invalid_json",
        '<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>',
        None,
        error=True,
    ),
    Case(
        "single_quotes",
        "<tool_call>\n{'name': 'f', 'arguments': {}}\n</tool_call>\nafter",
        None,
        error=True,
    ),
    Case("missing_name", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>', None, error=True),
    Case(
        "good_then_bad",
        "x "
        + hermes("a", {"k": 1})
        + '\n<tool_call>\n{"name": "b", "arguments": {"k": ]}}</tool_call>',
        "x",
        [("a", {"k": 1})],
        error=True,
    ),
    Case("not_json", "<tool_call>\noops I broke it\n</tool_call>", None, error=True),
    Case(
        "junk_before_close",
        '<tool_call>\n{"name": "f", "arguments": {}} junk </tool_call>',
        None,
        [("f", {})],
        error=True,
    ),
    Case(
        "arguments_not_object",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        None,
        error=True,
    ),
]


def llama(name: str, args: dict[str, Any], key: str = "parameters") -> str:
    return f'{{"name": "{name}", "{key}": {dumps(args)}}}'


LLAMA = [
    Case("single", llama("get_weather", WEATHER), None, [("get_weather", WEATHER)]),
    Case(
        "python_tag",
        "<|python_tag|>" + llama("get_weather", WEATHER),
        None,
        [("get_weather", WEATHER)],
    ),
    Case("arguments_key", llama("f", {"a": 1}, key="arguments"), None, [("f", {"a": 1})]),
    Case(
        "parallel_2",
        llama("a", {"x": 1}) + "; " + llama("b", {"y": "z"}),
        None,
        [("a", {"x": 1}), ("b", {"y": "z"})],
    ),
    Case(
        "parallel_3_tagged",
        "<|python_tag|>" + llama("a", {}) + ";" + llama("b", NESTED) + " ;\n" + llama("c", TRICKY),
        None,
        [("a", {}), ("b", NESTED), ("c", TRICKY)],
    ),
    Case(
        "text_before",
        "Let me check the weather.\n\n" + llama("get_weather", WEATHER),
        "Let me check the weather.",
        [("get_weather", WEATHER)],
    ),
    Case("nested", llama("search", NESTED), None, [("search", NESTED)]),
    Case("tricky_strings", llama("run", TRICKY), None, [("run", TRICKY)]),
    Case("unicode", "東京: " + llama("w", UNICODE), "東京:", [("w", UNICODE)]),
    Case("empty_args", llama("now", {}), None, [("now", {})]),
    Case(
        "type_function_first",
        '{"type": "function", "name": "f", "parameters": {"a": [1, {"b": "}"}]}}',
        None,
        [("f", {"a": [1, {"b": "}"}]})],
    ),
    Case(
        "newline_separated",
        llama("a", {"x": 1}) + "\n" + llama("b", {}),
        None,
        [("a", {"x": 1}), ("b", {})],
    ),
    Case("ws_in_trigger", '{ "name": "f", "parameters": {}}', None, [("f", {})]),
    Case("trailing_semicolon", llama("a", {}) + ";", None, [("a", {})]),
    Case(
        "json_that_is_not_a_call",
        'Here: {"name": "Bob", "age": 42, "tags": {"name": "x"}}.\n',
        'Here: {"name": "Bob", "age": 42, "tags": {"name": "x"}}.\n',
    ),
    Case(
        "braces_in_text", "Use f(x) { return x; } and {a: 1}", "Use f(x) { return x; } and {a: 1}"
    ),
    Case("not_a_call_at_end", 'Result {"name": "Bo', 'Result {"name": "Bo'),
    Case("not_a_call_bad_name", 'A {"name": 5} B', 'A {"name": 5} B'),
    Case(
        "not_a_call_then_call",
        'Person {"name": "Bob"} ok\n' + llama("f", {"a": 1}),
        'Person {"name": "Bob"} ok',
        [("f", {"a": 1})],
    ),
    # malformed
    Case("tag_then_garbage", "Hm <|python_tag|>print('hi')", "Hm", error=True),
    Case("tag_at_end", "Hm <|python_tag|>", "Hm", error=True),
    Case("truncated", 'x {"name": "f", "parameters": {"a": "unterminated', "x", error=True),
    Case("invalid_json", '{"name": "f", "parameters": {"a": tru}}', None, error=True),
    Case(
        "tagged_parameters_not_object",
        '<|python_tag|>{"name": "f", "parameters": 3}',
        None,
        error=True,
    ),
    Case(
        "bare_parameters_not_object",
        '{"name": "f", "parameters": 3}',
        '{"name": "f", "parameters": 3}',
    ),
    Case("garbage_after_semicolon", llama("a", {}) + "; and more", None, [("a", {})], error=True),
    Case("tagged_missing_name", '<|python_tag|>{"parameters": {}}', None, error=True),
]


def mistral(calls: list[tuple[str, dict[str, Any]]], space: str = "") -> str:
    items = ", ".join(f'{{"name": "{n}", "arguments": {dumps(a)}}}' for n, a in calls)
    return f"[TOOL_CALLS]{space}[{items}]"


MISTRAL = [
    Case("single", mistral([("get_weather", WEATHER)]), None, [("get_weather", WEATHER)]),
    Case(
        "parallel_space",
        mistral([("a", {"x": 1}), ("b", NESTED), ("c", {})], space=" "),
        None,
        [("a", {"x": 1}), ("b", NESTED), ("c", {})],
    ),
    Case(
        "text_before",
        "Sure, checking.\n" + mistral([("get_weather", WEATHER)]),
        "Sure, checking.",
        [("get_weather", WEATHER)],
    ),
    Case("nested", mistral([("s", NESTED)]), None, [("s", NESTED)]),
    Case("tricky_strings", mistral([("run", TRICKY)]), None, [("run", TRICKY)]),
    Case("unicode", mistral([("w", UNICODE)]), None, [("w", UNICODE)]),
    Case("empty_args", mistral([("now", {})]), None, [("now", {})]),
    Case("empty_list", "Nothing [TOOL_CALLS][]", "Nothing"),
    Case(
        "extra_id_key",
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123XYZ"}]',
        None,
        [("f", {"a": 1})],
    ),
    Case("v11", "[TOOL_CALLS]get_weather[ARGS]" + dumps(WEATHER), None, [("get_weather", WEATHER)]),
    Case(
        "v11_parallel",
        "Ok [TOOL_CALLS]a[ARGS]" + dumps(TRICKY) + "[TOOL_CALLS]b.c-d[ARGS]{}",
        "Ok",
        [("a", TRICKY), ("b.c-d", {})],
    ),
    Case(
        "v11_call_id",
        "[TOOL_CALLS]f[CALL_ID]a1b2C3d4e[ARGS]" + dumps(UNICODE),
        None,
        [("f", UNICODE)],
    ),
    Case("v11_no_args_token", "[TOOL_CALLS]f" + dumps(NESTED), None, [("f", NESTED)]),
    Case(
        "brackets_in_text",
        "See [1] and [TOOL] or [TOOL_CALL] docs",
        "See [1] and [TOOL] or [TOOL_CALL] docs",
    ),
    Case("missing_list_close", mistral([("f", {"a": 1})])[:-1], None, [("f", {"a": 1})]),
    # malformed
    Case("marker_only", "Hi [TOOL_CALLS]", "Hi", error=True),
    Case("truncated_list", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1', None, error=True),
    Case("truncated_after_comma", mistral([("f", {})])[:-1] + ", ", None, [("f", {})], error=True),
    Case("v11_truncated", '[TOOL_CALLS]f[ARGS]{"a": [1, 2', None, error=True),
    Case("v11_no_args", "[TOOL_CALLS]hello world", None, error=True),
    Case("v11_invalid_json", "[TOOL_CALLS]f[ARGS]{'a': 1}", None, error=True),
    Case("list_of_numbers", "[TOOL_CALLS][1, 2]", None, error=True),
    Case(
        "good_then_bad",
        '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": }}]',
        None,
        [("a", {})],
        error=True,
    ),
]

CASES = {"hermes": HERMES, "llama3_json": LLAMA, "mistral": MISTRAL}
ALL = [pytest.param(p, c, id=f"{p}-{c.id}") for p, cases in CASES.items() for c in cases]
# Markup that must never reach content once a call was recognized.
MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>", '"arguments"'],
    "llama3_json": ["<|python_tag|>", '"parameters"', '"arguments"'],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", '"arguments"'],
}


# ---------------------------------------------------------------------- helpers
def run_stream(parser: ToolParser, pieces: list[str]) -> tuple[list[ToolDelta], ExtractedToolCalls]:
    stream = parser.streamer()
    deltas: list[ToolDelta] = []
    for piece in pieces:
        deltas += stream.feed(piece)
    final, result = stream.finish()
    return deltas + final, result


def random_pieces(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    num_cuts = rng.randint(1, max(1, len(text) // 3))
    cuts = (
        sorted(rng.sample(range(1, len(text)), min(num_cuts, len(text) - 1)))
        if len(text) > 1
        else []
    )
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def splits(text: str) -> list[list[str]]:
    return [list(text), [text], *(random_pieces(text, seed) for seed in range(6))]


def check_stream(
    parser: ToolParser,
    text: str,
    pieces: list[str],
    ref: ExtractedToolCalls,
    markup: list[str] | None = None,
) -> None:
    """Every streaming invariant, against the one-shot extraction `ref` of the same text.

    `markup`: strings that must not reach content when the text had a call (default MARKUP).
    """
    assert "".join(pieces) == text
    deltas, result = run_stream(parser, pieces)
    content = "".join(d.content for d in deltas if d.content is not None)
    assert content == (ref.content or "")
    assert result.content == ref.content
    assert result.error == ref.error
    assert [(c.name, c.arguments) for c in result.calls] == [
        (c.name, c.arguments) for c in ref.calls
    ]

    # content deltas carry nothing else; call deltas nothing but the call
    for d in deltas:
        if d.content is not None:
            assert d.index is None and d.id is None and d.name is None and d.arguments is None
            assert d.content
        else:
            assert d.index is not None
    # calls stream in order; the first delta of a call names it, the others only add arguments
    indices = [d.index for d in deltas if d.index is not None]
    assert indices == sorted(indices)
    allowed = len(result.calls) + (1 if result.error else 0)  # + a broken call's partial stream
    assert set(indices) <= set(range(allowed))
    for i in set(indices):
        mine = [d for d in deltas if d.index == i]
        assert mine[0].id is not None and mine[0].name is not None
        assert all(d.id is None and d.name is None for d in mine[1:])
        if i < len(result.calls):
            call = result.calls[i]
            assert mine[0].id == call.id and mine[0].name == call.name
            assert "".join(d.arguments or "" for d in mine) == call.arguments
    assert len(set(indices)) >= len(result.calls)
    if result.calls or result.error:
        for marker in MARKUP[parser.name] if markup is None else markup:
            assert marker not in content


# ---------------------------------------------------------------------- extraction
@pytest.mark.parametrize("parser_name,case", ALL)
def test_extract(parser_name: str, case: Case) -> None:
    result = get_parser(parser_name).extract(case.text)
    assert result.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in result.calls] == case.calls
    assert (result.error is not None) == case.error, result.error
    for call in result.calls:
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
        assert call.arguments == call.arguments.strip()
        # a raw slice of the output (string-encoded arguments are decoded, absent ones are "{}")
        assert call.arguments in case.text or case.id in ("args_as_string", "no_arguments_key")
    assert len({c.id for c in result.calls}) == len(result.calls)


@pytest.mark.parametrize("parser_name,case", ALL)
def test_stream_matches_extract_for_every_split(parser_name: str, case: Case) -> None:
    parser = get_parser(parser_name)
    ref = parser.extract(case.text)
    for pieces in splits(case.text):
        check_stream(parser, case.text, pieces, ref)


def test_arguments_keep_the_models_spelling() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"b":2,  "a" : [1 ,2], "u": "\\u00fc"}}\n</tool_call>'
    (call,) = get_parser("hermes").extract(text).calls
    assert call.arguments == '{"b":2,  "a" : [1 ,2], "u": "\\u00fc"}'


# ---------------------------------------------------------------------- streaming timing
def feed_all(parser: ToolParser, pieces: list[str]) -> list[list[ToolDelta]]:
    stream = parser.streamer()
    return [stream.feed(p) for p in pieces]


def contents(deltas: list[ToolDelta]) -> str:
    return "".join(d.content or "" for d in deltas)


def test_hermes_holds_back_only_a_possible_trigger() -> None:
    steps = feed_all(
        get_parser("hermes"), ["Hello, wor", "ld <tool", "s> and <", "tool_", "call>\n{"]
    )
    assert [contents(s) for s in steps] == ["Hello, wor", "ld", " <tools> and", "", ""]


def test_hermes_first_delta_as_soon_as_arguments_start() -> None:
    stream = get_parser("hermes").streamer()
    assert stream.feed('Hi <tool_call>\n{"name": "get_weather"') == [ToolDelta(content="Hi")]
    (first,) = stream.feed(', "arguments": {"ci')
    assert (first.index, first.name, first.arguments) == (0, "get_weather", '{"ci')
    assert first.id is not None and first.id.startswith("call_")
    assert stream.feed('ty": "Paris"}') == [ToolDelta(index=0, arguments='ty": "Paris"}')]
    assert stream.feed("}\n</tool_call>") == []  # the wrapper's brace is not an argument
    final, result = stream.finish()
    assert final == [] and result.calls[0].arguments == '{"city": "Paris"}'
    assert result.calls[0].id == first.id


def test_llama_bare_json_is_held_until_it_is_a_call() -> None:
    steps = feed_all(
        get_parser("llama3_json"), ["Data: {", '"na', 'me": "Bob"', ', "parameters": {', "}}"]
    )
    assert [contents(s) for s in steps] == ["Data:", "", "", "", ""]
    header = steps[3][0]
    assert (header.index, header.name, header.arguments) == (0, "Bob", "{")


def test_mistral_holds_back_marker_prefix() -> None:
    steps = feed_all(
        get_parser("mistral"), ["See [TOOL_", "S] and ", "[TOOL_CALLS", "]x[ARGS]{", "}"]
    )
    assert [contents(s) for s in steps] == ["See", " [TOOL_S] and", "", "", ""]
    assert steps[3][0].name == "x" and steps[3][0].arguments == "{"
    assert steps[4] == [ToolDelta(index=0, arguments="}")]


def test_plain_text_streams_char_by_char() -> None:
    text = "Pay $5 {maybe} at <b>shop</b> [1]; ok?  "
    for name in PARSER_NAMES:
        stream = get_parser(name).streamer()
        emitted = ""
        for i, ch in enumerate(text):
            emitted += contents(stream.feed(ch))
            # everything is out except trailing whitespace and a possible trigger start
            assert text[: i + 1].startswith(emitted)
            assert len(text[: i + 1].rstrip()) - len(emitted) <= len("<tool_call>")
        final, result = stream.finish()
        assert emitted + contents(final) == text == result.content


def test_feed_after_finish_raises() -> None:
    stream = get_parser("hermes").streamer()
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("x")


# ---------------------------------------------------------------------- fuzz: split invariance
HERMES_BITS = ["<tool_call>", "</tool_call>", "<tool", "_call>", "\n", "}\n</tool_call>"]
LLAMA_BITS = ["<|python_tag|>", "<|py", '{"name"', "; ", ";", '{"type"']
MISTRAL_BITS = ["[TOOL_CALLS]", "[TOOL_", "[ARGS]", "[CALL_ID]", "}]", "fn"]
FRAGMENTS = {
    "hermes": [*HERMES_BITS, '{"name": "f", "arguments": '],
    "llama3_json": [*LLAMA_BITS, '{"name": "f", "parameters": '],
    "mistral": [*MISTRAL_BITS, '[{"name": "g", "arguments": '],
}
COMMON = [*'{}[]":, x', '{"a": 1}', "{}", '\\"', "ü", "東京", "true", "}}"]


@pytest.mark.parametrize("parser_name", PARSER_NAMES)
def test_fuzz_random_markup_streams_like_extract(parser_name: str) -> None:
    parser = get_parser(parser_name)
    rng = random.Random(1234)
    valid = [c.text for c in CASES[parser_name] if not c.error]
    for _ in range(300):
        parts = [
            rng.choice(valid)
            if rng.random() < 0.15
            else rng.choice(FRAGMENTS[parser_name] + COMMON)
            for _ in range(rng.randint(1, 12))
        ]
        text = "".join(parts)
        ref = parser.extract(text)
        for pieces in (list(text), random_pieces(text, rng.randint(0, 10**6))):
            # no markup check: random content may hold stray markup, or form a trigger when the
            # text on both sides of a call is joined ('<tool' + call + '_call>')
            check_stream(parser, text, pieces, ref, markup=[])


# ---------------------------------------------------------------------- format helpers
CALLS = [("get_weather", WEATHER), ("search", NESTED), ("run", TRICKY), ("now", {}), ("w", UNICODE)]
PARSERS = [get_parser(n) for n in PARSER_NAMES] + [MistralToolParser(v11=True)]


@pytest.mark.parametrize(
    "parser", PARSERS, ids=lambda p: p.name + ("_v11" if getattr(p, "v11", 0) else "")
)
def test_format_calls_round_trips(parser: ToolParser) -> None:
    for calls in (CALLS[:1], CALLS[:2], CALLS):
        text = parser.format_calls(calls)
        result = parser.extract(text)
        assert result.error is None and result.content is None
        assert [(c.name, json.loads(c.arguments)) for c in result.calls] == calls
        for pieces in splits(text)[:3]:
            check_stream(parser, text, pieces, result)
    name, args = CALLS[0]
    assert parser.call_begin(name) + dumps(args) + parser.call_end() == parser.format_calls(
        [(name, args)]
    )
    assert parser.format_calls([(name, args)]).startswith(parser.trigger)
    assert parser.trigger in parser.triggers


def test_constraint_helpers() -> None:
    hermes_parser = get_parser("hermes")
    assert (
        hermes_parser.call_begin("get_weather")
        == '<tool_call>\n{"name": "get_weather", "arguments": '
    )
    assert hermes_parser.call_end() == "}\n</tool_call>"
    assert get_parser("llama3_json").call_begin("f") == '{"name": "f", "parameters": '
    assert get_parser("llama3_json").trigger == '{"name"'
    assert "<|python_tag|>" in get_parser("llama3_json").triggers
    assert get_parser("mistral").trigger == "[TOOL_CALLS]"
    assert MistralToolParser(v11=True).call_begin("f") == "[TOOL_CALLS]f[ARGS]"


# ---------------------------------------------------------------------- registry
def test_get_parser() -> None:
    assert PARSER_NAMES == ("hermes", "llama3_json", "mistral")
    for name in PARSER_NAMES:
        assert get_parser(name).name == name
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral"):
        get_parser("qwen")


def test_make_call_id() -> None:
    ids = {make_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


QWEN25_TEMPLATE = (
    '{%- if tools %}{{- "# Tools\\n\\nYou may call one or more functions" }}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
)
MISTRAL_TEMPLATE = (
    '{%- elif message.tool_calls is defined %}{{- "[TOOL_CALLS] [" }}'
    "{%- for tool_call in message.tool_calls %}{{- tool_call.function|tojson }}{%- endfor %}"
)
LLAMA31_TEMPLATE = (
    "{%- if builtin_tools is defined or tool_call.name == 'code_interpreter' %}"
    "{{- '<|python_tag|>' + tool_call.name + '.call(' }}{%- else %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"
    '{{- tool_call.arguments | tojson }}{{- "}" }}{%- endif %}'
    '{%- elif message.role == "tool" or message.role == "ipython" %}'
    '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}'
)
LLAMA32_TEMPLATE = (
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"
    '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}'
)


@pytest.mark.parametrize(
    "template,expected",
    [
        (QWEN25_TEMPLATE, "hermes"),
        (MISTRAL_TEMPLATE, "mistral"),
        (LLAMA31_TEMPLATE, "llama3_json"),
        (LLAMA32_TEMPLATE, "llama3_json"),
        ("{%- for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{%- endfor %}", None),
        ("", None),
        (None, None),
    ],
)
def test_detect_parser(template: str | None, expected: str | None) -> None:
    assert detect_parser(template) == expected


@pytest.mark.parametrize(
    "parser_name,text,content,calls",
    [
        ("hermes", "Hi <tool_", "Hi", []),
        ("hermes", 'Hi <tool_call>\n{"name": "f", "arguments": {"a": [1, ', "Hi", [("f", '{"a": [1, ')]),
        ("hermes", '<tool_call>\n{"name": "f"', None, []),
        ("llama3_json", '{"name": "g", "parameters": {"b": "x', None, [("g", '{"b": "x')]),
        ("mistral", "ok [TOOL_CA", "ok", []),
    ],
)
def test_cut_by_max_tokens_is_not_malformed(parser_name: str, text: str, content: str | None, calls: list) -> None:
    """finish_reason "length": the call in progress comes back as far as it got, a cut trigger is
    markup (never content), and nothing is reported as malformed; streamed the same way."""
    parser = get_parser(parser_name)
    result = parser.extract(text, truncated=True)
    assert result.error is None and result.content == content
    assert [(c.name, c.arguments) for c in result.calls] == calls
    assert parser.extract(text).error is not None or calls == []  # untruncated, a started call is malformed
    st = parser.streamer()
    deltas = [d for ch in text for d in st.feed(ch)]
    tail, streamed = st.finish(truncated=True)
    deltas += tail
    assert "".join(d.content or "" for d in deltas) == (content or "")
    assert [(c.name, c.arguments) for c in streamed.calls] == calls
    for i, (_, args) in enumerate(calls):  # the streamed argument fragments add up to the partial arguments
        assert "".join(d.arguments or "" for d in deltas if d.index == i) == args
