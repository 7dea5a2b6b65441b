"""The shortcuts a large batch of plain requests takes (offline_host_cost.py) give what the general
paths give: a step of plain greedy decodes built by list comprehensions (worker/step_inputs.py)
against the same requests beside one that is not plain (every step then takes the general loop);
final-only requests skipped by the step's outputs until they end (Sequences.step_outputs) against
the same requests streamed; and each of them, with stop strings and stop token ids, against the
request run alone."""

from __future__ import annotations

import pytest
from engine_helpers import PROMPT, _assert_idle

from inflight import LLM, SamplingParams
from inflight.outputs import RequestOutput

PROMPTS = [PROMPT, "A small boat", "Seven ravens over the hill at dawn", "x", "The sea"]
PLAIN = [SamplingParams(max_tokens=14 + i, temperature=0.0, ignore_eos=i % 2 == 0) for i in range(len(PROMPTS))]
STOPPING = [
    SamplingParams(max_tokens=20, temperature=0.0, stop=["e", "o"]),  # deferred text is not allowed: per step
    SamplingParams(max_tokens=20, temperature=0.0, stop=["the"], include_stop_str_in_output=True),
]


def _final(o: RequestOutput) -> tuple[object, ...]:
    c = o.outputs[0]
    return c.text, list(c.token_ids), c.finish_reason, c.stop_reason, c.cumulative_logprob, len(o.metrics.token_times)


def _streamed(llm: LLM, params: list[SamplingParams]) -> list[tuple[object, ...]]:
    engine, ids, last = llm.engine, [], {}
    for p, sp in zip(PROMPTS, params):
        req = engine.make_request(p, sp, final_only=False)
        engine.add_request(req)
        ids.append(req.request_id)
    while engine.has_unfinished_requests():
        last.update((o.request_id, o) for o in engine.step())
    return [_final(last[i]) for i in ids]


def _same(got: list[tuple[object, ...]], want: list[tuple[object, ...]]) -> None:
    """Another batch's rows: the same tokens, text and ends; the logprob sums to float rounding."""
    assert [g[:4] + g[5:] for g in got] == [w[:4] + w[5:] for w in want]
    assert [g[4] for g in got] == pytest.approx([w[4] for w in want], rel=1e-5)


def test_plain_batch_equals_the_general_paths(llm: LLM) -> None:
    reasons = set()
    for params in (PLAIN, PLAIN[:3] + STOPPING):
        fast = [_final(o) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        assert llm.engine.runner.batch.num_special == 0
        # one request that is not plain (logprobs) in the batch: every step takes the general loop
        mixed = llm.generate([*PROMPTS, PROMPT], [*params, SamplingParams(max_tokens=30, temperature=0.0, logprobs=1)], use_tqdm=False)
        _same([_final(o) for o in mixed[:-1]], fast)
        assert _streamed(llm, params) == fast  # the same batch: bit for bit
        _same([_final(llm.generate([p], sp, use_tqdm=False)[0]) for p, sp in zip(PROMPTS, params)], fast)
        reasons.update(f[2] for f in fast)
    assert reasons == {"stop", "length"}  # the stop strings ended some
    _assert_idle(llm)
