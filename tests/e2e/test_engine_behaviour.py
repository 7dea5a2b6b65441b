"""End-to-end engine behaviour on a tiny text model: caching, sampling, stops, streaming, errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from inflight import LLM, AsyncEngine, ParamError, SamplingParams
from inflight.engine.detokenizer import IncrementalDetokenizer

PROMPT = "The old man finds a golden compass near the sea."
N_TOKENS = 24


def _llm(path: Path, **overrides: Any) -> LLM:
    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "device": "cpu",
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "num_kv_blocks": 64,
        "block_size": 16,
        "enable_prefix_caching": True,
        "progress": False,
    }
    kwargs.update(overrides)
    return LLM(model=str(path), **kwargs)


def _greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(**{"max_tokens": N_TOKENS, "temperature": 0.0, "ignore_eos": True, **kw})


def _assert_idle(llm: LLM) -> None:
    assert not llm.engine.has_unfinished_requests()
    assert not llm.engine.requests
    llm.engine.kv.pool.check_idle()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Callable[..., Path]) -> Path:
    return tiny_model_dir("qwen2")  # ships the tiny byte-level BPE tokenizer


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return _llm(model_dir)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)


@pytest.fixture(scope="module")
def greedy_out(llm: LLM) -> Any:
    """The reference greedy completion of PROMPT, without any stop condition."""
    out = llm.generate([PROMPT], _greedy(), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == N_TOKENS and out.finish_reason == "length"
    return out


# ------------------------------------------------------------------------------ prefix caching
def _prefix_waves(path: Path, caching: bool) -> tuple[list[Any], list[Any], LLM]:
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(3, 1000, (40,), generator=gen).tolist()
    suffixes = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 9, 13, 2, 20, 7)]
    prompts = [{"prompt_token_ids": shared + s} for s in suffixes]
    llm = _llm(path, enable_prefix_caching=caching)
    params = _greedy(max_tokens=12)
    wave1 = llm.generate(prompts[:3], params, use_tqdm=False)
    wave2 = llm.generate(prompts[3:], params, use_tqdm=False)
    _assert_idle(llm)
    return wave1, wave2, llm


def test_prefix_caching_on_and_off_give_identical_tokens(model_dir: Path) -> None:
    on1, on2, llm_on = _prefix_waves(model_dir, caching=True)
    off1, off2, _ = _prefix_waves(model_dir, caching=False)
    for a, b in zip(on1 + on2, off1 + off2):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    # second wave: the 40-token shared prefix holds 2 full blocks of 16
    assert all(o.metrics.num_cached_tokens == 32 for o in on2)
    assert all(o.num_cached_tokens == 32 for o in on2)
    assert all(o.metrics.num_cached_tokens == 0 for o in off1 + off2)
    assert llm_on.engine.stats().prefix_cache_hit_rate > 0


# ------------------------------------------------------------------------------ seeded sampling
SEEDED = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_tokens": 16, "ignore_eos": True}


def test_seeded_sampling_is_independent_of_the_batch(llm: LLM) -> None:
    target = {"prompt_token_ids": [11, 220, 305, 47, 90, 612, 18]}
    alone = llm.generate([target], SamplingParams(seed=1234, **SEEDED), use_tqdm=False)[0]

    others = [
        (
            "The cat sees a red house today.",
            SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        ),
        ("A young girl paints the blue river.", SamplingParams(max_tokens=9, temperature=1.0)),
        (
            {"prompt_token_ids": list(range(3, 50))},
            SamplingParams(max_tokens=30, temperature=1.3, top_k=5, seed=7),
        ),
        (
            "你好世界，今天天气很好。",
            SamplingParams(max_tokens=12, temperature=0.5, top_p=0.5, logprobs=2),
        ),
        ([5, 6, 7], SamplingParams(max_tokens=25, temperature=0.7, seed=99, ignore_eos=True)),
    ]
    prompts = [p for p, _ in others[:2]] + [target] + [p for p, _ in others[2:]]
    params = (
        [s for _, s in others[:2]]
        + [SamplingParams(seed=1234, **SEEDED)]
        + [s for _, s in others[2:]]
    )
    batched = llm.generate(prompts, params, use_tqdm=False)
    assert batched[2].outputs[0].token_ids == alone.outputs[0].token_ids
    assert len(alone.outputs[0].token_ids) == 16

    other_seed = llm.generate([target], SamplingParams(seed=4321, **SEEDED), use_tqdm=False)[0]
    assert other_seed.outputs[0].token_ids != alone.outputs[0].token_ids
    _assert_idle(llm)


def test_unseeded_sampling_works(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, top_k=50, max_tokens=10, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT], params, use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        assert len(o.token_ids) == 10 and o.finish_reason == "length"
        assert all(0 <= t < 1000 for t in o.token_ids)
    _assert_idle(llm)


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
    for prompt_ids in ([], tok.encode("Launch party: ", add_special_tokens=False)):
        detok = IncrementalDetokenizer(tok, prompt_ids)
        deltas = [detok.push(t) for t in ids]
        deltas.append(detok.flush())
        assert all("\ufffd" not in d for d in deltas), deltas
        assert "".join(deltas) == tok.decode(ids) == MULTIBYTE_TEXT
        assert detok.text == MULTIBYTE_TEXT
        assert sum(1 for d in deltas if d == "") > 0  # some tokens had to be held back


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


# ------------------------------------------------------------------------------ invalid input
@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 2, "temperature": 0.0}, "n"),
        ({"stop": [""]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"seed": -1}, "seed"),
    ],
)
def test_invalid_sampling_params(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as exc:
        SamplingParams(**kwargs)
    assert exc.value.param == param


@pytest.mark.parametrize(
    "prompt, extra, param",
    [
        ("", {}, "prompt"),
        ([], {}, "prompt"),
        ({"prompt_token_ids": []}, {}, "prompt"),
        ([5, 1000], {}, "prompt"),  # vocab is 1000
        ([5, -1], {}, "prompt"),
        (PROMPT, {"priority": 0}, "priority"),
        (PROMPT, {"priority": 6}, "priority"),
        (PROMPT, {"timeout": 0}, "timeout"),
        (PROMPT, {"timeout": 4000}, "timeout"),
    ],
)
def test_invalid_requests(llm: LLM, prompt: Any, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as exc:
        llm.engine.make_request(prompt, SamplingParams(), **extra)
    assert exc.value.param == param
    assert not llm.engine.requests


def test_invalid_priority_through_llm_generate(llm: LLM) -> None:
    with pytest.raises(ParamError) as exc:
        llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False, priority=[0])
    assert exc.value.param == "priority"
    _assert_idle(llm)


def test_invalid_prompt_in_a_batch_queues_nothing(llm: LLM) -> None:
    """All prompts are validated before any is queued: no orphan runs on the next call."""
    with pytest.raises(ParamError) as exc:
        llm.generate([PROMPT, "", PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert exc.value.param == "prompt"
    assert not llm.engine.requests and not llm.engine.has_unfinished_requests()
    outs = llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(outs) == 1
    _assert_idle(llm)


# ------------------------------------------------------------------------------ logprobs
def test_logprobs_consistency(llm: LLM) -> None:
    greedy = _greedy(max_tokens=12, logprobs=2)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True, logprobs=0)
    outs = llm.generate([PROMPT, PROMPT], [greedy, sampled], use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        chosen = [o.logprobs[i][t] for i, t in enumerate(o.token_ids)]
        assert all(next(iter(entry)) == t for entry, t in zip(o.logprobs, o.token_ids))
        assert o.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in chosen), abs=1e-6)
        assert all(lp.logprob <= 0 and lp.rank >= 1 for lp in chosen)
        assert all(lp.decoded_token is not None for lp in chosen)
    g = outs[0].outputs[0]
    assert all(g.logprobs[i][t].rank == 1 for i, t in enumerate(g.token_ids))
    assert all(len(entry) == 2 for entry in g.logprobs)  # chosen (== top-1) + top-2
    s = outs[1].outputs[0]
    assert all(len(entry) == 1 for entry in s.logprobs)  # logprobs=0: the chosen token only
    # no logprobs asked: none returned, but the cumulative logprob is still kept
    o = llm.generate([PROMPT], _greedy(max_tokens=4), use_tqdm=False)[0].outputs[0]
    assert o.logprobs is None and o.cumulative_logprob is not None and o.cumulative_logprob < 0
    _assert_idle(llm)
