"""TextSoFar: a request's output text kept as pieces (no whole copy a token), read as a str."""

from __future__ import annotations

import random

from inflight.outputs import CompletionOutput, TextPrefix, TextSoFar


def test_between_is_the_joined_texts_slice() -> None:
    rng = random.Random(0)
    text, whole = TextSoFar(), ""
    for step in range(300):
        piece = "".join(rng.choice("ab€😀 \n") for _ in range(rng.randrange(0, 4)))
        text.append(piece)
        whole += piece
        assert text.length == len(whole)
        for _ in range(3):
            a, b = sorted(rng.randrange(0, len(whole) + 2) for _ in range(2))
            assert text.between(a, b) == whole[a:b]
        if step % 50 == 0:
            assert str(text) == whole  # joined (and kept joined); later pieces still append
    assert str(text) == whole


def test_an_output_keeps_the_text_it_was_made_with() -> None:
    """An output made over the growing text reads the text of its own step, however much came
    after (as Prefix does for token ids), and a str field stays as given."""
    text = TextSoFar("Hello")
    first = CompletionOutput(index=0, text=TextPrefix(text, text.length), token_ids=[1], cumulative_logprob=None, logprobs=None)  # type: ignore[arg-type]
    text.append(", world")
    second = CompletionOutput(index=0, text=TextPrefix(text, 9), token_ids=[1, 2], cumulative_logprob=None, logprobs=None)  # type: ignore[arg-type]
    text.append("!")
    assert (first.text, second.text, str(text)) == ("Hello", "Hello, wo", "Hello, world!")
    assert first == CompletionOutput(index=0, text="Hello", token_ids=[1], cumulative_logprob=None, logprobs=None)
    whole = CompletionOutput(index=0, text=TextPrefix(text, text.length), token_ids=[], cumulative_logprob=None, logprobs=None)  # type: ignore[arg-type]
    assert whole.text is str(text)  # the whole text: no copy
