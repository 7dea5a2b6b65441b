"""Beam search against Hugging Face `generate(num_beams=4)`: tokens, EOS handling, early stopping."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from inflight import LLM, AsyncEngine, ParamError, SamplingParams

N_NEW = 12


@pytest.fixture(scope="module")
def setup(tiny_model_dir):  # type: ignore[no-untyped-def]
    path = tiny_model_dir("qwen2")
    llm = LLM(model=str(path), dtype="float32", device="cpu", progress=False)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return llm, hf


def _prompt(seed: int) -> list[int]:
    return torch.randint(3, 1000, (14,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_beams(hf, prompt: list[int], eos: int | None, **kw) -> list[list[int]]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            num_beams=4, max_new_tokens=N_NEW, do_sample=False, eos_token_id=eos, pad_token_id=-1, **kw,
        )  # fmt: skip
    return [[t for t in row[len(prompt) :].tolist() if t != -1] for row in out]


def _eos_for(hf, prompt: list[int]) -> int:  # type: ignore[no-untyped-def]
    """A token that the beams actually produce a few steps in, so EOS handling matters."""
    return _hf_beams(hf, prompt, None, num_return_sequences=4)[1][3]


CASES = [
    {"length_penalty": 1.0, "early_stopping": False, "num_return_sequences": 4},
    {"length_penalty": 0.5, "early_stopping": True, "num_return_sequences": 2},
    {"length_penalty": 2.0, "early_stopping": True, "num_return_sequences": 4},
    {"length_penalty": 2.0, "early_stopping": "never", "num_return_sequences": 3},
    {"length_penalty": 0.5, "early_stopping": False, "num_return_sequences": 1},
    {"length_penalty": 1.0, "early_stopping": "never", "num_return_sequences": 2},
]


def test_beam_search_matches_hf_in_one_mixed_batch(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    prompts = [_prompt(i) for i in range(len(CASES))]
    eos = [_eos_for(hf, p) for p in prompts]
    params = [
        SamplingParams(
            beam_width=4, n=c["num_return_sequences"], temperature=0.0, max_tokens=N_NEW, end_id=e,
            length_penalty=c["length_penalty"], early_stopping=c["early_stopping"],
        )
        for c, e in zip(CASES, eos)
    ] + [SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)]  # fmt: skip
    greedy_prompt = _prompt(99)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts + [greedy_prompt]], params, use_tqdm=False)
    finished_early = 0
    for c, p, e, o in zip(CASES, prompts, eos, outs):
        ref = _hf_beams(hf, p, e, **c)
        assert [x.token_ids for x in o.outputs] == ref, c
        finished_early += sum(1 for x in o.outputs if x.finish_reason == "stop")
        assert all((x.finish_reason == "stop") == (x.token_ids[-1] == e) for x in o.outputs)
    assert finished_early > 0  # EOS really ended hypotheses in these cases
    greedy = hf.generate(torch.tensor([greedy_prompt]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert outs[-1].outputs[0].token_ids == greedy[0, 14:].tolist()
    llm.engine.kv.pool.check_idle()


def test_beams_share_blocks_and_free_them(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    eng = llm.engine
    prompt = list(range(3, 3 + 40))  # two full blocks shared by every beam
    eng.add_request(eng.make_request({"prompt_token_ids": prompt}, SamplingParams(beam_width=4, temperature=0.0, max_tokens=20, ignore_eos=True), request_id="b"))
    max_shared = 0
    while eng.has_unfinished_requests():
        eng.step()
        beams = [r for r in eng.scheduler.requests.values() if r.beam_group_id == "b"]
        if len(beams) == 4:
            counts = [eng.kv.pool.blocks[blk].ref_cnt for blk in beams[0].block_ids[:2]]
            max_shared = max(max_shared, min(counts))
    assert max_shared == 4
    eng.kv.pool.check_idle()


def test_beam_abort_and_streaming(setup) -> None:  # type: ignore[no-untyped-def]
    llm, _ = setup
    engine = AsyncEngine(llm.engine)
    params = SamplingParams(beam_width=3, n=2, temperature=0.0, max_tokens=8, ignore_eos=True)

    async def stream() -> list:  # final beams only: exactly one output
        return [o async for o in engine.generate({"prompt_token_ids": _prompt(5)}, params)]

    async def abort() -> str | None:
        long = SamplingParams(beam_width=3, temperature=0.0, max_tokens=200, ignore_eos=True)
        gen = engine.generate({"prompt_token_ids": _prompt(6)}, long, request_id="beam-abort")
        task = asyncio.create_task(anext(gen))
        await asyncio.sleep(0.2)
        await engine.abort("beam-abort")
        return (await task).outputs[0].finish_reason

    try:
        outs = asyncio.run(stream())
        assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs) == 2
        assert asyncio.run(abort()) == "abort"
        assert not llm.engine.has_unfinished_requests() and not llm.engine.parents
        llm.engine.kv.pool.check_idle()
    finally:
        engine.shutdown()


def test_an_aborted_search_counts_the_work_of_every_beam(setup) -> None:  # type: ignore[no-untyped-def]
    """`inflight_wasted_tokens` of a search: its prompt and each round of every beam, retired ones too."""
    llm, _ = setup
    eng = llm.engine
    prompt = _prompt(77)  # not cached by another test
    params = SamplingParams(beam_width=4, temperature=0.0, max_tokens=50, ignore_eos=True)
    eng.add_request(eng.make_request({"prompt_token_ids": prompt}, params, request_id="wb"))
    for _ in range(5):
        eng.step()
    group = eng.parents["wb"]
    rounds = group.cur_len - group.prompt_len
    assert rounds >= 3
    eng.abort_request("wb")
    (out,) = [o for o in eng.step() if o.request_id == "wb"]
    assert out.finished and out.outputs[0].finish_reason == "abort"
    # the first beam ran the prompt; from the second round on, 4 beams ran their new token each
    # (plus at most a block's tail each where a fork found no free block to copy into)
    least = len(prompt) + 4 * (rounds - 1)
    assert least <= out.metrics.num_tokens_run <= least + 4 * eng.kv.block_size
    eng.kv.pool.check_idle()


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"beam_width": 4, "temperature": 0.8, "logprobs": 1, "logprob_token_ids": [3]}, "logprob_token_ids"),
        ({"beam_width": 4, "temperature": 0.0, "watermark": True}, "watermark"),
        ({"beam_width": 2, "n": 3, "temperature": 0.0}, "n"),
        ({"beam_width": 4, "temperature": 0.0, "early_stopping": "sometimes"}, "early_stopping"),
    ],
)
def test_invalid_beam_combinations(kwargs, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParamError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param


def test_use_beam_search_takes_the_width_from_best_of(setup) -> None:  # type: ignore[no-untyped-def]
    llm, hf = setup
    p = _prompt(7)
    out = llm.generate([{"prompt_token_ids": p}], SamplingParams(use_beam_search=True, n=2, best_of=4, temperature=0.0, max_tokens=N_NEW, ignore_eos=True), use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == _hf_beams(hf, p, None, num_return_sequences=2)


@pytest.mark.parametrize(
    "seed,temperature,top_k,warp",
    [(0, 0.7, 0, {}), (1, 1.0, 20, {}), (2, 1.3, 0, {"top_p": 0.3}), (3, 1.5, 0, {"min_p": 0.7}), (4, 1.5, 0, {"typical_p": 0.3})],
)
def test_beam_sampling_matches_hf(setup, seed: int, temperature: float, top_k: int, warp: dict) -> None:  # type: ignore[no-untyped-def]
    """temperature > 0 is HF's beam sampling (`do_sample=True`): the same draws from the same seed,
    with HF's warpers (top_k, top_p, min_p, typical_p, each keeping at least 2 tokens per beam)."""
    llm, hf = setup
    p = _prompt(20 + seed)
    params = SamplingParams(beam_width=4, n=2, temperature=temperature, top_k=top_k, seed=seed, max_tokens=N_NEW, ignore_eos=True, **warp)
    out = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
    torch.manual_seed(seed)
    with torch.no_grad():
        rows = hf.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), num_beams=4, num_return_sequences=2,
            max_new_tokens=N_NEW, do_sample=True, temperature=temperature, top_k=top_k, eos_token_id=None, pad_token_id=-1,
            **({"top_p": 1.0} | warp),
        )  # fmt: skip
    ref = [row[len(p) :].tolist() for row in rows]
    if warp:  # the warper changes the draws (same seed, same temperature, without it)
        torch.manual_seed(seed)
        with torch.no_grad():
            plain = hf.generate(
                torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), num_beams=4, num_return_sequences=2,
                max_new_tokens=N_NEW, do_sample=True, temperature=temperature, top_k=top_k, top_p=1.0, eos_token_id=None, pad_token_id=-1,
            )  # fmt: skip
        assert [row[len(p) :].tolist() for row in plain] != ref
    assert [c.token_ids for c in out.outputs] == ref
    again = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == ref  # the seed, not the global generator


def test_beam_logprobs_and_figures(setup) -> None:  # type: ignore[no-untyped-def]
    """Each hypothesis's tokens carry their raw log-softmax (HF's scores at temperature 0 sum to
    the cumulative score), rank and top-N; the search reports one time and batch size per token."""
    llm, hf = setup
    p = _prompt(30)
    params = SamplingParams(beam_width=3, n=2, temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)
    out = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
    for c in out.outputs:
        assert len(c.logprobs) == len(c.token_ids) == 6
        chosen = [e[t] for t, e in zip(c.token_ids, c.logprobs)]
        assert sum(lp.logprob for lp in chosen) == pytest.approx(c.cumulative_logprob, abs=1e-4)
        assert all(len(e) >= 2 and lp.rank >= 1 and lp.decoded_token is not None for e, lp in zip(c.logprobs, chosen))
    with torch.no_grad():  # the first token's logprob from HF's own forward
        logits = hf(torch.tensor([p])).logits[0, -1]
    first = out.outputs[0]
    assert first.logprobs[0][first.token_ids[0]].logprob == pytest.approx(float(torch.log_softmax(logits, -1)[first.token_ids[0]]), abs=1e-4)
    m = out.metrics
    assert len(m.token_times) == len(m.batch_sizes) == 6 and m.time_to_first_token_ms > 0
    # return_generation_logits: every hypothesis gets its own raw logits rows, which score its tokens
    gen = llm.generate([{"prompt_token_ids": p}], SamplingParams(beam_width=3, n=2, temperature=0.0, max_tokens=6, ignore_eos=True,
                                                                 return_generation_logits=True), use_tqdm=False)[0]  # fmt: skip
    assert [c.token_ids for c in gen.outputs] == [c.token_ids for c in out.outputs]
    for c in gen.outputs:
        rows = c.generation_logits
        assert rows.shape == (6, logits.shape[-1])
        chosen = torch.log_softmax(rows, -1)[torch.arange(6), torch.tensor(c.token_ids)]
        assert chosen.sum().item() == pytest.approx(c.cumulative_logprob, abs=1e-4)
        assert torch.allclose(rows[0], logits, atol=1e-4)  # the first row is HF's logits at the prompt's end


class _Add(LogitsProcessor):
    """HF-side twin of a bias / OpenAI penalty: adds what `delta(generated, row)` gives to the log-probs."""

    def __init__(self, prompt_len: int, delta) -> None:  # type: ignore[no-untyped-def]
        self.prompt_len, self.delta = prompt_len, delta

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for row in range(scores.shape[0]):
            scores[row] = scores[row] + self.delta(input_ids[row, self.prompt_len :].tolist(), scores[row])
        return scores


def _openai_penalty(presence: float, frequency: float):  # type: ignore[no-untyped-def]
    def delta(generated: list[int], row: torch.Tensor) -> torch.Tensor:
        d = torch.zeros_like(row)
        for tok, count in Counter(generated).items():
            d[tok] -= presence + frequency * count
        return d

    return delta


class _Ends(StoppingCriteria):
    """HF-side twin of a stop word: a generated part that ends with a token sequence / holds a string."""

    def __init__(self, prompt_len: int, seq: list[int] | None = None, text: str | None = None, tok=None) -> None:  # type: ignore[no-untyped-def]
        self.prompt_len, self.seq, self.text, self.tok = prompt_len, seq, text, tok

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:  # type: ignore[no-untyped-def]
        out = []
        for row in input_ids[:, self.prompt_len :].tolist():
            if self.seq is not None:
                out.append(row[len(row) - len(self.seq) :] == self.seq)
            else:
                out.append(self.text in self.tok.decode(row, skip_special_tokens=True))
        return torch.tensor(out, dtype=torch.bool)


def _control_cases(base: list[list[int]], prompt_len: int, vocab: int, tok) -> list[tuple[str, dict, dict]]:  # type: ignore[no-untyped-def]
    """(name, our SamplingParams keywords, HF generate keywords), each built to change the beams."""
    best = base[0]
    bias = torch.zeros(vocab)
    bias[best[1]], bias[base[1][2]] = -3.0, 2.0
    stop_text = tok.decode(best[3:5], skip_special_tokens=True).strip()[:3]
    return [
        ("repetition_penalty", {"repetition_penalty": 1.8}, {"repetition_penalty": 1.8}),
        ("presence_frequency", {"presence_penalty": 0.6, "frequency_penalty": 1.2},
         {"logits_processor": LogitsProcessorList([_Add(prompt_len, _openai_penalty(0.6, 1.2))])}),
        ("no_repeat_ngram_size", {"no_repeat_ngram_size": 1}, {"no_repeat_ngram_size": 1}),
        ("bad_words", {"bad_words_ids": [[best[0]], [best[2], best[3]]]}, {"bad_words_ids": [[best[0]], [best[2], best[3]]]}),
        ("logit_bias", {"logit_bias": {base[2][1]: 4.0}}, {"sequence_bias": {(base[2][1],): 4.0}}),
        ("embedding_bias", {"embedding_bias": bias.tolist()},
         {"logits_processor": LogitsProcessorList([_Add(prompt_len, lambda g, row: bias)])}),
        ("stop_words_ids", {"stop_token_sequences": [best[2:4]]}, {"stop_criteria": _Ends(prompt_len, seq=best[2:4])}),
        ("stop_strings", {"stop": [stop_text], "include_stop_str_in_output": True},
         {"stop_criteria": _Ends(prompt_len, text=stop_text, tok=tok)}),
        ("stop_token_ids", {"stop_token_ids": [best[4]]}, {"eos_token_id": [best[4]]}),
    ]  # fmt: skip


def test_beam_search_with_each_control_matches_hf(setup) -> None:  # type: ignore[no-untyped-def]
    """Penalties, bans, biases and stop words with beam_width 4, all in one engine batch, each
    against HF `generate(num_beams=4)` with the matching processor / stopping criterion."""
    llm, hf = setup
    tok = llm.engine.tokenizer
    p = _prompt(40)
    base = _hf_beams(hf, p, None, num_return_sequences=4)
    cases = _control_cases(base, len(p), hf.config.vocab_size, tok)
    params = [SamplingParams(beam_width=4, n=4, temperature=0.0, max_tokens=N_NEW, ignore_eos=True, **ours) for _, ours, _ in cases]
    outs = llm.generate([{"prompt_token_ids": p}] * len(cases), params, use_tqdm=False)
    num_stopped = 0
    for (name, ours, theirs), out in zip(cases, outs):
        theirs = dict(theirs)
        if "stop_criteria" in theirs:
            theirs["stopping_criteria"] = StoppingCriteriaList([theirs.pop("stop_criteria")])
        ref = _hf_beams(hf, p, theirs.pop("eos_token_id", None), num_return_sequences=4, **theirs)
        assert ref != base, name  # the control changes the search
        assert [c.token_ids for c in out.outputs] == ref, name
        if name.startswith("stop"):  # a hypothesis a stop word ended says which one
            stopped = [c for c in out.outputs if c.finish_reason == "stop"]
            assert all(c.stop_reason is not None for c in stopped), name
            num_stopped += len(stopped)
        if name == "stop_strings":
            assert all(c.text.endswith(ours["stop"][0]) for c in stopped)
    assert num_stopped > 0  # stop words really ended hypotheses here
    llm.engine.kv.pool.check_idle()


def test_beam_min_tokens_and_sampling_with_a_penalty_match_hf(setup) -> None:  # type: ignore[no-untyped-def]
    """min_tokens bans EOS per beam (HF min_new_tokens); with temperature > 0 the processors act
    before the temperature, as HF's do (same seeded draws)."""
    llm, hf = setup
    p = _prompt(41)
    eos = _hf_beams(hf, p, None)[0][2]  # the best beam's third token: EOS would end it before 7 tokens
    # length_penalty 0: a hypothesis's score is its sum, so one that EOS ends early ranks first
    params = SamplingParams(beam_width=4, n=4, temperature=0.0, max_tokens=N_NEW, end_id=eos, min_tokens=7, length_penalty=0.0)
    out = llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0]
    ref = _hf_beams(hf, p, eos, num_return_sequences=4, min_new_tokens=7, length_penalty=0.0)
    assert ref != _hf_beams(hf, p, eos, num_return_sequences=4, length_penalty=0.0)
    assert [c.token_ids for c in out.outputs] == ref
    assert all(eos not in c.token_ids[:7] for c in out.outputs)
    sp = SamplingParams(beam_width=4, n=2, temperature=0.8, seed=3, max_tokens=N_NEW, ignore_eos=True, repetition_penalty=1.5)
    out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
    torch.manual_seed(3)
    with torch.no_grad():
        rows = hf.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), num_beams=4, num_return_sequences=2,
            max_new_tokens=N_NEW, do_sample=True, temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.5,
            eos_token_id=None, pad_token_id=-1,
        )  # fmt: skip
    assert [c.token_ids for c in out.outputs] == [row[len(p) :].tolist() for row in rows]
