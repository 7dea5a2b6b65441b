"""Speculation combined with the rest of the engine, where no other test covers a method:
- EAGLE-3 under the mp executor and tensor parallelism: the head (rank 0) reads the aux layers of
  the worker's (the sharded) target and proposes the same drafts, step by step, as in process;
  its KV follows steps the mp executor ran ahead without drafts;
- LoRA with every method: an adapter's greedy tokens and logprobs are PEFT's, a base request
  beside it HF's; the draft model runs without the adapter (its drafts are the base model's);
- the runner's proposers (draft model, EAGLE-1) with prefix caching, chunked prefill, preemption,
  logprobs, penalties, stop strings, max_tokens, n, beams and a client's drafts.
n-gram's own combinations: tests/e2e/test_spec_decode.py; grammars: test_spec_constrained.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_spec_decode import ARGS, NGRAM, PROMPTS, _greedy, _run, _tokens

from inflight import LLM, SamplingParams
from inflight.testing.eagle import make_eagle1_head, make_eagle3_head, make_mirror_target

N_LORA = 12  # tokens per LoRA request


def _spy_drafts(llm: LLM) -> list[list[list[int]]]:
    """Every step's proposals as the engine receives them (request ids differ between engines)."""
    seen: list[list[list[int]]] = []
    spec = llm.engine.speculator
    absorb = spec.absorb  # type: ignore[union-attr]

    def spy(requests: list[Any], proposed: dict[str, list[int]]) -> None:
        seen.append(sorted(proposed.values()))
        absorb(requests, proposed)

    spec.absorb = spy  # type: ignore[union-attr,method-assign]
    return seen


def test_eagle3_under_mp_and_tensor_parallelism(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """The same drafts at every step in process, in the mp worker and over 2 ranks: a random head's
    drafts are a function of the three captured layers' inputs, so they match only if each
    executor hands the head the same states; the tokens are the target's."""
    target = tiny_model_dir("qwen2")
    head = make_eagle3_head(target, tmp_path / "head", aux=[0, 1, 1])
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    runs = []
    for extra in ({}, {"distributed_executor_backend": "mp"}, {"tensor_parallel_size": 2}):
        llm = LLM(model=str(target), speculative_config=spec, **ARGS, **extra)  # type: ignore[arg-type]
        try:
            seen = _spy_drafts(llm)
            base = _tokens(_run(llm, PROMPTS[:2], _greedy(12), False)) if not runs else runs[0][0]
            outs = _run(llm, PROMPTS[:2], _greedy(12))
        finally:
            llm.engine.shutdown()
        assert _tokens(outs) == base, extra
        runs.append((_tokens(outs), seen, [(o.metrics.num_draft_tokens, o.metrics.num_accepted_draft_tokens) for o in outs]))
    assert sum(d for d, _ in runs[0][2]) > 0 and len(runs[0][1]) >= 8
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_eagle_head_follows_steps_run_ahead_under_mp(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    """The worker process loads the head. Three requests are above disable_by_batch_size (2): no
    drafts, and the mp executor schedules ahead; the head still catches up in those steps. When two finish, the third speculates on the
    head KV those steps wrote: the mirror head's drafts are all kept (Mistral: inflight/testing/eagle.py)."""
    target = tmp_path / "target"
    shutil.copytree(tiny_model_dir("mistral", num_hidden_layers=1), target)
    make_mirror_target(target)
    head = make_eagle1_head(target, tmp_path / "head", mirror=True)
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3, "disable_by_batch_size": 2}
    llm = LLM(model=str(target), speculative_config=spec, distributed_executor_backend="mp", **ARGS)
    params = [_greedy(n) for n in (6, 6, 30)]
    ref = _tokens(LLM(model=str(target), **ARGS).generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False))
    try:
        ahead = llm.engine.num_steps_ahead
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        assert llm.engine.num_steps_ahead >= ahead + 4
    finally:
        llm.engine.shutdown()
    assert _tokens(outs) == ref and [o.metrics.num_draft_tokens for o in outs[:2]] == [0, 0]
    m = outs[2].metrics
    assert m.num_accepted_draft_tokens == m.num_draft_tokens >= 15


@pytest.fixture(scope="module")
def lora_setup(tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The target, an adapter made by PEFT, the heads, and HF / PEFT's greedy tokens + logprobs."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from inflight.testing.lora import make_peft_lora

    root = tmp_path_factory.mktemp("spec_lora")
    target = tiny_model_dir("qwen2")
    adapter = make_peft_lora(target, root / "a", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    refs: dict[str, list[tuple[list[int], torch.Tensor]]] = {}
    for name in ("base", "a"):
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32, local_files_only=True)
        model = model if name == "base" else peft.PeftModel.from_pretrained(model, str(adapter))
        refs[name] = [_hf_greedy(model, p) for p in PROMPTS[:2]]
    heads = {"eagle": make_eagle1_head(target, root / "e1"), "eagle3": make_eagle3_head(target, root / "e3", aux=[0, 1, 1])}
    return {"target": target, "adapter": adapter, "refs": refs, "heads": heads}


@torch.no_grad()
def _hf_greedy(model: Any, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_LORA, min_new_tokens=N_LORA, do_sample=False,
        output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = torch.log_softmax(torch.stack(out.logits)[:, 0].float(), dim=-1)
    return tokens, logprobs[torch.arange(N_LORA), torch.tensor(tokens)]


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle", "eagle3"])
def test_lora_with_every_method_matches_peft(lora_setup: dict[str, Any], method: str) -> None:
    """Adapter requests and a base request in one speculating batch: each gives what PEFT / HF
    give for it alone (tokens, and the target's logprob of each). The draft model is the target
    itself, run without the adapter: the base request keeps every draft, the adapter's requests
    not (their tokens are not the base model's)."""
    target = str(lora_setup["target"])
    spec = dict(NGRAM) if method == "ngram" else {"method": method, "num_speculative_tokens": 3,
                                                  "model": str(lora_setup["heads"].get(method, target))}  # fmt: skip
    llm = LLM(model=target, enable_lora=True, speculative_config=spec, **ARGS)
    llm.load_lora_adapter("a", str(lora_setup["adapter"]))
    batch = [("a", 0), ("base", 0), ("a", 1)]
    prompts = [{"prompt_token_ids": PROMPTS[i]} | ({"lora_name": "a"} if name == "a" else {}) for name, i in batch]
    outs = llm.generate(prompts, _greedy(N_LORA, logprobs=1), use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    for (name, i), out in zip(batch, outs):
        tokens, logprobs = lora_setup["refs"][name][i]
        got = out.outputs[0]
        assert got.token_ids == tokens, (name, i)
        torch.testing.assert_close(torch.tensor([lp[t].logprob for lp, t in zip(got.logprobs, tokens)]), logprobs, atol=1e-4, rtol=0)
    assert lora_setup["refs"]["a"][0][0] != lora_setup["refs"]["base"][0][0]  # the adapter acts
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0
    if method == "draft_model":
        m = outs[1].metrics
        assert m.num_accepted_draft_tokens == m.num_draft_tokens > 0
        assert any(o.metrics.num_accepted_draft_tokens < o.metrics.num_draft_tokens for o in (outs[0], outs[2]))


@pytest.fixture(scope="module", params=["draft_model", "eagle"])
def runner_llm(request: pytest.FixtureRequest, tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """A one-layer Mistral mirror target (inflight/testing/eagle.py) with the method's proposer:
    itself as the draft model or the mirror EAGLE-1 head (both propose the target's own tokens);
    a pool of 12 blocks and a 24-token step (chunked prefill, preemption). EAGLE-3 runs the same
    proposer (spec_decode/eagle.py) with other inputs: test_spec_eagle.py preempts it."""
    root = tmp_path_factory.mktemp(f"spec_{request.param}")
    target = root / "target"
    shutil.copytree(tiny_model_dir("mistral", num_hidden_layers=1), target)
    make_mirror_target(target)
    model = target if request.param == "draft_model" else make_eagle1_head(target, root / "head", mirror=True)
    spec = {"method": request.param, "model": str(model), "num_speculative_tokens": 3, "disable_by_batch_size": 8}
    return LLM(model=str(target), speculative_config=spec, max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=12, **ARGS)


def test_chunked_prefill_preemption_logprobs_and_penalties(runner_llm: LLM) -> None:
    prompts = PROMPTS + [list(range(200, 250))]
    before = runner_llm.engine.scheduler.num_preemptions
    params = _greedy(24, logprobs=2, repetition_penalty=1.3, no_repeat_ngram_size=3)
    base, spec = _run(runner_llm, prompts, params, False), _run(runner_llm, prompts, params)
    assert runner_llm.engine.scheduler.num_preemptions - before >= 2  # both runs preempted
    assert _tokens(spec) == _tokens(base)
    for a, b in zip(base, spec):  # the target's top-2 logprobs per accepted token
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert sorted(x) == sorted(y)
            assert [x[t].logprob for t in sorted(x)] == pytest.approx([y[t].logprob for t in sorted(y)], abs=1e-4)
    assert sum(o.metrics.num_draft_tokens for o in spec) > 0


def test_stops_max_tokens_n_beams_and_client_drafts(runner_llm: LLM) -> None:
    loop = [PROMPTS[1]]
    ref = _run(runner_llm, loop, _greedy(30), False)[0].outputs[0].token_ids
    for n in (2, 5):  # never past max_tokens, however many drafts would be accepted
        out = _run(runner_llm, loop, _greedy(n))[0]
        assert out.outputs[0].token_ids == ref[:n] and out.outputs[0].finish_reason == "length"
    stop = _run(runner_llm, loop, _greedy(30, stop_token_ids=[ref[7]]))[0]
    assert stop.outputs[0].token_ids == ref[: ref.index(ref[7]) + 1] and stop.outputs[0].finish_reason == "stop"
    text = _run(runner_llm, loop, _greedy(30), False)[0].outputs[0].text
    cut = _run(runner_llm, loop, _greedy(30, stop=[text[6:9]]))[0].outputs[0]
    assert cut.text == text[: text.index(text[6:9])] and cut.finish_reason == "stop"
    assert stop.metrics.num_draft_tokens > 0
    sampled = _run(runner_llm, loop, SamplingParams(max_tokens=12, temperature=0.8, n=2, best_of=3, seed=5, ignore_eos=True))[0]
    assert len(sampled.outputs) == 2 and all(len(c.token_ids) == 12 for c in sampled.outputs)
    assert sampled.metrics.num_draft_tokens > 0  # every sequence speculates on its own tokens
    beams = SamplingParams(beam_width=2, n=2, temperature=0.0, max_tokens=8, ignore_eos=True)
    off, on = _run(runner_llm, loop, beams, False)[0], _run(runner_llm, loop, beams)[0]
    assert _tokens([on]) == _tokens([off]) and on.metrics.num_draft_tokens == 0  # beams are not speculated
    mine = ref[:3] + [(ref[3] + 1) % 1000]  # a client's drafts take precedence for its request
    out = runner_llm.generate([{"prompt_token_ids": loop[0], "draft_input_ids": mine}], _greedy(30), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == ref and out.metrics.num_accepted_draft_tokens >= 3
    runner_llm.engine.kv.pool.check_idle()


def test_prefix_cache_blocks_carry_the_proposers_kv(runner_llm: LLM) -> None:
    """A prompt whose blocks were computed by a run without speculation: the proposer's KV in the
    cached blocks (written by its catch-up in that run) is right, so every draft is still kept
    (a proposer that skipped the catch-up without drafts keeps 7 of 9: checked by hand)."""
    prompt = [list(range(300, 333))]  # 2 blocks cached: in sight of the 16-token window at 33 on
    _run(runner_llm, prompt, _greedy(4), False)
    out = _run(runner_llm, prompt, _greedy(12))[0]
    m = out.metrics
    assert out.num_cached_tokens == 32 and m.num_accepted_draft_tokens == m.num_draft_tokens > 0
