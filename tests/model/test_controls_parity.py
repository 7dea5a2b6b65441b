"""Decoding controls against Hugging Face: greedy `generate` parity, warper masks, OpenAI penalties.

All requests of a test run in ONE engine batch with different controls, and each is compared
with HF run on that prompt alone: mixed batches must give what each request gives alone.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from inflight import LLM, ParamError, SamplingParams
from inflight.sample.sampler import apply_min_p, apply_top_k_top_p, apply_typical_p

N_NEW = 16


@pytest.fixture(scope="module")
def setup(tiny_model_dir):  # type: ignore[no-untyped-def]
    path = tiny_model_dir("qwen2")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return llm, hf


def _hf(hf, ids: list[int], **kwargs) -> list[int]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=N_NEW, do_sample=False, pad_token_id=0, **kwargs,
        )  # fmt: skip
    return out[0, len(ids) :].tolist()


def _prompt(seed: int, n: int = 12) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=g).tolist()


def test_greedy_controls_match_hf_in_one_mixed_batch(setup) -> None:  # type: ignore[no-untyped-def]
    _check_mixed_controls(*setup)


def test_controls_match_hf_with_async_scheduling(setup, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """The mp executor schedules each step before the last one's tokens are read: the penalties,
    bans and min_tokens work from the runner's own copy of the tokens, which must be complete."""
    _, hf = setup
    llm = LLM(model=str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False, distributed_executor_backend="mp")
    try:
        _check_mixed_controls(llm, hf)
        _check_min_tokens(llm, hf)
        assert llm.engine.num_steps_ahead > 0
    finally:
        llm.engine.shutdown()


def _check_mixed_controls(llm, hf) -> None:  # type: ignore[no-untyped-def]
    base = _hf(hf, _prompt(0), eos_token_id=None)
    # ban the first two generated tokens as a 2-token sequence, and a single token too
    cases = [
        ({"repetition_penalty": 1.3}, {"repetition_penalty": 1.3}),
        ({"repetition_penalty": 0.7}, {"repetition_penalty": 0.7}),
        ({"no_repeat_ngram_size": 2}, {"no_repeat_ngram_size": 2}),
        ({"no_repeat_ngram_size": 1}, {"no_repeat_ngram_size": 1}),
        ({"bad_words_ids": [[base[0], base[1]], [base[3]]]}, {"bad_words_ids": [[base[0], base[1]], [base[3]]]}),
        ({"logit_bias": {base[2]: 5.0, base[0]: -3.0}}, {"sequence_bias": {(base[2],): 5.0, (base[0],): -3.0}}),
        ({"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}, {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}),
        ({}, {}),
    ]  # fmt: skip
    prompts = [_prompt(0)] + [_prompt(i) for i in range(1, len(cases))]
    params = [SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, **ours) for ours, _ in cases]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for (ours, theirs), p, o in zip(cases, prompts, outs):
        assert o.outputs[0].token_ids == _hf(hf, p, eos_token_id=None, **theirs), ours
    # the controls did something: the banned sequence is gone from the bad-words output
    bw = outs[4].outputs[0].token_ids
    assert all(bw[i : i + 2] != base[:2] for i in range(len(bw) - 1)) and base[3] not in bw
    ngram = outs[2].outputs[0].token_ids
    seq = prompts[2] + ngram
    assert len(set(zip(seq, seq[1:]))) == len(seq) - 1  # no bigram repeats


def test_min_tokens_matches_hf_min_new_tokens(setup) -> None:  # type: ignore[no-untyped-def]
    _check_min_tokens(*setup)


def _check_min_tokens(llm, hf) -> None:  # type: ignore[no-untyped-def]
    p = _prompt(42)
    eos = _hf(hf, p, eos_token_id=None)[1]  # make the 2nd greedy token the EOS
    ours = llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=N_NEW, temperature=0.0, end_id=eos, min_tokens=6), use_tqdm=False)[0]
    theirs = _hf(hf, p, eos_token_id=eos, min_new_tokens=6)
    if theirs and theirs[-1] == eos:  # HF keeps EOS in the sequence; we keep it in token_ids too
        pass
    assert ours.outputs[0].token_ids == theirs[: len(ours.outputs[0].token_ids)]
    assert eos not in ours.outputs[0].token_ids[:6]


def test_presence_and_frequency_follow_the_openai_formula(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    cases = [(0.0, 1.5), (1.5, 0.0), (-1.0, 0.8), (2.0, 2.0)]
    prompts = [_prompt(100 + i) for i in range(len(cases))]
    params = [SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, presence_penalty=pp, frequency_penalty=fp) for pp, fp in cases]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for (pp, fp), p, o in zip(cases, prompts, outs):
        ids, generated = list(p), []
        with torch.no_grad():
            for _ in range(N_NEW):
                logits = hf(torch.tensor([ids])).logits[0, -1].double()
                for tok, count in Counter(generated).items():
                    logits[tok] -= pp * (count > 0) + fp * count
                nxt = int(logits.argmax())
                ids.append(nxt)
                generated.append(nxt)
        assert o.outputs[0].token_ids == generated, (pp, fp)


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (lambda x: apply_top_k_top_p(x, torch.tensor([7, 7, 7, 7]), None), TopKLogitsWarper(7)),
        (lambda x: apply_top_k_top_p(x, None, torch.full((4,), 0.6)), TopPLogitsWarper(0.6)),
        (lambda x: apply_top_k_top_p(x, None, torch.full((4,), 0.93)), TopPLogitsWarper(0.93)),
        (lambda x: apply_min_p(x, torch.full((4,), 0.05)), MinPLogitsWarper(0.05)),
        (lambda x: apply_min_p(x, torch.full((4,), 0.3)), MinPLogitsWarper(0.3)),
        (lambda x: apply_typical_p(x, torch.full((4,), 0.5)), TypicalLogitsWarper(0.5)),
        (lambda x: apply_typical_p(x, torch.full((4,), 0.9)), TypicalLogitsWarper(0.9)),
    ],
)
def test_warpers_keep_the_same_tokens_as_hf(ours, theirs) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 500, generator=g) * 2.5
    mine = ours(logits.clone())
    ref = theirs(None, logits.clone())
    assert torch.equal(torch.isfinite(mine), torch.isfinite(ref))
    kept = torch.isfinite(mine).sum(dim=-1)
    assert (kept < 500).all() and (kept > 1).any()  # the filter removed tokens on every row


def test_top_k_top_p_on_a_large_vocabulary_cut_from_the_best_tokens_as_hf() -> None:
    """Rows decided inside the best PARTIAL_TOP tokens (peaked rows, small top_k) and rows that
    need the whole sort (flat rows, top_k past PARTIAL_TOP, a tie of the k-th value past it) in one
    batch keep exactly HF's tokens; rows with both warpers off are untouched."""
    g = torch.Generator().manual_seed(5)
    vocab = 6000
    scale = torch.tensor([8.0, 8.0, 0.05, 8.0, 0.05, 8.0, 1.0])[:, None]
    logits = torch.randn(7, vocab, generator=g) * scale
    logits[5, :1500] = logits[5].max() + 1  # 1500 tied best values: top_k 40 keeps them all (HF too)
    top_k = torch.tensor([0, 40, 0, 1500, 40, 40, 0])
    top_p = torch.tensor([0.9, 1.0, 0.7, 0.95, 0.5, 1.0, 1.0])
    mine = apply_top_k_top_p(logits.clone(), top_k, top_p)
    for r in range(7):
        ref = logits[r : r + 1].clone()
        if top_k[r] > 0:
            ref = TopKLogitsWarper(int(top_k[r]))(None, ref)
        if top_p[r] < 1:
            ref = TopPLogitsWarper(float(top_p[r]))(None, ref)
        assert torch.equal(torch.isfinite(mine[r]), torch.isfinite(ref[0])), r
        assert torch.equal(mine[r][torch.isfinite(mine[r])], logits[r][torch.isfinite(ref[0])]), r
    assert torch.equal(mine[6], logits[6])
    kept = torch.isfinite(mine).sum(dim=-1).tolist()
    assert kept[1] == 40 and kept[5] == 1500 and kept[2] > 1024 and kept[0] < 1024, kept


def test_bad_words_as_strings_are_tokenized(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    first = llm.generate(["the quick brown fox"], SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    word = first.outputs[0].text.split()[0]
    out = llm.generate(["the quick brown fox"], SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, bad_words=[word]), use_tqdm=False)[0]
    assert word not in out.outputs[0].text.split()
    # strings and token-id lists mix in bad_words (SPEC §1): the ids ban like bad_words_ids do
    ids = first.outputs[0].token_ids
    mixed = SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True, bad_words=[word, [ids[1]]])
    assert mixed.bad_words == [word] and mixed.bad_words_ids == [[ids[1]]]
    out = llm.generate(["the quick brown fox"], mixed, use_tqdm=False)[0]
    assert word not in out.outputs[0].text.split() and ids[1] not in out.outputs[0].token_ids


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),  # above 2 is allowed (MindIE)
        ({"presence_penalty": 2.1}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"typical_p": 0.0}, "typical_p"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {5: 500}}, "logit_bias"),
        ({"bad_words": [""]}, "bad_words"),
        ({"bad_words_ids": [[]]}, "bad_words"),
    ],
)
def test_invalid_controls_name_the_field(kwargs, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param


def test_out_of_vocab_control_ids_are_rejected(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    for kwargs, param in (({"logit_bias": {10**6: 1.0}}, "logit_bias"), ({"bad_words_ids": [[10**6]]}, "bad_words")):
        with pytest.raises(ParamError) as e:
            llm.generate([[5, 6, 7]], SamplingParams(**kwargs), use_tqdm=False)
        assert e.value.param == param


def test_processors_equal_hf_processors_on_full_logits() -> None:
    """Whole-vocabulary equality (both signs of every logit), not just the argmax."""
    from transformers.generation.logits_process import (
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
    )

    from inflight.request import Request
    from inflight.sample import processors as P

    g = torch.Generator().manual_seed(11)
    history = [[5, 9, 5, 7, 9, 5, 7, 9], [1, 2, 3, 1, 2, 8, 1, 2]]
    logits = torch.randn(2, 50, generator=g) * 3  # both signs present among seen tokens
    ids = torch.tensor(history)
    cases = [
        (P.repetition_penalty, {"repetition_penalty": 1.4}, RepetitionPenaltyLogitsProcessor(1.4)),
        (P.repetition_penalty, {"repetition_penalty": 0.6}, RepetitionPenaltyLogitsProcessor(0.6)),
        (P.no_repeat_ngram, {"no_repeat_ngram_size": 2}, NoRepeatNGramLogitsProcessor(2)),
        (P.no_repeat_ngram, {"no_repeat_ngram_size": 3}, NoRepeatNGramLogitsProcessor(3)),
        (P.bad_words, {"bad_words_ids": [[1, 2, 4], [7, 11], [13]]}, NoBadWordsLogitsProcessor([[1, 2, 4], [7, 11], [13]], eos_token_id=None)),
        (P.logit_bias, {"logit_bias": {3: 2.5, 9: -4.0}}, SequenceBiasLogitsProcessor({(3,): 2.5, (9,): -4.0})),
    ]  # fmt: skip
    for build, kwargs, hf_proc in cases:
        reqs = []
        for i, h in enumerate(history):
            r = Request(f"r{i}", h[:3], SamplingParams(**kwargs))
            for t in h[3:]:
                r.append_token(t)
            reqs.append(r)
        proc = build(reqs, torch.device("cpu"), logits.shape[-1])
        assert proc is not None, kwargs
        mine = proc(logits.clone())
        ref = hf_proc(ids, logits.clone())
        assert torch.allclose(mine, ref, atol=1e-6), kwargs
        assert not torch.equal(mine, logits), kwargs  # it changed something


def test_embedding_bias_vector_equals_the_same_logit_bias(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    vocab = llm.engine.config.model.vocab_size
    p = _prompt(77)
    vec = [0.0] * vocab
    vec[123], vec[456] = 4.0, -2.5
    base = {"max_tokens": N_NEW, "temperature": 0.0, "ignore_eos": True}
    a, b, plain, trt = llm.generate(
        [{"prompt_token_ids": p}] * 4,
        [SamplingParams(embedding_bias=vec, **base), SamplingParams(logit_bias={123: 4.0, 456: -2.5}, **base), SamplingParams(**base),
         SamplingParams(embedding_bias=torch.tensor([vec]), **base)],  # TensorRT-LLM's [1, vocab] tensor
        use_tqdm=False,
    )  # fmt: skip
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == trt.outputs[0].token_ids != plain.outputs[0].token_ids
    with pytest.raises(ParamError) as e:
        llm.generate([[5, 6]], SamplingParams(embedding_bias=[0.0] * 10), use_tqdm=False)
    assert e.value.param == "embedding_bias"


def test_token_id_stop_sequences(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    p = _prompt(78)
    base = {"max_tokens": N_NEW, "temperature": 0.0, "ignore_eos": True}
    ref = llm.generate([{"prompt_token_ids": p}], SamplingParams(**base), use_tqdm=False)[0].outputs[0].token_ids
    seq = ref[4:6]
    out = llm.generate([{"prompt_token_ids": p}], SamplingParams(stop_token_sequences=[[999, 998], seq], **base), use_tqdm=False)[0]
    first = next(i for i in range(len(ref) - 1) if ref[i : i + 2] == seq)
    assert out.outputs[0].token_ids == ref[: first + 2]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == str(seq)
    with pytest.raises(ParamError) as e:
        SamplingParams(stop_token_sequences=[[]])
    assert e.value.param == "stop_words"
