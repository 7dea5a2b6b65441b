"""prompt_logprobs, context logits and generation logits against Hugging Face's logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from inflight import LLM, ParamError, SamplingParams


@pytest.fixture(scope="module")
def setup(tiny_model_dir):  # type: ignore[no-untyped-def]
    path = tiny_model_dir("qwen3")
    # a 32-token step budget and a small pool: prompts are chunked, and some get preempted
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False,
              max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=14)  # fmt: skip
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return llm, hf


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    return [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (70, 45, 20, 64)]


def test_prompt_logprobs_and_logits_match_hf_under_chunking(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    prompts = _prompts()
    params = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, prompt_logprobs=3,
        return_context_logits=True, return_generation_logits=True,
    )  # fmt: skip
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions >= 1
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            full = hf(torch.tensor([p + o.outputs[0].token_ids])).logits[0]
        ref_ctx = full[: len(p)]
        assert o.context_logits.shape == ref_ctx.shape
        assert torch.allclose(o.context_logits, ref_ctx, atol=1e-4)
        # generated token i is scored by the logits at position len(p) - 1 + i
        gen = o.outputs[0].generation_logits
        assert gen.shape == (12, ref_ctx.shape[1])
        assert torch.allclose(gen, full[len(p) - 1 : len(p) + 11], atol=1e-4)
        pl = o.prompt_logprobs
        assert pl[0] is None and len(pl) == len(p)
        ref_lp = torch.log_softmax(ref_ctx, dim=-1)
        for pos in range(1, len(p)):
            entry, target = pl[pos], p[pos]
            assert entry[target].logprob == pytest.approx(ref_lp[pos - 1, target].item(), abs=1e-4)
            assert entry[target].rank == int((ref_lp[pos - 1] > ref_lp[pos - 1, target]).sum()) + 1
            top3 = ref_lp[pos - 1].topk(3).indices.tolist()
            assert set(top3) <= set(entry)  # the top-3 are present (plus the target itself)
    llm.engine.kv.pool.check_idle()


def test_prompt_logprobs_bypass_the_prefix_cache(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    p = _prompts()[0]
    first = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    again = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0), use_tqdm=False)[0]
    plain = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    assert plain.num_cached_tokens > 0  # the cache is warm ...
    assert again.num_cached_tokens == 0  # ... but a prompt_logprobs request computes every position
    assert len(again.prompt_logprobs) == len(p) and all(e is not None for e in again.prompt_logprobs[1:])
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_logits_outputs_are_bounded(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    from inflight.worker import logits_capture

    vocab = llm.engine.config.model.vocab_size
    monkeypatch.setattr(logits_capture, "MAX_LOGITS_ELEMENTS", 50 * vocab)
    with pytest.raises(ParamError) as e:
        llm.generate([[5] * 10], SamplingParams(max_tokens=60, return_generation_logits=True), use_tqdm=False)
    assert e.value.param == "return_generation_logits"
    with pytest.raises(ParamError) as e:
        llm.generate([[5] * 60], SamplingParams(max_tokens=2, return_context_logits=True), use_tqdm=False)
    assert e.value.param == "return_context_logits"
    ok = llm.generate([[5] * 40], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, return_context_logits=True, return_generation_logits=True), use_tqdm=False)[0]
    assert ok.context_logits.shape[0] == 40 and ok.outputs[0].generation_logits.shape[0] == 40
    with pytest.raises(ParamError) as e:
        SamplingParams(prompt_logprobs=21)
    assert e.value.param == "prompt_logprobs"
