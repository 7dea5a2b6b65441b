"""The scheduler's side of multi-step decoding (`num_scheduler_steps`, docs/MULTISTEP.md): KV slots
reserved ahead all or nothing, passes capped at the tokens a request has left, one pass beside a
request that cannot take several. The engine-level checks are in tests/model/test_multistep.py."""

from __future__ import annotations

from dataclasses import replace

from sched_helpers import LOGPROB, assert_idle, make_req, make_sched, prompt_of

from inflight.core.scheduler import Scheduler
from inflight.outputs import ModelRunnerOutput, SampledToken
from inflight.request import FinishReason, Request


def _multistep_sched(num_blocks: int) -> Scheduler:
    sched = make_sched(num_blocks=num_blocks, block_size=4, budget=32, max_seqs=4)
    sched.config = replace(sched.config, num_scheduler_steps=4)
    return sched


def _multistep_step(sched: Scheduler, reqs: list[Request]) -> tuple[int, dict[str, int]]:
    """One schedule + a runner output of num_steps tokens a piece: (num_steps, blocks per live request)."""
    out = sched.schedule(now=0.0)
    blocks = {r.request_id: len(r.block_ids) for r in reqs if not r.is_finished}
    sampled = {sr.request_id: [SampledToken(11, LOGPROB)] * out.num_steps for sr in out.scheduled if sr.samples}
    sched.update_from_output(out, ModelRunnerOutput(sampled=sampled))
    return out.num_steps, blocks


def test_multistep_reserves_slots_ahead_and_caps_at_max_tokens() -> None:
    """num_scheduler_steps 4 (docs/MULTISTEP.md): a step of plain greedy decodes runs 4 passes with
    their KV blocks reserved, at most the tokens each request has left."""
    sched = _multistep_sched(8)
    a = make_req("a", prompt_of(3), max_tokens=7, temperature=0.0)
    b = make_req("b", prompt_of(4, 1), max_tokens=9, temperature=0.0)
    sched.add_request(a)
    sched.add_request(b)
    assert _multistep_step(sched, [a, b]) == (1, {"a": 1, "b": 1})  # the prompts: one pass
    # 4 passes write positions 3..6 of a and 4..7 of b: a second block each, reserved now
    assert _multistep_step(sched, [a, b]) == (4, {"a": 2, "b": 2})
    assert (a.num_output_tokens, a.num_computed_tokens, b.num_computed_tokens) == (5, 7, 8)
    assert _multistep_step(sched, [a, b]) == (2, {"a": 3, "b": 3})  # a has 2 tokens left: 2 passes
    assert a.is_finished and a.finish_reason is FinishReason.LENGTH and a.num_output_tokens == 7
    assert _multistep_step(sched, [a, b]) == (2, {"b": 3})  # b's last 2 tokens, in its third block
    assert b.is_finished and b.num_output_tokens == 9 and sched.num_preemptions == 0
    assert_idle(sched)


def test_multistep_runs_one_pass_beside_another_request_or_without_room() -> None:
    """A sampled request in the step: one pass, then N once the greedy one is alone. A pool without
    blocks for every request's passes: one pass and nothing reserved (a block taken for one
    request's passes would leave the next step's pieces short: they would preempt)."""
    sched = _multistep_sched(16)
    a = make_req("a", prompt_of(3), max_tokens=8, temperature=0.0)
    c = make_req("c", prompt_of(2, 2), max_tokens=3, temperature=0.7)
    sched.add_request(c)
    sched.add_request(a)
    passes = [_multistep_step(sched, [a, c])[0] for _ in range(4)]
    assert passes == [1, 1, 1, 4] and c.is_finished and a.num_output_tokens == 7
    tight = _multistep_sched(3)
    a, b = make_req("a", prompt_of(3), max_tokens=8, temperature=0.0), make_req("b", prompt_of(3, 1), max_tokens=8, temperature=0.0)
    tight.add_request(a)
    tight.add_request(b)
    assert _multistep_step(tight, [a, b]) == (1, {"a": 1, "b": 1})
    # 4 passes each need a second block (positions 4..6): 2 blocks, 1 free
    assert _multistep_step(tight, [a, b]) == (1, {"a": 1, "b": 1})
    assert tight.kv.pool.num_free_blocks == 1 and tight.num_preemptions == 0
