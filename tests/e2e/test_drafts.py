"""External draft tokens (speculative decoding): verified in one step, outputs never change."""

from __future__ import annotations

import pytest

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
        ({"draft_input_ids": [5, 6]}, {"temperature": 0.7}, "temperature"),
        ({"draft_input_ids": [5, 6]}, {"temperature": 0.0, "repetition_penalty": 1.2}, "repetition_penalty"),
        ({"draft_input_ids": [5, 6]}, {"temperature": 0.0, "min_tokens": 2}, "min_tokens"),
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


def test_draft_logits_of_the_right_shape_are_accepted(llm) -> None:  # type: ignore[no-untyped-def]
    import torch

    ref = _run(llm, [{"prompt_token_ids": PROMPT}])[0][0].outputs[0].token_ids
    vocab = llm.engine.config.model.vocab_size
    drafts = ref[:4]
    (out,), _ = _run(llm, [{"prompt_token_ids": PROMPT, "draft_input_ids": drafts, "draft_logits": torch.zeros(4, vocab)}])
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens == 4
