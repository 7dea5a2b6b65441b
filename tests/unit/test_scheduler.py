"""Scheduler driven by a fake model runner: budget, priority, preemption, timeouts, stops.

The fake runner and the step/pool checks live in sched_helpers.py; the randomized stress
test and the prefix-cache accounting tests are in test_scheduler_stress.py.
"""

from __future__ import annotations

import pytest
from sched_helpers import (
    EOS,
    LOGPROB,
    FakeRunner,
    assert_idle,
    check_pool,
    expected_tokens,
    make_recording,
    make_req,
    make_sched,
    prompt_of,
    run_one,
    run_until_idle,
    solo,
    step_once,
)

from inflight.request import FinishReason, Request, RequestStatus


# ------------------------------------------------------------------------------- token budget
def test_long_prompt_is_chunked_by_the_budget_and_samples_on_the_last_chunk() -> None:
    sched = make_sched(num_blocks=64, block_size=4, budget=32, max_seqs=4)
    req = make_req("r", prompt_of(100), max_tokens=3)
    sched.add_request(req)
    run = run_until_idle(sched)
    pieces = [log.scheduled for log in run.logs]
    assert pieces == [
        [("r", 0, 32, False)],
        [("r", 32, 32, False)],
        [("r", 64, 32, False)],
        [("r", 96, 4, True)],
        [("r", 100, 1, True)],
        [("r", 101, 1, True)],
    ]
    assert [log.sampled for log in run.logs[:3]] == [{}, {}, {}]
    assert run.outputs["r"] == expected_tokens(req.prompt_token_ids, 3)
    assert req.finish_reason == FinishReason.LENGTH
    assert req.cumulative_logprob == pytest.approx(3 * LOGPROB)
    assert req.metrics.num_preemptions == 0


def test_chunking_disabled_waits_for_a_budget_that_fits_the_whole_prompt() -> None:
    sched = make_sched(num_blocks=64, budget=32, max_seqs=4, chunked=False)
    a = make_req("a", prompt_of(20, 1), max_tokens=4, arrival=0.0)
    b = make_req("b", prompt_of(20, 2), max_tokens=4, arrival=1.0)
    sched.add_request(a)
    sched.add_request(b)
    run = run_until_idle(sched)
    assert run.logs[0].scheduled == [("a", 0, 20, True)]  # b's 20 don't fit in the 12 left
    assert run.logs[1].scheduled == [("a", 20, 1, True), ("b", 0, 20, True)]
    for log in run.logs:
        assert all(n == 1 or start == 0 for _, start, n, _ in log.scheduled)  # no chunks
    assert run.outputs["a"] == expected_tokens(a.prompt_token_ids, 4)
    assert run.outputs["b"] == expected_tokens(b.prompt_token_ids, 4)


def test_running_decodes_are_scheduled_before_new_prefill_chunks() -> None:
    sched = make_sched(num_blocks=64, block_size=4, budget=32, max_seqs=4)
    a = make_req("a", prompt_of(10, 1), max_tokens=6, arrival=0.0)
    c = make_req("c", prompt_of(12, 3), max_tokens=6, arrival=0.5)
    sched.add_request(a)
    sched.add_request(c)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    first = step_once(sched, runner, 0, 0.0, seen)
    assert first.scheduled == [("a", 0, 10, True), ("c", 0, 12, True)]
    # a better-priority long prompt arrives while a and c decode: decodes go first
    b = make_req("b", prompt_of(100, 2), max_tokens=2, priority=1, arrival=1.0)
    sched.add_request(b)
    second = step_once(sched, runner, 1, 0.0, seen)
    assert second.scheduled == [("a", 10, 1, True), ("c", 12, 1, True), ("b", 0, 30, False)]
    third = step_once(sched, runner, 2, 0.0, seen)
    # b is running now and ranks first: its chunk takes the whole budget, a and c skip a step
    assert third.scheduled == [("b", 30, 32, False)]
    run = run_until_idle(sched, runner=runner)
    for r in (a, b, c):
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)
    assert run.logs  # ran to completion


def test_max_num_seqs_caps_running_requests() -> None:
    sched = make_sched(num_blocks=64, budget=64, max_seqs=2)
    reqs = [make_req(f"r{i}", prompt_of(6, i), max_tokens=3, arrival=float(i)) for i in range(5)]
    for r in reqs:
        sched.add_request(r)
    run = run_until_idle(sched)
    for log in run.logs:
        assert len(log.scheduled) <= 2
    assert [s[0] for s in run.logs[0].scheduled] == ["r0", "r1"]
    starts = {
        rid: min(log.step for log in run.logs for s in log.scheduled if s[0] == rid)
        for rid in run.outputs
    }
    assert starts["r0"] == starts["r1"] < starts["r2"] == starts["r3"] < starts["r4"]
    for r in reqs:
        assert run.outputs[r.request_id] == expected_tokens(r.prompt_token_ids, 3)
    assert all(r.metrics.num_preemptions == 0 for r in reqs)


# ------------------------------------------------------------------------------- batch-size caps
def _steps_of(run, rid: str) -> list:  # type: ignore[no-untyped-def, type-arg]
    return [log for log in run.logs if any(s[0] == rid for s in log.scheduled)]


def test_batch_size_cap_bounds_every_step_and_holds_the_queue_behind_it() -> None:
    """MindIE batch_size: admitted once the running set drains below the cap, no later arrival
    overtakes it meanwhile, and every step it runs in has at most `cap` rows."""
    sched = make_sched(num_blocks=64, budget=64, max_seqs=8)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    busy = [
        make_req(f"r{i}", prompt_of(4, i), max_tokens=4 + 3 * i, arrival=float(i)) for i in range(4)
    ]
    for r in busy:
        sched.add_request(r)
    logs = [step_once(sched, runner, 0, 0.0, seen)]
    assert len(logs[0].scheduled) == 4  # no cap yet: all four together
    capped = make_req("cap", prompt_of(4, 7), max_tokens=5, arrival=10.0, max_batch_size=2)
    later = make_req("later", prompt_of(4, 8), max_tokens=3, arrival=11.0)
    sched.add_request(capped)
    sched.add_request(later)
    run = run_until_idle(sched, runner=runner)
    first = _steps_of(run, "cap")[0].step
    assert all(
        len(log.scheduled) == 2 for log in _steps_of(run, "cap")[:1]
    )  # with the last busy one
    assert all(len(log.scheduled) <= 2 for log in _steps_of(run, "cap"))
    assert all(
        log.step > first for log in _steps_of(run, "later")
    )  # held behind it, then capped too
    assert all(len(log.scheduled) > 2 for log in run.logs[:1])  # the drain: 4 -> 3 -> 2 -> 1 rows
    for r in [*busy, capped, later]:
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)
        assert r.metrics.num_preemptions == 0


def test_batch_size_one_at_top_priority_preempts_worse_requests_and_runs_alone() -> None:
    sched = make_sched(num_blocks=64, budget=64, max_seqs=8)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    busy = [make_req(f"r{i}", prompt_of(4, i), max_tokens=12, arrival=float(i)) for i in range(3)]
    better = make_req("better", prompt_of(4, 5), max_tokens=4, priority=1, arrival=0.5)
    for r in [*busy, better]:
        sched.add_request(r)
    step_once(sched, runner, 0, 0.0, seen)
    alone = make_req(
        "alone", prompt_of(4, 9), max_tokens=4, priority=2, arrival=20.0, max_batch_size=1
    )
    sched.add_request(alone)
    log = step_once(sched, runner, 1, 0.0, seen)
    # the three worse requests give up their seats; `better` (priority 1) is not worse: alone waits
    assert log.preempted == [] and "alone" not in [s[0] for s in log.scheduled]
    run = run_until_idle(sched, runner=runner)
    steps = _steps_of(run, "alone")
    assert steps and all([s[0] for s in log.scheduled] == ["alone"] for log in steps)
    assert sorted(p for log in run.logs for p in log.preempted) == ["r0", "r1", "r2"]
    for r in [*busy, better, alone]:
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)


def test_running_capped_request_yields_to_a_better_one_and_blocks_equal_ones() -> None:
    sched = make_sched(num_blocks=64, budget=64, max_seqs=8)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    capped = make_req(
        "cap", prompt_of(4, 1), max_tokens=8, priority=3, arrival=0.0, max_batch_size=1
    )
    sched.add_request(capped)
    step_once(sched, runner, 0, 0.0, seen)
    equal = make_req("equal", prompt_of(4, 2), max_tokens=3, priority=3, arrival=1.0)
    sched.add_request(equal)
    log = step_once(sched, runner, 1, 0.0, seen)
    assert log.scheduled == [("cap", 4, 1, True)]  # equal waits: the running batch is capped at 1
    better = make_req("better", prompt_of(4, 3), max_tokens=3, priority=1, arrival=2.0)
    sched.add_request(better)
    log = step_once(sched, runner, 2, 0.0, seen)
    assert log.preempted == ["cap"] and log.scheduled == [("better", 0, 4, True)]
    run = run_until_idle(sched, runner=runner)
    assert all(len(log.scheduled) == 1 for log in _steps_of(run, "cap"))
    done = {r.request_id: r.metrics.finished_time for r in (capped, equal, better)}
    assert done["better"] < done["cap"] < done["equal"]  # type: ignore[operator]
    for r in (capped, equal, better):
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)


# ------------------------------------------------------------------------------- priority
def test_waiting_requests_are_admitted_by_priority_then_arrival() -> None:
    sched = make_sched(num_blocks=64, budget=64, max_seqs=1)
    order = [("late5", 5, 3.0), ("early5", 5, 1.0), ("p1", 1, 4.0), ("p3", 3, 2.0), ("p3b", 3, 0.5)]
    for i, (rid, prio, arrival) in enumerate(order):
        req = make_req(rid, prompt_of(5, i), max_tokens=2, priority=prio, arrival=arrival)
        sched.add_request(req)
    run = run_until_idle(sched)
    admitted = []
    for log in run.logs:
        for rid, start, _, _ in log.scheduled:
            if start == 0:
                admitted.append(rid)
    assert admitted == ["p1", "p3b", "p3", "early5", "late5"]
    assert sum(log.preempted != [] for log in run.logs) == 0


def test_later_high_priority_request_gets_the_only_room() -> None:
    # budget 16 without chunking: only one 16-token prompt fits per step
    sched = make_sched(num_blocks=64, budget=16, max_seqs=4, chunked=False)
    low = make_req("low", prompt_of(16, 1), max_tokens=2, priority=5, arrival=0.0)
    high = make_req("high", prompt_of(16, 2), max_tokens=2, priority=1, arrival=9.0)
    sched.add_request(low)
    sched.add_request(high)
    run = run_until_idle(sched)
    assert run.logs[0].scheduled == [("high", 0, 16, True)]
    assert run.logs[1].scheduled == [("high", 16, 1, True)]  # 15 tokens left: low must wait
    assert run.logs[2].scheduled == [("low", 0, 16, True)]
    assert run.outputs["high"] == expected_tokens(high.prompt_token_ids, 2)
    assert run.outputs["low"] == expected_tokens(low.prompt_token_ids, 2)


def test_higher_priority_arrival_preempts_for_a_seat_but_equal_priority_waits() -> None:
    # budget 6: exactly one 6-token prompt per step
    sched = make_sched(num_blocks=64, budget=6, max_seqs=1)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    low = make_req("low", prompt_of(6, 1), max_tokens=5, priority=3, arrival=0.0)
    sched.add_request(low)
    step_once(sched, runner, 0, 0.0, seen)
    same = make_req("same", prompt_of(6, 2), max_tokens=2, priority=3, arrival=1.0)
    twin = make_req("twin", prompt_of(6, 4), max_tokens=2, priority=3, arrival=0.0)  # equal key
    sched.add_request(same)
    sched.add_request(twin)
    log = step_once(sched, runner, 1, 0.0, seen)
    assert log.preempted == [] and log.scheduled == [("low", 6, 1, True)]
    high = make_req("high", prompt_of(6, 3), max_tokens=2, priority=2, arrival=2.0)
    sched.add_request(high)
    log = step_once(sched, runner, 2, 0.0, seen)
    # low's decode was scheduled first, then low lost its seat to high and gave its
    # token back to the budget: high's 6-token prompt runs in one piece
    assert log.preempted == ["low"]
    assert log.scheduled == [("high", 0, 6, True)]
    assert low.status == RequestStatus.PREEMPTED and low.metrics.num_preemptions == 1
    run_until_idle(sched, runner=runner)
    for r in (low, same, twin, high):
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)
    assert twin.metrics.num_preemptions == 0 and same.metrics.num_preemptions == 0
    assert low.metrics.num_preemptions == 1  # nobody preempts an equal or better key
    assert high.metrics.finished_time <= same.metrics.finished_time  # type: ignore[operator]
    assert low.metrics.finished_time <= same.metrics.finished_time  # type: ignore[operator]


# ------------------------------------------------------------------------------- preemption
def test_pool_pressure_preempts_the_worst_running_request_and_it_resumes_identically() -> None:
    # 6 blocks of 4 tokens; each request grows to 4 + 12 = 16 tokens (4 blocks): one fits alone
    sched = make_recording(num_blocks=6)
    reqs = [
        make_req("a", prompt_of(4, 1), max_tokens=12, priority=5, arrival=0.0),
        make_req("b", prompt_of(4, 2), max_tokens=12, priority=2, arrival=1.0),
        make_req("c", prompt_of(4, 3), max_tokens=12, priority=5, arrival=2.0),
    ]
    for r in reqs:
        sched.add_request(r)
    run = run_until_idle(sched, max_steps=200)
    assert run.logs[0].scheduled == [("b", 0, 4, True), ("a", 0, 4, True), ("c", 0, 4, True)]
    assert sched.victims, "the pool is too small for three: something must be preempted"
    for victim, running in sched.victims:
        assert victim in running
        assert victim.sort_key() == max(r.sort_key() for r in running)
    first_preempted = next(log for log in run.logs if log.preempted)
    assert first_preempted.preempted[0] == "c"  # priority 5 and the latest arrival
    assert reqs[1].metrics.num_preemptions == 0  # the priority-2 request is never the victim
    assert reqs[2].metrics.num_preemptions >= 1
    assert sched.num_preemptions == sum(r.metrics.num_preemptions for r in reqs)
    assert sum(len(log.preempted) for log in run.logs) == sched.num_preemptions
    for r in reqs:
        assert r.finish_reason == FinishReason.LENGTH
        assert run.outputs[r.request_id] == solo(r)
        assert run.outputs[r.request_id] == expected_tokens(r.prompt_token_ids, 12)
    # b (best) finished first
    finish_times = [r.metrics.finished_time for r in reqs]
    assert reqs[1].metrics.finished_time == min(finish_times)  # type: ignore[type-var]


def test_preempted_request_blocks_are_freed_in_the_same_step() -> None:
    sched = make_recording(num_blocks=6)
    a = make_req("a", prompt_of(8, 1), max_tokens=8, priority=1, arrival=0.0)  # grows to 4 blocks
    b = make_req("b", prompt_of(8, 2), max_tokens=8, priority=5, arrival=1.0)
    sched.add_request(a)
    sched.add_request(b)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    for step in range(20):
        held_b = list(b.block_ids)
        log = step_once(sched, runner, step, 0.0, seen)
        if log.preempted:
            break
    else:
        pytest.fail("no preemption")
    assert log.preempted == ["b"] and held_b
    assert b.block_ids == [] and b.num_computed_tokens == 0
    assert b.status == RequestStatus.PREEMPTED and b in sched.waiting
    assert all(sched.kv.pool.blocks[x].ref_cnt == 0 for x in held_b if x not in a.block_ids)
    assert "b" not in [s[0] for s in log.scheduled]
    run_until_idle(sched, runner=runner)
    assert a.output_token_ids == expected_tokens(a.prompt_token_ids, 8)
    assert b.output_token_ids == expected_tokens(b.prompt_token_ids, 8)
    assert b.metrics.num_preemptions >= 1 and a.metrics.num_preemptions == 0


def test_waiting_request_only_preempts_strictly_worse_running_requests() -> None:
    sched = make_recording(num_blocks=6)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    big = make_req("big", prompt_of(20, 1), max_tokens=4, priority=3, arrival=0.0)  # 5..6 blocks
    sched.add_request(big)
    step_once(sched, runner, 0, 0.0, seen)
    assert len(big.block_ids) == 5

    equal = make_req("equal", prompt_of(8, 2), max_tokens=1, priority=3, arrival=1.0)
    worse = make_req("worse", prompt_of(8, 3), max_tokens=1, priority=4, arrival=-5.0)
    sched.add_request(equal)
    sched.add_request(worse)
    log = step_once(sched, runner, 1, 0.0, seen)
    assert log.preempted == [] and log.scheduled == [("big", 20, 1, True)]
    assert big.status == RequestStatus.RUNNING and len(big.block_ids) == 6

    better = make_req("better", prompt_of(8, 4), max_tokens=1, priority=2, arrival=2.0)
    sched.add_request(better)
    log = step_once(sched, runner, 2, 0.0, seen)
    assert log.preempted == ["big"]  # its decode was scheduled first, then taken back
    assert log.scheduled == [("better", 0, 8, True), ("equal", 0, 8, True), ("worse", 0, 8, True)]
    assert big.status == RequestStatus.PREEMPTED and big.block_ids == []
    assert all(victim is big for victim, _ in sched.victims)
    run_until_idle(sched, runner=runner)
    for r in (big, equal, worse, better):
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, r.max_tokens)
    assert worse.metrics.num_preemptions == 0 and equal.metrics.num_preemptions == 0


# ------------------------------------------------------------------------------- timeout / abort
def test_request_past_deadline_times_out_in_the_same_schedule_call() -> None:
    sched = make_sched(num_blocks=16)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    stale = make_req("stale", prompt_of(5), arrival=0.0, timeout_s=1.0)
    fresh = make_req("fresh", prompt_of(5, 1), arrival=0.0, timeout_s=100.0, max_tokens=3)
    sched.add_request(stale)
    sched.add_request(fresh)
    log = step_once(sched, runner, 0, 1.0, seen)  # now == deadline
    assert log.finished_ids == ["stale"]
    assert stale.finish_reason == FinishReason.TIMEOUT and stale.output_token_ids == []
    assert [s[0] for s in log.scheduled] == ["fresh"]
    run_until_idle(sched, runner=runner, t0=2.0)
    assert fresh.finish_reason == FinishReason.LENGTH


def test_running_request_times_out_and_frees_its_blocks_immediately() -> None:
    sched = make_sched(num_blocks=16, budget=8)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    r = make_req("r", prompt_of(20), arrival=10.0, timeout_s=5.0, max_tokens=8)
    other = make_req("other", prompt_of(6, 1), arrival=10.0, max_tokens=4)
    sched.add_request(r)
    sched.add_request(other)
    step_once(sched, runner, 0, 11.0, seen)
    assert len(r.block_ids) == 2 and other.block_ids == []  # budget 8: r's first chunk only
    free_before = sched.kv.pool.num_free_blocks
    out = sched.schedule(now=15.0)
    assert out.finished_ids == ["r"] and r.finish_reason == FinishReason.TIMEOUT
    assert "r" not in [s.request_id for s in out.scheduled]
    assert r.block_ids == [] and "r" not in sched.requests
    assert sched.kv.pool.num_free_blocks == free_before + 2 - len(other.block_ids)
    check_pool(sched)
    sched.update_from_output(out, runner(out, sched.requests))
    run_until_idle(sched, runner=runner, t0=15.0)
    assert other.output_token_ids == expected_tokens(other.prompt_token_ids, 4)


def test_abort_mid_prefill_frees_blocks_and_leaves_others_alone() -> None:
    sched = make_sched(num_blocks=64, block_size=4, budget=32, max_seqs=4)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    victim = make_req("victim", prompt_of(100), max_tokens=4, priority=1, arrival=0.0)
    other = make_req("other", prompt_of(10, 1), max_tokens=6, priority=5, arrival=1.0)
    sched.add_request(victim)
    sched.add_request(other)
    log = step_once(sched, runner, 0, 0.0, seen)
    assert log.scheduled == [("victim", 0, 32, False)]
    assert victim.num_computed_tokens == 32 and len(victim.block_ids) == 8
    sched.abort("victim")
    sched.abort("no-such-request")  # ignored
    assert victim.status == RequestStatus.RUNNING  # finished at the next step, not now
    log = step_once(sched, runner, 1, 0.0, seen)
    assert log.finished_ids == ["victim"]
    assert victim.finish_reason == FinishReason.ABORT and victim.output_token_ids == []
    assert victim.block_ids == []
    assert log.scheduled == [("other", 0, 10, True)]
    assert sched.kv.pool.num_free_blocks == 64 - len(other.block_ids)
    run_until_idle(sched, runner=runner)
    assert other.output_token_ids == solo(other)


def test_abort_of_waiting_and_decoding_requests_with_custom_reason() -> None:
    sched = make_sched(num_blocks=64, budget=64, max_seqs=1)
    runner = FakeRunner(sched)
    seen: dict[str, Request] = {}
    a = make_req("a", prompt_of(5), max_tokens=10, arrival=0.0)
    w = make_req("w", prompt_of(5, 1), max_tokens=10, arrival=1.0)
    sched.add_request(a)
    sched.add_request(w)
    step_once(sched, runner, 0, 0.0, seen)
    step_once(sched, runner, 1, 0.0, seen)
    assert w.status == RequestStatus.WAITING
    sched.abort("w")
    sched.abort("a", FinishReason.TIMEOUT)
    log = step_once(sched, runner, 2, 0.0, seen)
    assert sorted(log.finished_ids) == ["a", "w"]
    assert w.finish_reason == FinishReason.ABORT and a.finish_reason == FinishReason.TIMEOUT
    assert a.output_token_ids == expected_tokens(a.prompt_token_ids, 2)
    assert log.scheduled == []
    assert_idle(sched)
    with pytest.raises(ValueError):
        sched.add_request(make_req("x", [1]))
        sched.add_request(make_req("x", [1]))


# ------------------------------------------------------------------------------- stop checks
def test_eos_finishes_with_stop() -> None:
    r = run_one(make_req("r", prompt_of(5), max_tokens=10), eos_at={3})
    expect = expected_tokens(r.prompt_token_ids, 2) + [EOS]
    assert r.output_token_ids == expect
    assert r.finish_reason == FinishReason.STOP and r.stop_reason is None


def test_ignore_eos_keeps_generating_to_max_tokens() -> None:
    r = run_one(make_req("r", prompt_of(5), max_tokens=6, ignore_eos=True), eos_at={2, 4})
    assert r.output_token_ids.count(EOS) == 2 and len(r.output_token_ids) == 6
    assert r.output_token_ids[1] == EOS and r.output_token_ids[3] == EOS
    assert r.finish_reason == FinishReason.LENGTH


def test_min_tokens_delays_the_eos_stop() -> None:
    # EOS at every position: the first min_tokens - 1 EOS are not stops
    r = run_one(make_req("r", prompt_of(5), max_tokens=10, min_tokens=4), eos_at=set(range(1, 11)))
    # The check is vLLM's (`num_output_tokens >= min_tokens` after appending): an EOS that is
    # the min_tokens-th token stops. SPEC §1 says EOS is *banned* before min_tokens new
    # tokens, which only the sampler can enforce.
    assert r.output_token_ids == [EOS] * 4
    assert r.finish_reason == FinishReason.STOP
    r = run_one(make_req("r", prompt_of(5), max_tokens=10, min_tokens=3), eos_at={1, 2, 5})
    assert len(r.output_token_ids) == 5 and r.output_token_ids[-1] == EOS
    assert r.finish_reason == FinishReason.STOP


def test_stop_token_id_finishes_with_stop_reason() -> None:
    prompt = prompt_of(5)
    plain = expected_tokens(prompt, 10)
    stop_tok = plain[3]
    assert stop_tok not in plain[:3]
    r = run_one(make_req("r", prompt, max_tokens=10, stop_token_ids=[stop_tok, 1]))
    assert r.output_token_ids == plain[:4]
    assert r.finish_reason == FinishReason.STOP and r.stop_reason == stop_tok
    # min_tokens also holds back stop token ids
    first = plain[0]
    again = next((j for j in range(1, 10) if plain[j] == first), None)
    r = run_one(make_req("r2", prompt, max_tokens=10, stop_token_ids=[first], min_tokens=2))
    if again is None:
        assert r.output_token_ids == plain and r.finish_reason == FinishReason.LENGTH
    else:
        assert r.output_token_ids == plain[: again + 1] and r.stop_reason == first
    # ignore_eos does not disable stop token ids
    r = run_one(make_req("r3", prompt, max_tokens=10, stop_token_ids=[stop_tok], ignore_eos=True))
    assert r.output_token_ids == plain[:4] and r.stop_reason == stop_tok


def test_end_id_overrides_model_eos() -> None:
    prompt = prompt_of(5)
    plain = expected_tokens(prompt, 10)
    r = run_one(make_req("r", prompt, max_tokens=10, end_id=plain[2]))
    assert r.output_token_ids == plain[:3]
    assert r.finish_reason == FinishReason.STOP and r.stop_reason is None
    # the model's EOS no longer stops a request that names its own end_id
    r = run_one(make_req("r2", prompt, max_tokens=5, end_id=7), eos_at={1})
    assert r.output_token_ids == [EOS] + expected_tokens(prompt + [EOS], 4)
    assert r.finish_reason == FinishReason.LENGTH


def test_max_tokens_finishes_with_length() -> None:
    for n in (1, 7):
        r = run_one(make_req("r", prompt_of(9), max_tokens=n))
        assert r.output_token_ids == expected_tokens(r.prompt_token_ids, n)
        assert r.finish_reason == FinishReason.LENGTH and r.stop_reason is None
        assert len(r.metrics.token_times) == n and r.metrics.first_token_time is not None


# ------------------------------------------------------------------------------- images
class _Item:
    """What the scheduler reads of a multimodal.inputs.MultiModalItem (core/ stays pure Python)."""

    def __init__(self, offset: int, length: int, digest: bytes) -> None:
        self.offset, self.length, self.hash = offset, length, digest

    @property
    def end(self) -> int:
        return self.offset + self.length


def test_images_are_encoded_within_the_step_budget_first_one_always() -> None:
    # budget 32: the first image (24 tokens) fits; the second (24) does not fit beside it, so the
    # piece stops before it; the next step starts with it; a 40-token image alone still runs
    sched = make_sched(num_blocks=64, block_size=4, budget=32, max_seqs=4, caching=False)
    req = make_req("r", prompt_of(100), max_tokens=2, mm_items=(_Item(2, 24, b"a"), _Item(30, 24, b"b"), _Item(56, 40, b"c")))
    sched.add_request(req)
    run = run_until_idle(sched)
    pieces = [log.scheduled for log in run.logs]
    assert pieces[:4] == [
        [("r", 0, 30, False)],
        [("r", 30, 26, False)],
        [("r", 56, 32, False)],
        [("r", 88, 12, True)],
    ]


def test_prefix_cache_key_carries_the_image_hash_from_its_block_on() -> None:
    sched = make_sched(num_blocks=64, block_size=4, budget=64, max_seqs=4)
    prompt = prompt_of(30)
    first = make_req("a", prompt, max_tokens=1, mm_items=(_Item(9, 8, b"cat"),))
    sched.add_request(first)
    run_until_idle(sched)
    same = make_req("b", prompt, max_tokens=1, arrival=1.0, mm_items=(_Item(9, 8, b"cat"),))
    other = make_req("c", prompt, max_tokens=1, arrival=2.0, mm_items=(_Item(9, 8, b"dog"),))
    assert len(sched.kv.find_cached_prefix(same)) == 7  # every full block but the last
    assert len(sched.kv.find_cached_prefix(other)) == 2  # the blocks before the image's block

