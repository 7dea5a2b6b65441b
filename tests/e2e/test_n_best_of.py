"""n / best_of: sibling sequences share the prompt's KV blocks and merge into one output."""

from __future__ import annotations

import asyncio

import pytest

from inflight import LLM, AsyncEngine, ParamError, SamplingParams

PROMPT = list(range(3, 3 + 45))  # 2 full blocks of 16 + a partial one


def _llm(tiny_model_dir, caching: bool = True) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(
        model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False,
        num_kv_blocks=64, enable_prefix_caching=caching,
    )  # fmt: skip


def _params(**kw) -> SamplingParams:  # type: ignore[no-untyped-def]
    base = {"temperature": 1.0, "max_tokens": 8, "seed": 11, "ignore_eos": True}
    return SamplingParams(**{**base, **kw})


@pytest.mark.parametrize("caching", [True, False])
def test_siblings_share_prompt_blocks_by_reference(tiny_model_dir, caching: bool) -> None:  # type: ignore[no-untyped-def]
    llm = _llm(tiny_model_dir, caching)
    eng = llm.engine
    eng.add_request(eng.make_request({"prompt_token_ids": PROMPT}, _params(n=3), request_id="g"))
    shared_seen = False
    while eng.has_unfinished_requests():
        eng.step()
        seqs = [eng.scheduler.requests.get(f"g#{i}") for i in range(3)]
        if all(s is not None and len(s.block_ids) >= 3 for s in seqs):
            tables = [s.block_ids for s in seqs]  # type: ignore[union-attr]
            assert tables[0][:2] == tables[1][:2] == tables[2][:2]  # the two full prompt blocks
            assert all(eng.kv.pool.blocks[b].ref_cnt == 3 for b in tables[0][:2])
            assert len({t[2] for t in tables}) == 3  # the partial tail block is each one's own
            shared_seen = True
    assert shared_seen
    eng.kv.pool.check_idle()


def test_each_sibling_is_the_single_request_with_seed_plus_i(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = _llm(tiny_model_dir)
    group = llm.generate([{"prompt_token_ids": PROMPT}], _params(n=3), use_tqdm=False)[0]
    assert [c.index for c in group.outputs] == [0, 1, 2]
    for i, c in enumerate(group.outputs):
        alone = llm.generate([{"prompt_token_ids": PROMPT}], _params(seed=11 + i), use_tqdm=False)[0]
        assert c.token_ids == alone.outputs[0].token_ids
        assert c.cumulative_logprob == pytest.approx(alone.outputs[0].cumulative_logprob, abs=1e-5)
    assert len({tuple(c.token_ids) for c in group.outputs}) == 3  # different seeds, different samples


def test_best_of_returns_the_n_most_likely(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = _llm(tiny_model_dir)
    out = llm.generate([{"prompt_token_ids": PROMPT}], _params(n=2, best_of=5), use_tqdm=False)[0]
    singles = [
        llm.generate([{"prompt_token_ids": PROMPT}], _params(seed=11 + i), use_tqdm=False)[0].outputs[0]
        for i in range(5)
    ]
    best = sorted(singles, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in best]
    assert [c.index for c in out.outputs] == [0, 1]
    assert out.outputs[0].cumulative_logprob >= out.outputs[1].cumulative_logprob
    llm.engine.kv.pool.check_idle()


def test_streaming_n_and_abort_of_the_group(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    engine = AsyncEngine(_llm(tiny_model_dir).engine)

    async def stream() -> tuple[dict[int, str], dict[int, list[int]], object]:
        texts: dict[int, str] = {}
        tokens: dict[int, list[int]] = {}
        async for out in engine.generate({"prompt_token_ids": PROMPT}, _params(n=2)):
            for c in out.outputs:
                texts[c.index] = texts.get(c.index, "") + c.delta_text
                tokens.setdefault(c.index, []).extend(c.delta_token_ids)
        return texts, tokens, out

    async def abort_midway() -> str | None:
        gen = engine.generate({"prompt_token_ids": PROMPT}, _params(n=3, max_tokens=300), request_id="grp")
        await anext(gen)
        await engine.abort("grp")
        async for out in gen:  # noqa: B007 (the last one is read below)
            pass
        return out.outputs[0].finish_reason

    try:
        texts, tokens, final = asyncio.run(stream())
        assert final.finished and len(final.outputs) == 2  # type: ignore[attr-defined]
        for c in final.outputs:  # type: ignore[attr-defined]
            assert tokens[c.index] == c.token_ids and texts[c.index] == c.text
        assert asyncio.run(abort_midway()) == "abort"
        assert not engine.engine.has_unfinished_requests() and not engine.engine.parents
        engine.engine.kv.pool.check_idle()
    finally:
        engine.shutdown()


def test_parent_aborted_before_the_fork_leaks_nothing(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False, max_num_seqs=4, max_num_batched_tokens=16)
    eng = llm.engine
    eng.add_request(eng.make_request({"prompt_token_ids": PROMPT}, _params(n=4), request_id="g"))
    eng.step()  # first 16-token chunk of the first sequence; siblings are still held
    assert eng.scheduler.held.get("g#0")
    eng.abort_request("g")
    outs = eng.step()
    assert len(outs) == 1 and outs[0].finished and {c.finish_reason for c in outs[0].outputs} == {"abort"}
    assert not eng.has_unfinished_requests() and not eng.scheduler.held
    eng.kv.pool.check_idle()


@pytest.mark.parametrize(
    "kwargs,param",
    [({"n": 3, "best_of": 2}, "best_of"), ({"best_of": 3, "temperature": 0.0}, "best_of"), ({"best_of": 200}, "best_of")],
)
def test_invalid_best_of(kwargs, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param


@pytest.mark.parametrize("extra", [{"n": 3}, {"n": 1, "best_of": 3}])
def test_an_aborted_group_counts_the_work_of_every_sequence(tiny_model_dir, extra) -> None:  # type: ignore[no-untyped-def]
    """`inflight_wasted_tokens`: what every sibling ran, not sequence 0's only."""
    from inflight.server.metrics import Metrics

    eng = _llm(tiny_model_dir, caching=False).engine
    eng.add_request(eng.make_request({"prompt_token_ids": PROMPT}, _params(max_tokens=50, **extra), request_id="g"))
    for _ in range(5):
        eng.step()
    generated = [len(eng.scheduler.requests[f"g#{i}"].output_token_ids) for i in range(3)]
    assert min(generated) >= 2
    eng.abort_request("g")
    (out,) = eng.step()
    assert out.finished and {c.finish_reason for c in out.outputs} == {"abort"}
    # sequence 0 ran the prompt; each sibling shares its 2 full blocks and runs the 13-token tail;
    # every sequence then ran each token it sampled but the last
    expected = len(PROMPT) + sum(generated) - 3 + 2 * (len(PROMPT) - 32)
    assert out.metrics.num_tokens_run == expected
    metrics = Metrics(AsyncEngine(eng))
    metrics.observe(out)
    assert metrics.wasted._value.get() == expected
    eng.kv.pool.check_idle()
