"""External draft tokens (speculative decoding): verified in one step; greedy outputs never change,
sampled ones keep the target distribution (speculative sampling against draft_logits)."""

from __future__ import annotations

import math

import pytest
import torch

from inflight import LLM, ParamError, SamplingParams

PROMPT = list(range(3, 40))
N = 20


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)


def _greedy(**kw) -> SamplingParams:  # type: ignore[no-untyped-def]
    return SamplingParams(**{"max_tokens": N, "temperature": 0.0, "ignore_eos": True, "logprobs": 1, **kw})


def _run(llm: LLM, prompts: list, params=None) -> list:  # type: ignore[no-untyped-def]
    eng, steps = llm.engine, 0
    reqs = [eng.make_request(p, params or _greedy()) for p in prompts]
    for r in reqs:
        eng.add_request(r)
    final = {}
    while eng.has_unfinished_requests():
        steps += 1
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
    eng.kv.pool.check_idle()
    return [final[r.request_id] for r in reqs], steps


def test_own_greedy_drafts_are_all_accepted_and_save_steps(llm) -> None:  # type: ignore[no-untyped-def]
    (base,), base_steps = _run(llm, [{"prompt_token_ids": PROMPT}])
    ref = base.outputs[0].token_ids
    (out,), steps = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": ref[:8]}])
    assert out.outputs[0].token_ids == ref
    assert (out.metrics.num_draft_tokens, out.metrics.num_accepted_draft_tokens) == (8, 8)
    assert steps == base_steps - 8  # 9 tokens came out of the step that verified the drafts
    for a, b in zip(out.outputs[0].logprobs, base.outputs[0].logprobs):  # same logprobs, token by token
        (ta, la), (tb, lb) = next(iter(a.items())), next(iter(b.items()))
        assert ta == tb and la.logprob == pytest.approx(lb.logprob, abs=1e-4)
    assert out.outputs[0].cumulative_logprob == pytest.approx(base.outputs[0].cumulative_logprob, abs=1e-3)


@pytest.mark.parametrize("wrong_at", [0, 3])
def test_wrong_drafts_change_nothing(llm, wrong_at: int) -> None:  # type: ignore[no-untyped-def]
    ref = _run(llm, [{"prompt_token_ids": PROMPT}])[0][0].outputs[0].token_ids
    drafts = ref[:wrong_at] + [(ref[wrong_at] + 1) % 1000] + ref[wrong_at + 1 : 6]
    (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": drafts}])
    assert out.outputs[0].token_ids == ref
    assert out.metrics.num_accepted_draft_tokens == wrong_at


def test_mixed_batch_with_chunked_prefill(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Drafted and plain requests share steps; a small budget defers verification past the prompt."""
    small = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False,
                max_num_seqs=4, max_num_batched_tokens=24)  # fmt: skip
    prompts = [PROMPT, list(range(100, 130)), list(range(200, 210))]
    refs = [o.outputs[0].token_ids for o in _run(small, [{"prompt_token_ids": p} for p in prompts])[0]]
    batch = [
        {"prompt_token_ids": prompts[0], "draft_input_ids": refs[0][:10]},
        {"prompt_token_ids": prompts[1]},
        {"prompt_token_ids": prompts[2], "draft_input_ids": refs[2][:2] + [1, 2]},
    ]
    outs, _ = _run(small, batch)
    assert [o.outputs[0].token_ids for o in outs] == refs
    assert outs[0].metrics.num_accepted_draft_tokens == 10 and outs[2].metrics.num_accepted_draft_tokens == 2


def test_accepted_eos_ends_the_request(llm) -> None:  # type: ignore[no-untyped-def]
    ref = _run(llm, [{"prompt_token_ids": PROMPT}])[0][0].outputs[0].token_ids
    eos = ref[2]
    params = SamplingParams(max_tokens=N, temperature=0.0, end_id=eos)
    (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": ref[:8]}], params)
    assert out.outputs[0].token_ids == ref[:3] and out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "prompt_extra,params,param",
    [
        ({"draft_input_ids": [5, 6]}, {"temperature": 0.0, "beam_width": 2}, "beam_width"),
        ({"draft_input_ids": [5, 6]}, {"temperature": 0.7, "n": 2}, "n"),
        ({"draft_input_ids": [10**6]}, {"temperature": 0.0}, "draft_input_ids"),
        ({"draft_input_ids": []}, {"temperature": 0.0}, "draft_input_ids"),
        ({"draft_input_ids": [5] * 20}, {"temperature": 0.0, "max_tokens": 10}, "draft_input_ids"),
        ({"draft_input_ids": [5], "draft_logits": [[0.0]]}, {"temperature": 0.0}, "draft_logits"),  # wrong shape
    ],
)
def test_invalid_drafts_name_the_field(llm, prompt_extra, params, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": PROMPT, **prompt_extra}], SamplingParams(**params), use_tqdm=False)
    assert e.value.param == param


@pytest.mark.parametrize(
    "controls",
    [
        {"repetition_penalty": 1.9, "presence_penalty": 2.0, "frequency_penalty": 1.5, "logit_bias": {7: 3.0}},
        {"no_repeat_ngram_size": 2, "watermark": True, "min_tokens": 12, "ignore_eos": False},  # end_id: below
    ],
)
def test_history_controls_apply_at_every_draft_position(llm, controls) -> None:  # type: ignore[no-untyped-def]
    """Penalties, bans and min_tokens at draft j see the tokens before it, drafts included: the
    request's own continuation (under the controls) is accepted whole, and a wrong draft changes
    nothing. With the history before the drafts only, draft 2+ would be judged by other logits."""
    plain = _run(llm, [{"prompt_token_ids": PROMPT}])[0][0].outputs[0].token_ids
    if "min_tokens" in controls:
        controls = {**controls, "end_id": plain[2]}  # ends plain greedy at 3 tokens, banned until 12
    params = _greedy(**controls)
    (base,), _ = _run(llm, [{"prompt_token_ids": PROMPT}], params)
    ref = base.outputs[0].token_ids
    assert ref != plain  # the controls change the greedy tokens
    (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": ref[:10]}], params)
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens == 10
    wrong = ref[:4] + [(ref[4] + 1) % 1000] + ref[5:8]
    (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": wrong}], params)
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens == 4


def test_draft_logits_of_the_right_shape_are_accepted(llm) -> None:  # type: ignore[no-untyped-def]
    ref = _run(llm, [{"prompt_token_ids": PROMPT}])[0][0].outputs[0].token_ids
    vocab = llm.engine.config.model.vocab_size
    drafts = ref[:4]
    for logits in (torch.zeros(4, vocab), torch.zeros(1, 4, vocab)):  # ours, TensorRT-LLM's [1, K, vocab]
        (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": drafts, "draft_logits": logits}])
        assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens == 4


def test_generation_logits_cover_the_kept_tokens_only(llm) -> None:  # type: ignore[no-untyped-def]
    ref = _run(llm, [{"prompt_token_ids": PROMPT}], _greedy(return_generation_logits=True))[0][0].outputs[0]
    wrong = ref.token_ids[:3] + [(ref.token_ids[3] + 1) % 1000] + ref.token_ids[4:6]
    for drafts in (ref.token_ids[:8], wrong):  # all kept; rejected from the fourth on
        (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": drafts}], _greedy(return_generation_logits=True))
        gen = out.outputs[0].generation_logits
        assert out.outputs[0].token_ids == ref.token_ids and gen.shape == ref.generation_logits.shape
        assert torch.allclose(gen, ref.generation_logits, atol=1e-4)


def _target(llm: LLM, prompt: list[int], top_k: int) -> torch.Tensor:
    """The distribution the sampler draws the next token from: softmax over the raw top-k logits."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, return_generation_logits=True)
    logits = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].generation_logits[0]
    kth = logits.topk(top_k).values[-1]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)


def _draft_logits(vocab: int, mass: dict[int, float]) -> torch.Tensor:
    row = torch.full((vocab,), float("-inf"))
    for t, m in mass.items():
        row[t] = math.log(m)
    return row


def test_sampled_drafts_keep_the_target_distribution(llm) -> None:  # type: ignore[no-untyped-def]
    """Two drafts verified by speculative sampling: over 300 seeds the first two tokens follow
    the target model's joint distribution (chi-square). Drafts sampled from their draft logits
    (one of q0's tokens lies outside the target's top-k: p = 0 there), and fixed drafts without
    logits; the first draft is kept at the rate the rule predicts, sum_x min(p(x), q(x))."""
    top_k, n = 4, 300
    vocab = llm.engine.config.model.vocab_size
    p0 = _target(llm, PROMPT, top_k)
    support = p0.topk(top_k).indices.tolist()
    p1 = {x: _target(llm, PROMPT + [x], top_k) for x in support}
    outside = p0.topk(top_k + 1).indices.tolist()[-1]
    mass0 = {support[-1]: 0.5, support[0]: 0.3, outside: 0.2}
    mass1 = {t: 0.25 for t in p1[support[0]].topk(top_k).indices.tolist()}
    draft_logits = torch.stack([_draft_logits(vocab, mass0), _draft_logits(vocab, mass1)])
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(draft_logits, dim=-1)
    drafted = [torch.multinomial(q, 1, generator=g)[:, 0].tolist() for _ in range(n)]  # d_i ~ q_i
    prompts = [{"prompt_token_ids": PROMPT, "draft_input_ids": d, "draft_logits": draft_logits} for d in drafted]
    prompts += [{"prompt_token_ids": PROMPT, "draft_input_ids": [support[-1], support[0]]}] * n
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=top_k, seed=i, ignore_eos=True) for i in range(2 * n)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    expected = {(x, y): float(p0[x] * p1[x][y]) for x in support for y in p1[x].topk(top_k).indices.tolist()}
    for group in (outs[:n], outs[n:]):
        counts: dict[tuple[int, ...], int] = {}
        for o in group:
            pair = tuple(o.outputs[0].token_ids[:2])
            assert pair in expected  # nothing outside the target's support
            counts[pair] = counts.get(pair, 0) + 1
        big = [c for c in expected if expected[c] * n >= 5]  # cells too small for chi-square pool together
        obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
        exp = [expected[c] * n for c in big] + [n * (1 - sum(expected[c] for c in big))]
        if exp[-1] < 5:
            obs, exp = obs[:-2] + [obs[-2] + obs[-1]], exp[:-2] + [exp[-2] + exp[-1]]
        stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
        p_value = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2), torch.tensor(stat / 2)))
        assert p_value > 1e-3, (stat, obs, exp)
    kept = sum(1 for o in outs[:n] if o.metrics.num_accepted_draft_tokens >= 1) / n
    rate = float(torch.minimum(p0, q[0]).sum())
    assert abs(kept - rate) < 4 * math.sqrt(rate * (1 - rate) / n), (kept, rate)
    llm.engine.kv.pool.check_idle()


def test_seeded_sampled_drafts_repeat(llm) -> None:  # type: ignore[no-untyped-def]
    vocab = llm.engine.config.model.vocab_size
    prompt = {"prompt_token_ids": PROMPT, "draft_input_ids": [5, 6, 7], "draft_logits": torch.randn(3, vocab)}
    params = SamplingParams(max_tokens=8, temperature=0.9, seed=11, ignore_eos=True)
    a, b = (llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2))
    assert a == b
