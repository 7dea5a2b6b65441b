"""The Python API surface of the engine core: chat, token-id-only checkpoints, dtypes, metrics."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from inflight import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _hf_greedy(path, ids: list[int], n: int, dtype=torch.float32) -> list[int]:  # type: ignore[no-untyped-def]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()


def test_chat_applies_the_template_without_a_second_bos(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_dir("qwen2")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    tok = AutoTokenizer.from_pretrained(str(path))
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt == text and text.endswith("<|im_start|>assistant\n")
    assert out.prompt_token_ids == tok.encode(text, add_special_tokens=False)
    assert out.outputs[0].token_ids == _hf_greedy(path, out.prompt_token_ids, 8)
    # a list of conversations gives one output per conversation, in order
    outs = llm.chat([messages, messages[1:]], GREEDY, use_tqdm=False)
    assert len(outs) == 2 and outs[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_checkpoint_without_tokenizer_serves_token_ids(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_dir("llama", with_tokenizer=False)
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    assert llm.get_tokenizer() is None
    ids = [5, 17, 300, 42, 9]
    out = llm.generate([ids], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == _hf_greedy(path, ids, 8)
    assert out.outputs[0].text == ""


def test_plain_linear_path_matches_hf(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """The un-packed F.linear path (what CUDA runs) keeps parity too."""
    for arch in ("qwen3", "mistral"):
        path = tiny_model_dir(arch)
        llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False, cpu_fast_path=False)
        ids = list(range(3, 40))
        out = llm.generate([ids], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False)
        assert out[0].outputs[0].token_ids == _hf_greedy(path, ids, 12), arch


def test_float16_runs_and_matches_hf_float32_first_token(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_dir("llama")
    llm = LLM(model=str(path), dtype="float16", device="cpu", progress=False)
    assert llm.engine.config.model.dtype == torch.float16
    prompts = [list(range(3 + i, 30 + i)) for i in range(4)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    matches = sum(o.outputs[0].token_ids == _hf_greedy(path, p, 1) for o, p in zip(outs, prompts))
    assert matches >= 3


def test_metrics_are_filled(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_dir("llama")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False, max_num_batched_tokens=64)
    prompts = [list(range(3, 3 + n)) for n in (10, 20, 30)]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for o in outs:
        m = o.metrics
        assert m.queue_wait_us is not None and m.queue_wait_us >= 0
        assert m.time_to_first_token_ms is not None and m.time_to_first_token_ms > 0
        assert len(m.token_times) == 8 and len(m.decode_times_ms) == 7
        assert all(t >= 0 for t in m.decode_times_ms)
        assert len(m.batch_sizes) == 8 and all(1 <= b <= 3 for b in m.batch_sizes)
        assert m.finished_time is not None and m.finished_time >= m.first_token_time
    # the three ran together: at least one step carried all of them
    assert max(max(o.metrics.batch_sizes) for o in outs) == 3


def test_priority_reaches_the_scheduler(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """With room for one request at a time, priority 1 finishes before earlier-queued priority 5."""
    path = tiny_model_dir("llama")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False, max_num_seqs=1, max_num_batched_tokens=64)
    prompts = [list(range(3, 13)), list(range(4, 14)), list(range(5, 15))]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False, priority=[5, 5, 1])
    first_tokens = [o.metrics.first_token_time for o in outs]
    assert first_tokens[2] < first_tokens[0] < first_tokens[1]


def test_generation_config_defaults(tiny_model_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import shutil

    path = tmp_path / "m"
    shutil.copytree(tiny_model_dir("llama"), path)
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update({"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8})
    (path / "generation_config.json").write_text(json.dumps(gen))
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    p = llm.get_default_sampling_params()
    assert (p.temperature, p.top_k, p.top_p) == (0.7, 20, 0.8)


@pytest.mark.parametrize("runner_thread", ["0", "1"], ids=["in-step", "async-scheduled"])
def test_reused_request_id_never_kills_the_engine_thread(tiny_model_dir, monkeypatch, runner_thread) -> None:  # type: ignore[no-untyped-def]
    """An id taken again right after its request was abandoned: rejected while the old one lives,
    else served; never the old request's end. With async scheduling (the runner on its own thread,
    as `mp`) an aborted request ended a step after its id was free again, and that end went to
    the new stream: finish_reason "abort" in ~1 of 6 runs (engine/streams.py)."""
    import asyncio

    from inflight import AsyncEngine, LLMEngine, ParamError

    monkeypatch.setenv("INFLIGHT_RUNNER_THREAD", runner_thread)
    engine = AsyncEngine(LLMEngine.from_args(str(tiny_model_dir("llama")), dtype="float32", device="cpu", progress=False))
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def scenario() -> list[str]:
        outcomes = []
        for _ in range(12):
            try:
                gen = engine.generate(list(range(3, 20)), long, request_id="same")
                await anext(gen)
                await gen.aclose()  # abandon: the abort is queued ...
                # ... and the same id comes straight back, while the old one may still be live
                async for out in engine.generate(list(range(3, 20)), GREEDY, request_id="same"):  # noqa: B007 (the last output is read below)
                    pass
                outcomes.append(out.outputs[0].finish_reason or "")
            except ParamError as e:
                assert e.param == "request_id"
                outcomes.append("rejected")
        async for out in engine.generate(list(range(5, 9)), GREEDY):  # noqa: B007 (the last output is read below)
            pass
        outcomes.append(out.outputs[0].finish_reason or "")
        return outcomes

    try:
        outcomes = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert engine.errored is None
    assert all(o in ("length", "rejected") for o in outcomes) and outcomes[-1] == "length"


def test_closing_the_stream_aborts_now_not_at_gc(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import time

    from inflight import AsyncEngine, LLMEngine

    engine = AsyncEngine(LLMEngine.from_args(str(tiny_model_dir("llama")), dtype="float32", device="cpu", progress=False))
    long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    kept = []

    async def scenario() -> float:
        gen = engine.generate(list(range(3, 20)), long)
        kept.append(gen)  # a live reference: garbage collection cannot be what aborts it
        await anext(gen)
        await gen.aclose()
        start = time.perf_counter()
        while engine.engine.has_unfinished_requests() and time.perf_counter() - start < 5:
            await asyncio.sleep(0.005)
        return time.perf_counter() - start

    try:
        waited = asyncio.run(scenario())
        assert not engine.engine.has_unfinished_requests() and waited < 1.0
        engine.engine.kv.pool.check_idle()
    finally:
        engine.shutdown()


def test_step_token_budget_defaults_to_512_on_cpu_and_honours_an_explicit_one(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """CPU default 512 tokens per step; an explicit budget is the chunk size a prompt prefills in
    (a 500-token prompt: one step under 512 or 1024, three under 200)."""
    path = tiny_model_dir("llama")
    prompt = [3 + i % 200 for i in range(500)]
    steps = {}
    for budget in (None, 200, 1024):
        kw = {} if budget is None else {"max_num_batched_tokens": budget}
        llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False, max_model_len=512, **kw)
        assert llm.engine.config.scheduler.max_num_batched_tokens == (budget or 512)
        engine = llm.engine
        engine.add_request(engine.make_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1)))
        n = 0
        while engine.has_unfinished_requests():
            engine.step()
            n += 1
        steps[budget] = n
    assert steps == {None: 1, 200: 3, 1024: 1}
