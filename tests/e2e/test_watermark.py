"""Green-list watermark: strong signal on watermarked text, none on ordinary samples."""

from __future__ import annotations

import torch

from inflight import LLM, SamplingParams, detect_watermark, watermark_z_score
from inflight.sample.watermark import GAMMA, green_mask
from inflight.testing.tokenizer import _corpus


def test_green_lists_have_the_configured_fraction_and_depend_on_context() -> None:
    mask = green_mask(torch.tensor([5, 6, 151000]), 151936)
    frac = mask.float().mean(dim=-1)
    assert torch.allclose(frac, torch.full((3,), GAMMA), atol=0.01)
    assert not torch.equal(mask[0], mask[1])  # a different previous token, a different list


def test_watermarked_text_scores_high_and_plain_text_low(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False)
    prompts = [[7, 8, 9, 10], [11, 12, 13, 14]]
    base = {"temperature": 1.0, "max_tokens": 200, "ignore_eos": True}
    marked = llm.generate(prompts, [SamplingParams(watermark=True, seed=1, **base), SamplingParams(seed=2, **base)], use_tqdm=False)
    wm_ids, plain_ids = marked[0].outputs[0].token_ids, marked[1].outputs[0].token_ids
    assert len(wm_ids) == len(plain_ids) == 200
    assert watermark_z_score(wm_ids) > 4
    assert watermark_z_score(plain_ids) < 2
    # the text-level detector agrees on the watermarked output; ordinary text scores low
    # (the random model's plain output is full of broken UTF-8 that does not re-tokenize)
    tok = llm.get_tokenizer()
    assert detect_watermark(marked[0].outputs[0].text, tok) > 4
    ordinary = " ".join(_corpus()[:40])
    assert len(tok.encode(ordinary)) > 200
    assert detect_watermark(ordinary, tok) < 2
