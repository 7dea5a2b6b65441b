"""Decoder-model embeddings (LLM.embed, SamplingParams.pooling) vs Hugging Face's hidden states.

HF's `AutoModel` last_hidden_state (after the final norm), pooled at the last token or averaged
over the prompt and L2-normalized, is the reference. The engine runs all prompts together in a
small pool with a 32-token step budget so long prompts are chunked (mean pooling accumulates
across chunks) and mixed with a generating request.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel

from inflight import LLM, SamplingParams
from inflight.sampling_params import ParamError

PROMPT_LENS = [5, 19, 70, 33]


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _hf_pooled(path, prompts: list[list[int]], pooling: str) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            hidden = model(torch.tensor([p])).last_hidden_state[0]
            pooled = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            out.append(torch.nn.functional.normalize(pooled, dim=0))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embed_matches_hf_hidden_states(tiny_model_dir, arch: str, pooling: str) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_dir(arch)
    llm = LLM(str(path), dtype="float32", device="cpu", max_num_batched_tokens=32, progress=False)
    prompts = _prompts(llm.engine.config.model.vocab_size)
    # one generating request rides along in the same steps
    gen_req = llm.engine.make_request(prompts[1], SamplingParams(max_tokens=12, temperature=0))
    llm.engine.add_request(gen_req)
    outs = llm.embed(prompts, pooling=pooling, use_tqdm=False)
    want = _hf_pooled(path, prompts, pooling)
    for out, ref, p in zip(outs, want, prompts):
        got = torch.tensor(out.outputs.embedding)
        assert out.prompt_token_ids == p
        assert got.shape == ref.shape
        assert abs(got.norm().item() - 1.0) < 1e-5
        assert torch.nn.functional.cosine_similarity(got, ref, dim=0).item() > 1 - 1e-5
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-3)
    # the two poolings really differ (a last-token bug can't pass as mean, or back)
    other = _hf_pooled(path, prompts[2:3], "mean" if pooling == "last" else "last")[0]
    assert torch.nn.functional.cosine_similarity(torch.tensor(outs[2].outputs.embedding), other, dim=0) < 0.999
    llm.engine.kv.pool.check_idle()


def test_embed_prefix_cache_and_repeat(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """A second embed of the same prompts (blocks now cached) returns the same vectors."""
    llm = LLM(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)
    prompts = _prompts(llm.engine.config.model.vocab_size)
    for pooling in ("last", "mean"):
        first = [o.outputs.embedding for o in llm.embed(prompts, pooling=pooling, use_tqdm=False)]
        again = [o.outputs.embedding for o in llm.embed(prompts, pooling=pooling, use_tqdm=False)]
        for a, b in zip(first, again):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=1e-4)
    llm.engine.kv.pool.check_idle()


def test_pooling_validation() -> None:
    with pytest.raises(ParamError) as e:
        SamplingParams(pooling="max")
    assert e.value.param == "pooling"
    with pytest.raises(ParamError) as e:
        SamplingParams(pooling="last", n=2, temperature=1.0)
    assert e.value.param == "pooling"
