"""Greedy identity with and without n-gram speculation where rounding is coarse: bf16 weights and a
Q8_0 GGUF (int8 activations), not only float32 (tests/e2e/test_spec_decode.py).

The random model's next-token logits are near-ties (init std 0.02), so any difference in how a
token's logits are computed flips tokens within a few dozen steps. Two such differences existed:
n-gram drafts joined a short prompt's piece, which then had more rows than the C decode kernel
takes (8) and ran on the eager model instead (bf16: 13 of 16 requests identical; now the engine's
drafts join one-token pieces only, core/pieces.py drafts_fitting); and the kernel
summed a Q8_0 verification's K + 1 rows through the unpacked-weights path but a one-row step
straight from the blocks, in another float order (14 of 16). The prefix cache is off here: a hit
changes a prompt's last piece (and so its path) with or without speculation alike.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from inflight import LLM, SamplingParams

CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 512,
          "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from inflight.testing.checkpoints import make_random_checkpoint
    from inflight.testing.gguf import hf_to_gguf

    root = tmp_path_factory.mktemp("spec_identity")
    hf = make_random_checkpoint(root / "bf16", config=CONFIG)  # bfloat16 weights
    return {"bf16": hf, "q8_0": hf_to_gguf(hf, root / "q8_0.gguf", "q8_0")}


def _prompts() -> list[list[int]]:
    """Of 14 short prompts that repeat their first 3 ids (n-gram drafts exist before the first
    token; 8 ids: the kernel's piece) and 2 that quote a 16-id span (36 ids: the eager model's
    piece), the four whose tokens differed before (at tokens 23-45; bf16 0, 8, 13, Q8_0 0, 11)
    and one of the long ones: 16 requests cost 3x the time for no other finding."""
    rng = random.Random(0)
    ids = lambda k: [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(k)]  # noqa: E731
    out = []
    for _ in range(14):
        a = ids(3)
        out.append(a + ids(2) + a)
    for _ in range(2):
        s = ids(16)
        out.append(ids(8) + s + ids(4) + s[:4])
    return [out[i] for i in (0, 8, 11, 13, 14)]


@pytest.mark.parametrize("kind", ["bf16", "q8_0"])
def test_greedy_identical_in_bf16_and_q8_0(models: dict[str, Path], kind: str) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    llm = LLM(model=str(models[kind]), device="cpu", progress=False, enable_prefix_caching=False, speculative_config=spec)
    assert llm.engine.runner.decode_kernel is not None  # the path whose rows must equal one-row steps
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    engine, outs = llm.engine, {}
    for on in (False, True):  # one request at a time: batch 1, where speculation is on
        saved, engine.speculator = engine.speculator, engine.speculator if on else None
        outs[on] = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in _prompts()]
        engine.speculator = saved
    same = [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outs[False], outs[True])]
    assert all(same), f"{sum(same)} of {len(same)} requests identical"
    assert sum(o.metrics.num_accepted_draft_tokens for o in outs[True]) > 0  # it did speculate
    engine.kv.pool.check_idle()
