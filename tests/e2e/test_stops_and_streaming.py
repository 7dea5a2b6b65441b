"""End-to-end stops and streaming on a tiny text model.

Stop strings and ids, min_tokens, end_id and the model's EOS, the max_tokens cap from the
model length, UTF-8-safe incremental detokenization, and AsyncEngine streaming, abort and
timeout. Shared fixtures (model_dir, llm) are in conftest.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import N_TOKENS, PROMPT, _assert_idle, _greedy, _llm
from transformers import AutoTokenizer

from inflight import LLM, AsyncEngine, ParamError, SamplingParams
from inflight.engine.detokenizer import IncrementalDetokenizer, backend_decoder


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)


@pytest.fixture(scope="module")
def greedy_out(llm: LLM) -> Any:
    """The reference greedy completion of PROMPT, without any stop condition."""
    out = llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == N_TOKENS and out.finish_reason == "length"
    return out


# ------------------------------------------------------------------------------ stop conditions
def _pick_stop(text: str) -> str:
    """A 3-character substring from the middle of text, free of replacement characters."""
    for start in list(range(len(text) // 2, len(text) - 3)) + list(range(1, len(text) // 2)):
        cand = text[start : start + 3]
        if "\ufffd" not in cand and cand.strip():
            return cand
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_trims_text(llm: LLM, greedy_out: Any) -> None:
    full = greedy_out.text
    stop = _pick_stop(full)
    idx = full.find(stop)
    assert idx > 0

    o = llm.generate([PROMPT], _greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == full[:idx]
    assert len(o.token_ids) < N_TOKENS
    assert o.token_ids == greedy_out.token_ids[: len(o.token_ids)]

    o = llm.generate(
        [PROMPT], _greedy(stop=[stop], include_stop_str_in_output=True), use_tqdm=False
    )[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == full[: idx + len(stop)]
    assert o.text.endswith(stop)

    # of several stop strings, the earliest in the text wins
    o = llm.generate([PROMPT], _greedy(stop=["\u2603never", stop]), use_tqdm=False)[0].outputs[0]
    assert o.stop_reason == stop and o.text == full[:idx]
    _assert_idle(llm)


def test_stop_token_ids(llm: LLM, greedy_out: Any, tok: Any) -> None:
    g = greedy_out.token_ids
    stop_id = g[4]
    first = g.index(stop_id)
    o = llm.generate([PROMPT], _greedy(stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop_id
    assert o.token_ids == g[: first + 1]  # the stop token is kept in token_ids...
    assert o.text == tok.decode(g[:first])  # ...but not rendered in the text
    o = llm.generate(
        [PROMPT], _greedy(stop_token_ids=[stop_id], include_stop_str_in_output=True), use_tqdm=False
    )
    o = o[0].outputs[0]
    assert o.token_ids == g[: first + 1] and o.text == tok.decode(g[: first + 1])
    _assert_idle(llm)


def test_min_tokens_bans_stop_ids_until_reached(llm: LLM, greedy_out: Any) -> None:
    stop_id = greedy_out.token_ids[1]
    for min_tokens in (0, 3, 6):
        params = _greedy(stop_token_ids=[stop_id], min_tokens=min_tokens)
        o = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
        assert stop_id not in o.token_ids[:min_tokens]
        if o.finish_reason == "stop":
            assert o.stop_reason == stop_id and len(o.token_ids) > min_tokens
            assert o.token_ids.index(stop_id) == len(o.token_ids) - 1
        else:
            assert o.finish_reason == "length" and len(o.token_ids) == N_TOKENS
    _assert_idle(llm)


def test_end_id_and_ignore_eos(llm: LLM, greedy_out: Any, tok: Any) -> None:
    g = greedy_out.token_ids
    end = g[2]
    first = g.index(end)
    o = llm.generate(
        [PROMPT], SamplingParams(max_tokens=N_TOKENS, temperature=0.0, end_id=end), use_tqdm=False
    )
    o = o[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason is None
    assert o.token_ids == g[: first + 1]
    assert o.text == tok.decode(g[:first])  # the end token is not rendered

    o = llm.generate([PROMPT], _greedy(end_id=end), use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "length" and o.token_ids == g
    _assert_idle(llm)


def test_model_eos_from_generation_config(
    tiny_model_dir: Callable[..., Path], greedy_out: Any, tok: Any
) -> None:
    """Same weights (same seed), but the checkpoint names the 3rd greedy token as its EOS."""
    g = greedy_out.token_ids
    eos = g[2]
    first = g.index(eos)
    llm = _llm(tiny_model_dir("qwen2", eos_token_id=eos))
    assert llm.engine.config.model.eos_token_ids == (eos,)
    o = llm.generate([PROMPT], SamplingParams(max_tokens=N_TOKENS, temperature=0.0), use_tqdm=False)
    o = o[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason is None
    assert o.token_ids == g[: first + 1]
    assert o.text == tok.decode(g[:first])

    o = llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0]  # ignore_eos=True
    assert o.finish_reason == "length" and o.token_ids == g
    # end_id overrides the model's EOS for one request
    o = llm.generate(
        [PROMPT], SamplingParams(max_tokens=N_TOKENS, temperature=0.0, end_id=1), use_tqdm=False
    )
    assert o[0].outputs[0].token_ids == g
    _assert_idle(llm)


# ------------------------------------------------------------------------------ model length
def test_max_tokens_capped_by_model_length(model_dir: Path) -> None:
    llm = _llm(model_dir, max_model_len=64, num_kv_blocks=8)
    assert llm.engine.max_model_len == 64
    prompt = list(range(100, 160))
    o = llm.generate(
        [prompt], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    o = o[0].outputs[0]
    assert len(o.token_ids) == 4 and o.finish_reason == "length"
    # max_tokens=None means "up to the model length"
    o = llm.generate(
        [prompt], SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True), use_tqdm=False
    )
    assert len(o[0].outputs[0].token_ids) == 4

    with pytest.raises(ParamError) as exc:
        llm.generate([list(range(100, 164))], SamplingParams(max_tokens=1), use_tqdm=False)
    assert exc.value.param == "prompt" and "prompt" in str(exc.value)
    _assert_idle(llm)


# ------------------------------------------------------------------------------ detokenization
MULTIBYTE_TEXT = "你好 🦄 龍鳳 🧬 hello"


def test_incremental_detokenizer_never_emits_broken_utf8(tok: Any) -> None:
    ids = tok.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    # the text really splits characters over tokens
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    texts: dict[int, str] = {}  # one token's text, shared (OutputProcessor's): the same deltas, cold or warm
    for prompt_ids, shared in [(p, t) for p in ([], tok.encode("Launch party: ", add_special_tokens=False)) for t in (None, texts, texts)]:
        detok = IncrementalDetokenizer(tok, prompt_ids, one_token_texts=shared)
        deltas = [detok.push(t) for t in ids]
        deltas.append(detok.flush())
        assert all("\ufffd" not in d for d in deltas), deltas
        assert "".join(deltas) == tok.decode(ids) == MULTIBYTE_TEXT
        assert detok.text == MULTIBYTE_TEXT
        assert sum(1 for d in deltas if d == "") > 0  # some tokens had to be held back


def test_ids_the_tokenizer_lacks_render_nothing_and_hold_nothing_back(tok: Any) -> None:
    """A padded vocabulary's ids (the model samples them, the tokenizer has no such token): the
    deltas are those of the same stream without them."""
    ids = tok.encode(MULTIBYTE_TEXT, add_special_tokens=False)
    padded = [x for t in ids for x in (t, len(tok) + 7)]
    deltas = []
    for stream in (ids, padded):
        detok = IncrementalDetokenizer(tok, [])
        deltas.append([detok.push(t) for t in stream] + [detok.flush()])
        assert detok.text == MULTIBYTE_TEXT == tok.decode(stream)
    assert deltas[1][1:-1:2] == [""] * len(ids)  # the padded ids
    assert deltas[1][0:-1:2] + deltas[1][-1:] == deltas[0]


def test_incremental_detokenizer_flushes_a_dangling_partial_character(tok: Any) -> None:
    ids = tok.encode("ok 🦄", add_special_tokens=False)
    assert "\ufffd" in tok.decode(ids[:-1])  # the emoji is split: its last byte is missing
    detok = IncrementalDetokenizer(tok, [])
    deltas = [detok.push(t) for t in ids[:-1]]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas).startswith("ok")
    tail = detok.flush()  # generation ended mid-character: show what is there, as it decodes
    assert tail.endswith("\ufffd")
    assert detok.text == tok.decode(ids[:-1])


def test_backend_decoder_gives_the_tokenizers_text(tok: Any) -> None:
    """The detokenizer's shortcut (the Rust decode, straight) against `tokenizer.decode`: every
    window of a text with split characters, special tokens kept and skipped."""
    decode = backend_decoder(tok)
    assert decode is not None  # the test tokenizer is a BPE fast tokenizer: the shortcut applies
    specials = tok.all_special_ids
    ids = [specials[0], *tok.encode(MULTIBYTE_TEXT + " and  spaces , too.", add_special_tokens=False), *specials[1:]]
    for skip in (True, False):
        for i in range(len(ids)):
            window = ids[i : i + 6]
            assert decode(window, skip_special_tokens=skip) == tok.decode(window, skip_special_tokens=skip)
    # a tokenizer whose clean-up pass runs (not BPE) keeps transformers' decode
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    wordpiece = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),
                                        clean_up_tokenization_spaces=True)  # fmt: skip
    assert backend_decoder(wordpiece) is None and backend_decoder(object()) is None


# ------------------------------------------------------------------------------ async engine
async def _collect(
    engine: AsyncEngine, prompt: Any, params: SamplingParams, **kw: Any
) -> list[Any]:
    return [out async for out in engine.generate(prompt, params, **kw)]


async def _wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.engine.has_unfinished_requests() or engine.engine.requests:
        assert time.monotonic() < deadline, "engine did not go idle"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def async_llm(model_dir: Path) -> LLM:
    return _llm(model_dir)


def test_async_streaming_deltas(async_llm: LLM, greedy_out: Any) -> None:
    engine = AsyncEngine(async_llm.engine)
    stop = _pick_stop(greedy_out.text)

    async def main() -> None:
        # plain streaming: deltas add up to the final output
        outs = await _collect(engine, PROMPT, _greedy(logprobs=1))
        assert outs[-1].finished and all(not o.finished for o in outs[:-1])
        final = outs[-1].outputs[0]
        assert final.token_ids == greedy_out.token_ids and final.text == greedy_out.text
        assert "".join(o.outputs[0].delta_text for o in outs) == final.text
        assert [t for o in outs for t in o.outputs[0].delta_token_ids] == final.token_ids
        assert sum(len(o.outputs[0].delta_logprobs) for o in outs) == len(final.token_ids)

        # with a stop string: no part of it is ever streamed, deltas still add up
        outs = await _collect(engine, PROMPT, _greedy(stop=[stop]))
        final = outs[-1].outputs[0]
        assert final.finish_reason == "stop" and final.stop_reason == stop
        streamed = "".join(o.outputs[0].delta_text for o in outs)
        assert streamed == final.text == greedy_out.text[: greedy_out.text.find(stop)]

        # several concurrent streams
        results = await asyncio.gather(
            *(_collect(engine, PROMPT, _greedy(max_tokens=n)) for n in (3, 8, 13))
        )
        for n, outs in zip((3, 8, 13), results):
            assert outs[-1].outputs[0].token_ids == greedy_out.token_ids[:n]

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert engine.errored is None
    _assert_idle(async_llm)


def test_async_abort_on_close(async_llm: LLM) -> None:
    engine = AsyncEngine(async_llm.engine)
    req = async_llm.engine.make_request(PROMPT, _greedy(max_tokens=200), request_id="to-abort")

    async def main() -> None:
        received = 0
        agen = engine.submit(req)
        async for out in agen:
            received += 1
            assert not out.finished
            if received == 3:
                break
        await agen.aclose()  # what a disconnecting caller's generator cleanup does
        await _wait_idle(engine)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert req.finish_reason is not None and req.finish_reason.value == "abort"
    assert 3 <= req.num_output_tokens < 200
    _assert_idle(async_llm)


def test_async_abort_when_generate_is_abandoned(
    async_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaking out of `async for` over generate() and dropping it: the request is aborted."""
    engine = AsyncEngine(async_llm.engine)
    scheduler = async_llm.engine.scheduler
    finished: list[tuple[str, str, int]] = []
    finish = scheduler.finish

    def spy(request: Any, reason: Any, stop_reason: Any = None) -> None:
        finished.append((request.request_id, reason.value, request.num_output_tokens))
        finish(request, reason, stop_reason)

    monkeypatch.setattr(scheduler, "finish", spy)
    seen: list[Any] = []

    async def main() -> None:
        async for out in engine.generate(PROMPT, _greedy(max_tokens=400), request_id="abandoned"):
            seen.append(out)
            if len(seen) == 3:
                break
        await _wait_idle(engine)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(seen) == 3
    assert len(finished) == 1
    rid, reason, n_tokens = finished[0]
    assert (rid, reason) == ("abandoned", "abort") and n_tokens < 400
    _assert_idle(async_llm)


def test_async_timeout(async_llm: LLM) -> None:
    engine = AsyncEngine(async_llm.engine)

    async def main() -> list[Any]:
        return await _collect(engine, PROMPT, _greedy(max_tokens=400), timeout=0.05)

    try:
        t0 = time.perf_counter()
        outs = asyncio.run(main())
        elapsed = time.perf_counter() - t0
    finally:
        engine.shutdown()
    final = outs[-1]
    assert final.finished and final.outputs[0].finish_reason == "timeout"
    assert len(final.outputs[0].token_ids) < 400
    assert elapsed < 5
    _assert_idle(async_llm)


def test_async_invalid_input_raises_before_streaming(async_llm: LLM) -> None:
    engine = AsyncEngine(async_llm.engine)

    async def main() -> None:
        with pytest.raises(ParamError) as exc:
            await _collect(engine, [5, 10_000], _greedy())
        assert exc.value.param == "prompt"

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    _assert_idle(async_llm)


def test_launch_builds_and_runs_on_one_engine_thread(model_dir: Path, greedy_out: Any) -> None:
    """`launch` builds the engine on the engine thread, `call` runs model work there too, and
    both hand exceptions back to the caller (all torch work on one thread: see AsyncEngine)."""
    built_on: list[threading.Thread] = []

    def build() -> Any:
        built_on.append(threading.current_thread())
        return _llm(model_dir).engine

    engine = AsyncEngine.launch(build)
    try:
        assert built_on == [engine._thread] and built_on[0] is not threading.main_thread()

        async def main() -> None:
            gen = asyncio.create_task(_collect(engine, PROMPT, _greedy()))
            # a call between steps while a request runs
            assert await engine.call(threading.current_thread) is built_on[0]
            assert await engine.call(lambda a, b: a + b, 2, 3) == 5
            with pytest.raises(ZeroDivisionError):
                await engine.call(lambda: 1 // 0)
            outs = await gen
            assert outs[-1].outputs[0].token_ids == greedy_out.token_ids

        asyncio.run(main())
        assert engine.is_running and engine.errored is None  # a failing call is not an engine error
    finally:
        engine.shutdown()

    def broken() -> Any:
        raise ValueError("no such checkpoint")

    with pytest.raises(ValueError, match="no such checkpoint"):
        AsyncEngine.launch(broken)
