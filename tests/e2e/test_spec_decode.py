"""Built-in speculative decoding (n-gram prompt lookup, a draft model): greedy outputs are
identical with and without it on every architecture, under chunked prefill, preemption and the mp
executor; sampled outputs keep the target distribution (chi-square over seeds, as
tests/e2e/test_drafts.py)."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.testing import ARCHS

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 8}
ARGS = {"dtype": "float32", "device": "cpu", "progress": False}
# a prompt with a repeated span (the model is shown text it can copy) and one that loops
PROMPTS = [list(range(3, 40)) + list(range(3, 30)), [5, 9, 11, 13] * 4, list(range(100, 130))]


def _greedy(n: int = 24, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams, speculate: bool = True) -> list[Any]:
    """Generate with the engine's proposer, or with it switched off (what no speculative_config is)."""
    engine = llm.engine
    saved = engine.speculator
    engine.speculator = saved if speculate else None
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        engine.speculator = saved
    engine.kv.pool.check_idle()
    return outs


def _tokens(outs: list[Any]) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_identical_on_every_architecture(tiny_model_dir: Callable[..., Path], arch: str) -> None:
    llm = LLM(model=str(tiny_model_dir(arch)), speculative_config=NGRAM, **ARGS)
    base, spec = _run(llm, PROMPTS, _greedy(), False), _run(llm, PROMPTS, _greedy())
    assert _tokens(spec) == _tokens(base)
    assert all(o.metrics.num_draft_tokens == 0 for o in base)
    assert sum(o.metrics.num_accepted_draft_tokens for o in spec) > 0  # it did speculate, and it paid
    for a, b in zip(base, spec):  # the target's logprob for every token, drafts accepted or not
        assert b.outputs[0].cumulative_logprob == pytest.approx(a.outputs[0].cumulative_logprob, abs=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_draft_model_on_every_architecture(tiny_model_dir: Callable[..., Path], arch: str) -> None:
    """The target as its own draft: every draft is accepted, which holds only if the draft
    model's KV (its own pool, the target's block tables) follows the target's exactly."""
    path = str(tiny_model_dir(arch))
    llm = LLM(model=path, speculative_config={"method": "draft_model", "model": path, "num_speculative_tokens": 3}, **ARGS)
    base, spec = _run(llm, PROMPTS[:2], _greedy(16), False), _run(llm, PROMPTS[:2], _greedy(16))
    assert _tokens(spec) == _tokens(base)
    drafted = sum(o.metrics.num_draft_tokens for o in spec)
    assert drafted > 0 and sum(o.metrics.num_accepted_draft_tokens for o in spec) == drafted


def test_draft_model_smaller_under_preemption_and_mp(tiny_model_dir: Callable[..., Path], small: LLM) -> None:
    draft = str(tiny_model_dir("qwen2", seed=3, num_hidden_layers=1))
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    prompts = PROMPTS + [list(range(200, 250))]
    ref = _tokens(_run(small, prompts, _greedy(24), False))
    tiny = LLM(model=str(tiny_model_dir("qwen2")), speculative_config=spec, max_num_seqs=4,
               max_num_batched_tokens=24, num_kv_blocks=12, **ARGS)  # fmt: skip
    outs = _run(tiny, prompts, _greedy(24))
    assert _tokens(outs) == ref and tiny.engine.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0
    multi = LLM(model=str(tiny_model_dir("qwen2")), speculative_config=spec, distributed_executor_backend="mp", **ARGS)
    try:
        outs = _run(multi, prompts[:2], _greedy(24))
        assert _tokens(outs) == ref[:2] and sum(o.metrics.num_draft_tokens for o in outs) > 0
    finally:
        multi.engine.shutdown()


def test_draft_model_start_up_errors(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    target = str(tiny_model_dir("qwen2"))
    other_vocab = str(tiny_model_dir("qwen2", with_tokenizer=False, vocab_size=500))
    swapped = tmp_path / "swapped"  # same size, two ids exchanged: another tokenizer
    shutil.copytree(target, swapped)
    tok = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    cases = ((other_vocab, "vocabulary of 500 tokens"), ("/no/such/dir", "no config.json"), (str(swapped), "tokenizer differs"))
    for model, match in cases:
        with pytest.raises(ValueError, match=f"speculative_config.model: .*{match}"):
            LLM(model=target, speculative_config={"method": "draft_model", "model": model, "num_speculative_tokens": 2}, **ARGS)


@pytest.fixture(scope="module")
def small(tiny_model_dir: Callable[..., Path]) -> LLM:
    """A pool of 12 blocks x 16 and a 24-token step: chunked prefill and preemption."""
    return LLM(model=str(tiny_model_dir("qwen2")), speculative_config=NGRAM, max_num_seqs=4,
               max_num_batched_tokens=24, num_kv_blocks=12, **ARGS)  # fmt: skip


def test_chunked_prefill_preemption_and_controls(small: LLM) -> None:
    prompts = PROMPTS + [list(range(200, 250))]
    before = small.engine.scheduler.num_preemptions
    params = _greedy(32, logprobs=2, repetition_penalty=1.3, no_repeat_ngram_size=3)
    base, spec = _run(small, prompts, params, False), _run(small, prompts, params)
    assert small.engine.scheduler.num_preemptions - before >= 2  # both runs preempted
    assert _tokens(spec) == _tokens(base)
    for a, b in zip(base, spec):  # top-2 logprobs of the target per accepted token
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert sorted(x) == sorted(y)
            assert [x[t].logprob for t in sorted(x)] == pytest.approx([y[t].logprob for t in sorted(y)], abs=1e-4)
    assert sum(o.metrics.num_draft_tokens for o in spec) > 0


def test_stops_max_tokens_n_and_client_drafts(small: LLM) -> None:
    loop = [PROMPTS[1]]
    ref = _run(small, loop, _greedy(30), False)[0].outputs[0].token_ids
    for n in (1, 2, 5):  # never past max_tokens, however many drafts would be accepted
        out = _run(small, loop, _greedy(n))[0]
        assert out.outputs[0].token_ids == ref[:n] and out.outputs[0].finish_reason == "length"
    stop = _run(small, loop, _greedy(30, stop_token_ids=[ref[7]]))[0].outputs[0]
    assert stop.token_ids == ref[: ref.index(ref[7]) + 1] and stop.finish_reason == "stop"
    text = small.generate([{"prompt_token_ids": loop[0]}], _greedy(30), use_tqdm=False)[0].outputs[0].text
    cut = _run(small, loop, _greedy(30, stop=[text[6:9]]))[0].outputs[0]
    assert cut.text == text[: text.index(text[6:9])] and cut.finish_reason == "stop"
    seeds = SamplingParams(max_tokens=12, temperature=0.8, n=2, seed=5, ignore_eos=True)
    outs = _run(small, loop, seeds)[0]
    assert len(outs.outputs) == 2 and all(len(c.token_ids) == 12 for c in outs.outputs)
    mine = ref[:6] + [(ref[6] + 1) % 1000]  # a client's drafts take precedence for its request
    out = small.generate([{"prompt_token_ids": loop[0], "draft_input_ids": mine}], _greedy(30), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens >= 6


def test_large_batches_do_not_speculate(tiny_model_dir: Callable[..., Path]) -> None:
    llm = LLM(model=str(tiny_model_dir("qwen2")), speculative_config={**NGRAM, "disable_by_batch_size": 2}, **ARGS)
    outs = _run(llm, PROMPTS, _greedy())  # 3 requests run together to the end: no drafts at all
    assert all(o.metrics.num_draft_tokens == 0 for o in outs)
    assert _run(llm, PROMPTS[:2], _greedy())[1].metrics.num_draft_tokens > 0


@pytest.fixture(scope="module")
def mp(tiny_model_dir: Callable[..., Path]) -> Iterator[LLM]:
    llm = LLM(model=str(tiny_model_dir("qwen2")), distributed_executor_backend="mp",
              speculative_config={**NGRAM, "disable_by_batch_size": 2}, **ARGS)  # fmt: skip
    yield llm
    llm.engine.shutdown()


def test_mp_executor_identical_and_runs_ahead_when_not_speculating(mp: LLM, small: LLM) -> None:
    ref = _tokens(_run(small, PROMPTS, _greedy(), False))
    ahead = mp.engine.num_steps_ahead
    outs = _run(mp, PROMPTS[:2], _greedy())  # speculating: each step waits for the previous one
    assert _tokens(outs) == ref[:2] and sum(o.metrics.num_accepted_draft_tokens for o in outs) > 0
    assert mp.engine.num_steps_ahead == ahead
    outs = _run(mp, PROMPTS, _greedy())  # 3 > disable_by_batch_size: async scheduling runs ahead
    assert _tokens(outs) == ref and mp.engine.num_steps_ahead > ahead


def _target(llm: LLM, prompt: list[int], top_k: int) -> torch.Tensor:
    """The next-token distribution a sampled request draws from: softmax over the top-k logits."""
    params = SamplingParams(max_tokens=1, temperature=0.0, return_generation_logits=True)
    logits = _run(llm, [prompt], params, False)[0].outputs[0].generation_logits[0]
    kth = logits.topk(top_k).values[-1]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)


def test_sampled_tokens_keep_the_target_distribution(tiny_model_dir: Callable[..., Path]) -> None:
    """The first two tokens over 300 seeds follow the target's joint distribution (chi-square),
    on a prompt whose n-gram drafts the model often agrees with (it repeats its own loop)."""
    small = LLM(model=str(tiny_model_dir("qwen2")), max_num_seqs=32, block_size=4,
                speculative_config={**NGRAM, "disable_by_batch_size": 32}, **ARGS)  # fmt: skip
    loop = _run(small, [PROMPTS[1]], _greedy(12), False)[0].outputs[0].token_ids
    # ends inside a run the model repeats: drafts are likely tokens. 25 ids: once _target's run has
    # cached its 6 full blocks, each request's prompt piece is its last token, a piece the engine's
    # drafts join (a longer prompt piece runs without them: core/pieces.py drafts_fitting)
    prompt = PROMPTS[1] + loop[:9]
    accepted, drafted = check_distribution(small, prompt)
    assert drafted >= 300 and accepted > 30, accepted


def check_distribution(llm: LLM, prompt: list[int], top_k: int = 3, n: int = 300, max_tokens: int = 2) -> tuple[int, int]:
    """Chi-square of the first two tokens of `n` seeded top-k requests against the target's joint
    distribution (computed without speculation); returns (drafts accepted, drafts verified).
    `max_tokens` 3: the runner's proposers draft after the first step, so the second token is
    a verified one."""
    p0 = _target(llm, prompt, top_k)
    support = p0.topk(top_k).indices.tolist()
    p1 = {x: _target(llm, prompt + [x], top_k) for x in support}
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, top_k=top_k, seed=i, ignore_eos=True) for i in range(n)]
    outs = llm.generate([{"prompt_token_ids": prompt}] * n, params, use_tqdm=False)
    expected = {(x, y): float(p0[x] * p1[x][y]) for x in support for y in p1[x].topk(top_k).indices.tolist()}
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        pair = tuple(o.outputs[0].token_ids[:2])
        assert pair in expected
        counts[pair] = counts.get(pair, 0) + 1
    cells = sorted(expected, key=expected.get, reverse=True)  # type: ignore[arg-type]
    big = [c for c in cells if expected[c] * n >= 5]
    obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    exp = [expected[c] * n for c in big] + [n * (1 - sum(expected[c] for c in big))]
    if exp[-1] < 5:
        obs, exp = obs[:-2] + [obs[-2] + obs[-1]], exp[:-2] + [exp[-2] + exp[-1]]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    p_value = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2), torch.tensor(stat / 2)))
    assert p_value > 1e-3 and math.isfinite(stat), (stat, obs, exp)
    return sum(o.metrics.num_accepted_draft_tokens for o in outs), sum(o.metrics.num_draft_tokens for o in outs)


def test_lora_adapter_applies_in_verification(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """A request's LoRA adapter runs in the verifying step (every row of the piece): its tokens with
    speculation are its own tokens without, not the base model's."""
    from inflight.testing.lora import make_peft_lora

    base_dir = str(tiny_model_dir("qwen2"))
    adapter = make_peft_lora(base_dir, tmp_path / "a", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    llm = LLM(model=base_dir, enable_lora=True, speculative_config=NGRAM, **ARGS)
    llm.load_lora_adapter("a", str(adapter))
    prompts = [{"prompt_token_ids": p, "lora_name": "a"} for p in PROMPTS[:2]]

    def run(speculate: bool) -> list[Any]:
        saved, llm.engine.speculator = llm.engine.speculator, llm.engine.speculator if speculate else None
        try:
            return llm.generate(prompts, _greedy(), use_tqdm=False)
        finally:
            llm.engine.speculator = saved

    off, on = run(False), run(True)
    assert _tokens(on) == _tokens(off) != _tokens(_run(llm, PROMPTS[:2], _greedy(), False))
    assert sum(o.metrics.num_accepted_draft_tokens for o in on) > 0


def test_draft_model_under_tensor_parallelism(tiny_model_dir: Callable[..., Path], small: LLM) -> None:
    """Two ranks share the target; the draft model lives on rank 0 only (it alone samples): the
    target as its own draft is accepted whole, so rank 0's draft KV follows the sharded target's."""
    path = str(tiny_model_dir("qwen2"))
    ref = _tokens(_run(small, PROMPTS[:2], _greedy(16), False))
    tp = LLM(model=path, tensor_parallel_size=2, speculative_config={"method": "draft_model", "model": path, "num_speculative_tokens": 3}, **ARGS)
    try:
        outs = _run(tp, PROMPTS[:2], _greedy(16))
    finally:
        tp.engine.shutdown()
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    assert _tokens(outs) == ref and drafted > 0 and sum(o.metrics.num_accepted_draft_tokens for o in outs) == drafted
