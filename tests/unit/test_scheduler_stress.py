"""Scheduler stress and prefix-cache accounting, driven by the fake runner of sched_helpers.

Batching, chunking and preemption must never change what a request generates; the prefix
cache must count every looked-up token and serve only blocks that hold the exact prefix.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
from sched_helpers import (
    EOS,
    FakeRunner,
    assert_idle,
    expected_tokens,
    make_recording,
    make_req,
    make_sched,
    next_token,
    prompt_of,
    run_until_idle,
    solo,
    step_once,
)

from inflight.request import FinishReason, Request


# ------------------------------------------------------------------------------- prefix cache
@pytest.mark.parametrize("pipelined", [False, True], ids=["sync", "async"])
def test_preemption_with_prefix_caching_and_chunks_reproduces_solo_outputs(pipelined: bool) -> None:
    shared = prompt_of(12, 9)
    sched = make_recording(num_blocks=12, budget=10, max_seqs=4)
    reqs = [
        make_req(
            f"r{i}",
            shared + prompt_of(3 + i, 20 + i),
            max_tokens=20,
            priority=1 + i % 3,
            arrival=float(i),
        )
        for i in range(5)
    ]
    for r in reqs:
        sched.add_request(r)
    run = run_until_idle(sched, max_steps=400, pipelined=pipelined)
    assert sched.num_preemptions > 0
    for victim, running in sched.victims:
        assert victim.sort_key() == max(r.sort_key() for r in running)
    for r in reqs:
        assert run.outputs[r.request_id] == solo(r)


def test_second_request_skips_the_cached_prefix() -> None:
    shared = prompt_of(12, 5)
    sched = make_sched(num_blocks=32, budget=64)
    a = make_req("a", shared + [11, 12], max_tokens=3, arrival=0.0)
    sched.add_request(a)
    runner = FakeRunner(sched)
    run_until_idle(sched, runner=runner)
    b = make_req("b", shared + [13, 14, 15], max_tokens=3, arrival=1.0)
    sched.add_request(b)
    run = run_until_idle(sched, runner=runner)
    assert run.logs[0].scheduled == [("b", 12, 3, True)]
    assert b.metrics.num_cached_tokens == 12
    assert b.output_token_ids == expected_tokens(b.prompt_token_ids, 3)


def test_prefix_cache_hit_rate_counts_every_token_looked_up() -> None:
    # a short prompt that generated many tokens, preempted, is recomputed mostly from the cache
    sched = make_sched(num_blocks=16, block_size=4, budget=64, max_seqs=1)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    a = make_req("a", prompt_of(4, 1), max_tokens=40, priority=5, arrival=0.0)
    sched.add_request(a)
    for step in range(37):
        step_once(sched, runner, step, 0.0, seen)
    assert a.num_tokens == 41
    b = make_req("b", prompt_of(4, 2), max_tokens=1, priority=1, arrival=1.0)
    sched.add_request(b)
    log = step_once(sched, runner, 37, 0.0, seen)
    assert log.preempted == ["a"] and log.scheduled == [("b", 0, 4, True)]
    log = step_once(sched, runner, 38, 0.0, seen)
    assert log.scheduled == [("a", 40, 1, True)]  # 10 blocks served from the cache
    pool = sched.kv.pool
    assert pool.num_hit_tokens == 40
    # queries: a's 4-token prompt, b's 4 tokens, then a's 41 tokens on re-admission
    assert pool.num_query_tokens == 4 + 4 + 41
    run_until_idle(sched, runner=runner)
    assert a.output_token_ids == expected_tokens(a.prompt_token_ids, 40)
    assert a.metrics.num_cached_tokens == 0  # set on first admission only (a had no hits then)


def test_an_id_reused_while_its_last_row_runs_gets_none_of_its_tokens() -> None:
    """Async scheduling: "a" finishes when step N's output is read, while step N+1 (sent ahead)
    still runs a row of it; a new request "a" added right then must not take that row's token."""
    sched = make_sched()
    runner = FakeRunner(sched)
    first = make_req("a", prompt_of(5, 1), max_tokens=6)
    runner.eos_at["a"] = {2}  # an EOS: unknown ahead, so the next step has a row of it
    sched.add_request(first)
    second = make_req("a", prompt_of(7, 2), max_tokens=4)
    seen: dict[str, Request] = {}
    inflight: list = []
    reused = False
    for step in range(50):
        if not sched.has_unfinished() and not inflight:
            break
        log = step_once(sched, runner, step, step * 0.001, seen, inflight)
        if "a" in log.finished and not reused:
            assert any(sr.request_id == "a" for sr in inflight[0].scheduled)  # its extra row runs
            runner.eos_at["a"] = set()
            sched.add_request(second)
            reused = True
    assert reused and first.output_token_ids == [*expected_tokens(first.prompt_token_ids, 1), EOS]
    assert second.output_token_ids == expected_tokens(second.prompt_token_ids, 4)
    assert second.is_finished and second.finish_reason == FinishReason.LENGTH


# ------------------------------------------------------------------------------- stress
@pytest.mark.parametrize(
    "seed,num_blocks,budget,max_seqs,chunked,caching,pipelined",
    [
        (1, 22, 16, 6, True, True, False),
        (2, 30, 40, 12, True, True, False),
        (3, 24, 96, 4, False, True, False),
        (4, 22, 12, 3, True, False, False),
        (5, 20, 8, 8, True, True, False),  # the pool holds exactly one 80-token request
        # async scheduling: step N+1 scheduled before step N's tokens are known
        (6, 22, 16, 6, True, True, True),
        (7, 24, 96, 4, False, True, True),
        (8, 20, 8, 8, True, True, True),
    ],
)
def test_random_stress(
    seed: int, num_blocks: int, budget: int, max_seqs: int, chunked: bool, caching: bool, pipelined: bool
) -> None:
    rng = random.Random(seed)
    bs = 4
    sched = make_sched(num_blocks, bs, budget, max_seqs, chunked, caching)
    runner = FakeRunner(sched)
    prefixes = [prompt_of(rng.randrange(4, 24), 100 + i) for i in range(4)]
    pending: list[Request] = []
    specs: dict[str, dict] = {}
    for i in range(200):
        n = rng.randint(1, 60)
        prompt = prompt_of(n, 1000 * seed + i)
        if rng.random() < 0.5:
            prefix = rng.choice(prefixes)
            prompt = (prefix + prompt)[:n]
        max_tokens = rng.randint(1, 20)  # lone worst case 80 tokens = 20 blocks <= pool
        rid = f"q{i}"
        eos_at = {rng.randint(1, 20)} if rng.random() < 0.3 else set()
        min_tokens = rng.randint(0, max_tokens) if rng.random() < 0.2 else 0
        timeout_s = rng.uniform(0.01, 0.5) if rng.random() < 0.05 else 600.0
        priority = rng.randint(1, 5)
        # arrival ties (3 requests per instant) exercise the tie-breaks of the worst-running pick
        req = make_req(
            rid, prompt, max_tokens, priority, float(i // 3), timeout_s, min_tokens=min_tokens
        )
        runner.eos_at[rid] = eos_at
        specs[rid] = {"eos_at": eos_at, "timeout": timeout_s < 600}
        pending.append(req)

    seen: dict[str, Request] = {}
    finished: Counter[str] = Counter()
    aborted: set[str] = set()
    dt = 0.01
    step = 0
    max_steps = 6000
    inflight: list | None = [] if pipelined else None
    while pending or sched.has_unfinished() or inflight:
        assert step < max_steps, f"no progress: {sched.running} {sched.waiting}"
        now = step * dt
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
            if pending:
                req = pending.pop(0)
                # arrival_time is its index; make the deadline relative to now instead
                inputs = req.inputs
                req.inputs = dataclasses.replace(inputs, timeout_s=now + inputs.timeout_s - inputs.arrival_time)
                sched.add_request(req)
        if sched.requests and rng.random() < 0.03:
            rid = rng.choice(sorted(sched.requests))
            sched.abort(rid)
            aborted.add(rid)
        log = step_once(sched, runner, step, now, seen, inflight)
        for rid in log.finished_ids + log.finished:
            finished[rid] += 1
        scheduled_ids = {s[0] for s in log.scheduled}
        assert not scheduled_ids & set(log.finished_ids)
        pool = sched.kv.pool
        assert pool.num_hit_tokens <= pool.num_query_tokens  # a hit rate, at most 100%
        step += 1

    assert_idle(sched)
    assert set(finished) == set(specs) and set(finished.values()) == {1}
    reasons = Counter(seen[rid].finish_reason for rid in specs)
    assert reasons[FinishReason.LENGTH] > 0 and reasons[FinishReason.STOP] > 0
    for rid, req in seen.items():
        assert req.is_finished and req.block_ids == []
        if req.finish_reason in (FinishReason.ABORT,):
            assert rid in aborted
        elif req.finish_reason == FinishReason.TIMEOUT:
            assert specs[rid]["timeout"]
        else:
            # batching and preemption must not change what a request generates
            expect, history = [], list(req.prompt_token_ids)
            for k in range(1, req.max_tokens + 1):
                t = EOS if k in specs[rid]["eos_at"] else next_token(history)
                history.append(t)
                expect.append(t)
                if t == EOS and k >= req.params.min_tokens:
                    break
            assert req.output_token_ids == expect, rid
            stopped = expect[-1] == EOS and len(expect) >= req.params.min_tokens
            want = FinishReason.STOP if stopped else FinishReason.LENGTH
            assert req.finish_reason == want, rid
    assert (sched.kv.pool.num_hit_tokens > 0) is caching
    assert sched.num_preemptions > 0
