"""Final-only requests (what `LLM.generate` sends): one RequestOutput each, when it finishes, with
the text detokenized then unless stop strings need it earlier; the same final outputs as the
per-step (streaming) path, and the same text as pushing the tokens one by one.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import PROMPT, _assert_idle
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from inflight import LLM, SamplingParams
from inflight.engine.detokenizer import IncrementalDetokenizer, renders_at_once
from inflight.outputs import RequestOutput

PARAMS = [
    SamplingParams(max_tokens=20, temperature=1.5, seed=3, ignore_eos=True),  # odd tokens: partial UTF-8
    SamplingParams(max_tokens=20, temperature=1.5, seed=4, logprobs=2, skip_special_tokens=False),
    SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True, n=2, seed=5),
    SamplingParams(max_tokens=16, temperature=1.0, seed=6, ignore_eos=True, n=2, best_of=3),
    SamplingParams(max_tokens=16, temperature=1.0, seed=7),  # the model's EOS may end it (not rendered)
]


def _streamed(llm: LLM, prompt: str, params: SamplingParams) -> tuple[RequestOutput, list[RequestOutput]]:
    """The per-step path: every output of the request, and its last."""
    engine = llm.engine
    req = engine.make_request(prompt, params)
    engine.add_request(req)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == req.request_id]
    return outs[-1], outs


@pytest.mark.parametrize("params", PARAMS, ids=range(len(PARAMS)))
def test_final_only_gives_the_streamed_outputs(llm: LLM, params: SamplingParams) -> None:
    final, every = _streamed(llm, PROMPT, params)
    got = llm.generate([PROMPT], params, use_tqdm=False)[0]  # final-only
    assert final.finished and got.finished
    assert len(got.outputs) == len(final.outputs)
    for a, b in zip(got.outputs, final.outputs):
        assert (a.index, a.text, list(a.token_ids), a.finish_reason, a.stop_reason) == (
            b.index, b.text, list(b.token_ids), b.finish_reason, b.stop_reason)  # fmt: skip
        assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob)
        assert (a.logprobs is None) == (b.logprobs is None)
        if a.logprobs is not None:
            assert [{t: (e.logprob, e.decoded_token) for t, e in d.items()} for d in a.logprobs] == [
                {t: (e.logprob, e.decoded_token) for t, e in d.items()} for d in b.logprobs]  # fmt: skip
    if params.n == 1:  # the streamed deltas add up to the text final-only renders at the end
        assert "".join(o.outputs[0].delta_text for o in every) == got.outputs[0].text
    _assert_idle(llm)


def test_final_only_makes_one_output_per_request(llm: LLM) -> None:
    engine = llm.engine
    ids = []
    for i in range(3):
        req = engine.make_request(PROMPT, SamplingParams(max_tokens=8 + i, ignore_eos=True, temperature=0.8, n=1 + i % 2), final_only=True)
        engine.add_request(req)
        ids.append(req.request_id)
    seen: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        seen += engine.step()
    assert sorted(o.request_id for o in seen) == sorted(ids)
    assert all(o.finished for o in seen)
    _assert_idle(llm)


def test_final_only_with_stop_strings_still_stops(llm: LLM) -> None:
    full = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    text = full.outputs[0].text
    stop = next(text[i : i + 3] for i in range(len(text) // 2, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    got = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    assert got.outputs[0].stop_reason == stop and got.outputs[0].text == text[: text.find(stop)]


def _sentencepiece_like() -> Any:
    """A Llama-2 style decoder (Metaspace pieces, byte fallback, fuse, strip one leading space)
    over a char-level vocabulary."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["\u2581", *"abcdeéz.", "\u2581a", "\u2581the", "\u00e9t\u00e9"]:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["bytelevel", "sentencepiece"])
def test_finish_renders_what_pushing_renders(kind: str, tiny_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True) if kind == "bytelevel" else _sentencepiece_like()
    rng = random.Random(0)
    differs = False
    emoji = tok.encode("é snow \u2603 and \U0001f600 ok", add_special_tokens=False)
    for trial in range(200):
        pool = emoji if trial % 2 else list(range(len(tok)))
        prompt = [rng.choice(pool) for _ in range(rng.randint(0, 8))]
        out = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
        for skip in (True, False):
            one = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            streamed = "".join(one.push(t) for t in out) + one.flush()
            at_once = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            same = at_once.finish(out) == streamed == one.text == at_once.text
            assert same or not renders_at_once(tok), (prompt, out, skip)
            differs = differs or not same
    # byte fallback renders a run of bytes that is not UTF-8 as one U+FFFD a byte: the text
    # depends on where the windows were cut, so such tokenizers keep pushing token by token
    assert renders_at_once(tok) == (kind == "bytelevel") and differs == (kind != "bytelevel")
