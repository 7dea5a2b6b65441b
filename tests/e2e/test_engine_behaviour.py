"""End-to-end engine behaviour on a tiny text model: prefix caching, seeds, validation, logprobs.

Stops, min_tokens, EOS handling, the model-length cap, detokenization and the AsyncEngine
streaming paths are in test_stops_and_streaming.py; shared fixtures are in conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import PROMPT, _assert_idle, _greedy, _llm

from inflight import LLM, ParamError, SamplingParams


# ------------------------------------------------------------------------------ prefix caching
def _prefix_waves(path: Path, caching: bool) -> tuple[list[Any], list[Any], LLM]:
    gen = torch.Generator().manual_seed(7)
    shared = torch.randint(3, 1000, (40,), generator=gen).tolist()
    suffixes = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 9, 13, 2, 20, 7)]
    prompts = [{"prompt_token_ids": shared + s} for s in suffixes]
    llm = _llm(path, enable_prefix_caching=caching)
    params = _greedy(max_tokens=12)
    wave1 = llm.generate(prompts[:3], params, use_tqdm=False)
    wave2 = llm.generate(prompts[3:], params, use_tqdm=False)
    _assert_idle(llm)
    return wave1, wave2, llm


def test_prefix_caching_on_and_off_give_identical_tokens(model_dir: Path) -> None:
    on1, on2, llm_on = _prefix_waves(model_dir, caching=True)
    off1, off2, _ = _prefix_waves(model_dir, caching=False)
    for a, b in zip(on1 + on2, off1 + off2):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    # second wave: the 40-token shared prefix holds 2 full blocks of 16
    assert all(o.metrics.num_cached_tokens == 32 for o in on2)
    assert all(o.num_cached_tokens == 32 for o in on2)
    assert all(o.metrics.num_cached_tokens == 0 for o in off1 + off2)
    assert llm_on.engine.stats().prefix_cache_hit_rate > 0


# ------------------------------------------------------------------------------ seeded sampling
SEEDED = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_tokens": 16, "ignore_eos": True}


def test_seeded_sampling_is_independent_of_the_batch(llm: LLM) -> None:
    target = {"prompt_token_ids": [11, 220, 305, 47, 90, 612, 18]}
    alone = llm.generate([target], SamplingParams(seed=1234, **SEEDED), use_tqdm=False)[0]

    others = [
        (
            "The cat sees a red house today.",
            SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        ),
        ("A young girl paints the blue river.", SamplingParams(max_tokens=9, temperature=1.0)),
        (
            {"prompt_token_ids": list(range(3, 50))},
            SamplingParams(max_tokens=30, temperature=1.3, top_k=5, seed=7),
        ),
        (
            "你好世界，今天天气很好。",
            SamplingParams(max_tokens=12, temperature=0.5, top_p=0.5, logprobs=2),
        ),
        ([5, 6, 7], SamplingParams(max_tokens=25, temperature=0.7, seed=99, ignore_eos=True)),
    ]
    prompts = [p for p, _ in others[:2]] + [target] + [p for p, _ in others[2:]]
    params = (
        [s for _, s in others[:2]]
        + [SamplingParams(seed=1234, **SEEDED)]
        + [s for _, s in others[2:]]
    )
    batched = llm.generate(prompts, params, use_tqdm=False)
    assert batched[2].outputs[0].token_ids == alone.outputs[0].token_ids
    assert len(alone.outputs[0].token_ids) == 16

    other_seed = llm.generate([target], SamplingParams(seed=4321, **SEEDED), use_tqdm=False)[0]
    assert other_seed.outputs[0].token_ids != alone.outputs[0].token_ids
    _assert_idle(llm)


def test_unseeded_sampling_works(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, top_k=50, max_tokens=10, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT], params, use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        assert len(o.token_ids) == 10 and o.finish_reason == "length"
        assert all(0 <= t < 1000 for t in o.token_ids)
    _assert_idle(llm)


# ------------------------------------------------------------------------------ invalid input
@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 2, "temperature": 0.0}, "n"),
        ({"stop": [""]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"seed": -1}, "seed"),
        ({"max_batch_size": 0}, "max_batch_size"),
        (
            {"max_batch_size": 2, "beam_width": 3, "temperature": 0.0},
            "max_batch_size",
        ),  # beams run side by side
    ],
)
def test_invalid_sampling_params(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as exc:
        SamplingParams(**kwargs)
    assert exc.value.param == param


@pytest.mark.parametrize(
    "prompt, extra, param",
    [
        ("", {}, "prompt"),
        ([], {}, "prompt"),
        ({"prompt_token_ids": []}, {}, "prompt"),
        ([5, 1000], {}, "prompt"),  # vocab is 1000
        ([5, -1], {}, "prompt"),
        (PROMPT, {"priority": 0}, "priority"),
        (PROMPT, {"priority": 6}, "priority"),
        (PROMPT, {"timeout": 0}, "timeout"),
        (PROMPT, {"timeout": 4000}, "timeout"),
    ],
)
def test_invalid_requests(llm: LLM, prompt: Any, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ParamError) as exc:
        llm.engine.make_request(prompt, SamplingParams(), **extra)
    assert exc.value.param == param
    assert not llm.engine.requests


def test_invalid_priority_through_llm_generate(llm: LLM) -> None:
    with pytest.raises(ParamError) as exc:
        llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False, priority=[0])
    assert exc.value.param == "priority"
    _assert_idle(llm)


def test_invalid_prompt_in_a_batch_queues_nothing(llm: LLM) -> None:
    """All prompts are validated before any is queued: no orphan runs on the next call."""
    with pytest.raises(ParamError) as exc:
        llm.generate([PROMPT, "", PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert exc.value.param == "prompt"
    assert not llm.engine.requests and not llm.engine.has_unfinished_requests()
    outs = llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(outs) == 1
    _assert_idle(llm)


# ------------------------------------------------------------------------------ logprobs
def test_logprobs_consistency(llm: LLM) -> None:
    greedy = _greedy(max_tokens=12, logprobs=2)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True, logprobs=0)
    outs = llm.generate([PROMPT, PROMPT], [greedy, sampled], use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        chosen = [o.logprobs[i][t] for i, t in enumerate(o.token_ids)]
        assert all(next(iter(entry)) == t for entry, t in zip(o.logprobs, o.token_ids))
        assert o.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in chosen), abs=1e-6)
        assert all(lp.logprob <= 0 and lp.rank >= 1 for lp in chosen)
        assert all(lp.decoded_token is not None for lp in chosen)
    g = outs[0].outputs[0]
    assert all(g.logprobs[i][t].rank == 1 for i, t in enumerate(g.token_ids))
    assert all(len(entry) == 2 for entry in g.logprobs)  # chosen (== top-1) + top-2
    s = outs[1].outputs[0]
    assert all(len(entry) == 1 for entry in s.logprobs)  # logprobs=0: the chosen token only
    # no logprobs asked: none returned, but the cumulative logprob is still kept
    o = llm.generate([PROMPT], _greedy(max_tokens=4), use_tqdm=False)[0].outputs[0]
    assert o.logprobs is None and o.cumulative_logprob is not None and o.cumulative_logprob < 0
    _assert_idle(llm)


def _run(llm: LLM, requests: list[Any]) -> dict[str, list[Any]]:
    """Every output of each request, in order, straight from the engine's step loop."""
    outs: dict[str, list[Any]] = {r.request_id: [] for r in requests}
    for r in requests:
        llm.engine.add_request(r)
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            outs[out.request_id].append(out)
    return outs


def test_cumulative_logprob_only_where_asked(llm: LLM) -> None:
    """cumulative_logprob=False (the servers): None, the same tokens, and the rows beside it keep
    theirs; a step where no row reads a logprob skips the log-softmax. best_of and logprobs
    compute it anyway (they read it)."""
    eng, seeded = llm.engine, SamplingParams(seed=9, **SEEDED)

    def make(rid: str, params: SamplingParams, asked: bool) -> Any:
        return eng.make_request(PROMPT, params, request_id=rid, cumulative_logprob=asked)

    both = _run(llm, [make("on", _greedy(), True), make("off", _greedy(), False), make("s-off", seeded, False)])
    alone = _run(llm, [make("on", _greedy(), True), make("s-on", seeded, True)])
    skipped = _run(llm, [make("off", _greedy(), False), make("s-off", seeded, False)])  # no log-softmax at all
    final = {rid: outs[-1].outputs[0] for run in (both, alone, skipped) for rid, outs in run.items()}
    on, off = both["on"][-1].outputs[0], both["off"][-1].outputs[0]
    assert on.token_ids == off.token_ids == final["on"].token_ids == final["off"].token_ids
    assert final["s-off"].token_ids == both["s-off"][-1].outputs[0].token_ids == final["s-on"].token_ids
    assert off.cumulative_logprob is None and final["s-off"].cumulative_logprob is None
    assert on.cumulative_logprob == pytest.approx(final["on"].cumulative_logprob, abs=1e-6) and on.cumulative_logprob < 0
    asked = [make("lp", _greedy(logprobs=0), False), make("best", SamplingParams(n=1, best_of=2, seed=3, **SEEDED), False)]
    for outs in _run(llm, asked).values():
        c = outs[-1].outputs[0]
        assert c.cumulative_logprob is not None and c.cumulative_logprob < 0
    _assert_idle(llm)


def test_each_streamed_output_keeps_its_own_tokens(llm: LLM) -> None:
    """An output is a snapshot: the token ids and logprobs of an early output, read after the
    request ran on, are still the ones it had (they are copied only when read)."""
    outs = _run(llm, [llm.engine.make_request(PROMPT, _greedy(max_tokens=8, logprobs=1), request_id="r")])["r"]
    whole = outs[-1].outputs[0]
    assert len(outs) > 2
    seen = 0
    for out in outs:
        c = out.outputs[0]
        seen += len(c.delta_token_ids)
        assert c.token_ids == whole.token_ids[:seen] and len(c.logprobs) == seen
        assert c.logprobs == whole.logprobs[:seen]
    _assert_idle(llm)


# ------------------------------------------------------------------------------ batch-size caps
def test_batch_size_caps_bound_the_steps_of_their_requests(llm: LLM) -> None:
    """MindIE batch_size (`max_batch_size`) on the real engine: queued behind three busy requests,
    a cap-2 request runs only in steps of <= 2 rows (one of them a busy request still live), a
    cap-1 request after it runs alone, both complete with the tokens they give alone."""
    prompts = [f"{PROMPT} Part {i}." for i in range(5)]
    busy = [_greedy(max_tokens=8 + 4 * i) for i in range(3)]
    capped = [_greedy(max_tokens=6, max_batch_size=2), _greedy(max_tokens=6, max_batch_size=1)]
    outs = llm.generate(prompts, busy + capped, use_tqdm=False)
    assert max(b for o in outs[:3] for b in o.metrics.batch_sizes) == 3  # all three ran together
    two, one = outs[3].metrics, outs[4].metrics
    assert max(two.batch_sizes) == 2 and all(b <= 2 for b in two.batch_sizes)
    assert one.batch_sizes == [1] * 6
    assert one.first_scheduled_time > max(o.metrics.finished_time for o in outs[:4])
    alone = llm.generate(prompts[3:], _greedy(max_tokens=6), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[3:]] == [o.outputs[0].token_ids for o in alone]
    _assert_idle(llm)


def test_offline_generate_has_no_default_deadline(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long offline batch is never cut by the server's 600 s default; a timeout given still applies.
    The scheduler's clock is moved 700 s past every request's arrival."""
    import time
    import types

    from inflight.core import scheduler

    late = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + 700.0)
    monkeypatch.setattr(scheduler, "time", late)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate(["no deadline", "for offline work"], params, use_tqdm=False)
    assert [(o.outputs[0].finish_reason, len(o.outputs[0].token_ids)) for o in outs] == [("length", 6)] * 2
    timed = llm.generate(["a deadline the caller set"], params, use_tqdm=False, timeout=600.0)
    assert timed[0].outputs[0].finish_reason == "timeout" and len(timed[0].outputs[0].token_ids) < 6
