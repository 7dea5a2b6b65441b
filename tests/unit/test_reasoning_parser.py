"""Reasoning parsers on text: the split at every chunking, tags cut across chunks, where a
generation begins (from the prompt's tail), token counts, and how parsers are chosen."""

from __future__ import annotations

import itertools

import pytest

from inflight.reasoning import ReasoningParser, detect_reasoning_parser, get_reasoning_parser
from inflight.testing.reasoning import QWEN3_LIKE_TEMPLATE


def _parser(name: str = "qwen3") -> ReasoningParser:
    return ReasoningParser(name, "<think>", "</think>", 10, 11, name == "deepseek_r1", False)


CASES = [  # (output, begins in reasoning, reasoning, content)
    ("<think>\nI think.\n</think>\n\nThe answer.", False, "I think.\n", "The answer."),
    ("The answer, no thinking.", False, None, "The answer, no thinking."),
    ("  <think>a</think>b", False, "a", "b"),
    ("I think.</think>The answer.", True, "I think.", "The answer."),
    ("<think>\nrepeated tag</think>ok", True, "repeated tag", "ok"),
    ("all thinking, cut by max_tokens", True, "all thinking, cut by max_tokens", None),
    ("<think>unfinished", False, "unfinished", None),
    ("answer with <think> later", False, None, "answer with <think> later"),
    ("<thin", False, None, "<thin"),
    ("x</thin", True, "x</thin", None),
    ("<think></think>", False, "", None),
]


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_split(text: str, inside: bool, reasoning: str | None, content: str | None) -> None:
    s = _parser().split(text, inside)
    assert (s.reasoning, s.content) == (reasoning, content)


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_streamed_pieces_add_up_to_the_split_at_every_cut(text: str, inside: bool, reasoning: str | None, content: str | None) -> None:
    """Every way of cutting the text in two or three pieces streams the same parts, and no
    piece of a tag ever shows in either part."""
    n = len(text)
    for cuts in itertools.chain(itertools.combinations(range(1, n), 1), itertools.combinations(range(1, n), 2)):
        bounds = [0, *cuts, n]
        st = _parser().streamer(inside)
        got_r, got_c = "", ""
        for a, b in itertools.pairwise(bounds):
            r, c = st.feed(text[a:b])
            got_r, got_c = got_r + r, got_c + c
        r, c = st.finish()
        got_r, got_c = got_r + r, got_c + c
        assert got_r == (reasoning or "") and got_c == (content or ""), cuts


def test_where_a_generation_begins() -> None:
    qwen3, r1 = _parser("qwen3"), _parser("deepseek_r1")
    assert not qwen3.begins_in_reasoning("<|im_start|>assistant\n")
    assert qwen3.begins_in_reasoning("<|im_start|>assistant\n<think>\n")  # Qwen3-Thinking-2507
    assert not qwen3.begins_in_reasoning("assistant\n<think>\n\n</think>\n\n")  # enable_thinking false
    assert r1.begins_in_reasoning("<｜Assistant｜>")
    assert not r1.begins_in_reasoning("<｜Assistant｜><think>\n\n</think>\n\n")


def test_reasoning_token_count_includes_the_tags() -> None:
    p = _parser()
    assert p.count_reasoning_tokens([10, 1, 2, 11, 5, 6], False) == 4
    assert p.count_reasoning_tokens([1, 2, 11, 5], True) == 3
    assert p.count_reasoning_tokens([1, 2, 3], True) == 3  # never closed: all thinking
    assert p.count_reasoning_tokens([1, 2, 11, 5], False) == 0  # no thinking section


class _Tok:
    def __init__(self, template: str | None, tokens: list[str], specials: list[str] = []) -> None:  # noqa: B006
        self.chat_template = template
        self.vocab = {t: 100 + i for i, t in enumerate(tokens)}
        self.all_special_tokens = specials

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_parsers_by_name_and_by_template() -> None:
    tok = _Tok(QWEN3_LIKE_TEMPLATE, ["<think>", "</think>", "<seed:think>", "</seed:think>"], ["<seed:think>"])
    assert detect_reasoning_parser(tok) == "qwen3"
    assert detect_reasoning_parser(_Tok("{{ '<｜Assistant｜><think>' }}</think>", ["<think>", "</think>"])) == "deepseek_r1"
    assert detect_reasoning_parser(_Tok("<|im_start|>", ["<think>", "</think>"])) is None
    assert detect_reasoning_parser(_Tok(QWEN3_LIKE_TEMPLATE, [])) is None  # tags that are no tokens
    p = get_reasoning_parser("tags", tok, "<seed:think>", "</seed:think>")
    assert (p.start_id, p.end_id, p.special, p.default_in_reasoning) == (102, 103, True, False)
    assert get_reasoning_parser("deepseek_r1", tok).default_in_reasoning
    with pytest.raises(ValueError, match="not a token"):
        get_reasoning_parser("qwen3", _Tok(None, ["<think>"]))
    with pytest.raises(ValueError, match="not one of"):
        get_reasoning_parser("granite", tok)
