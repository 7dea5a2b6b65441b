"""Shared helpers for the scheduler tests: a fake model runner and step/pool checks.

The fake runner keeps a fake device KV cache (slot -> token id) and checks on every step
that the context a piece attends to holds exactly the request's tokens, so a wrong block
table or a wrong prefix-cache hit fails the test. Its sampled token is a function of the
token history only, so a request's output does not depend on batching or preemption.

A plain module (tests/unit has no __init__.py): pytest's default "prepend" import mode puts
tests/unit on sys.path, so the tests import it as `sched_helpers`.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from inflight.config import SchedulerConfig
from inflight.core.block_pool import hash_block
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.scheduler import Scheduler
from inflight.outputs import ModelRunnerOutput, SampledToken, SchedulerOutput
from inflight.request import Request, RequestStatus
from inflight.sampling_params import SamplingParams

EOS = 2
LOGPROB = -0.25


def next_token(history: list[int]) -> int:
    return sum(history) % 50 + 10


# ------------------------------------------------------------------------------- helpers
class FakeRunner:
    """SchedulerOutput -> ModelRunnerOutput, validating the step like a real runner would.

    Like the real runner it keeps its own copy of each request's tokens (from the message, then
    the tokens it samples itself) and samples from that copy, so it also runs steps that were
    scheduled before the previous step's output was read (async scheduling: `pipelined`)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.bs = sched.kv.block_size
        self.slots: dict[int, int] = {}  # fake device KV: slot -> token id written there
        self.eos_at: dict[str, set[int]] = {}  # request id -> 1-based output positions that are EOS
        self.tokens: dict[str, list[int]] = {}  # the runner's own copy of each request's tokens
        self.num_prompt: dict[str, int] = {}
        self.tables: dict[str, list[int]] = {}  # the runner's own block tables, from the pieces' deltas
        self.pipelined = False  # steps run one schedule behind: the Requests may be ahead of us

    def token_for(self, rid: str) -> int:
        tokens = self.tokens[rid]
        if len(tokens) - self.num_prompt[rid] + 1 in self.eos_at.get(rid, ()):
            return EOS
        return next_token(tokens)

    def __call__(self, out: SchedulerOutput, requests: dict[str, Request]) -> ModelRunnerOutput:
        pool = self.sched.kv.pool
        bs = self.bs
        sampled: dict[str, list[SampledToken]] = {}
        reused = {d.request_id for d in out.new_requests}  # an id freed and given to a new request
        for rid in out.freed_ids:
            assert rid not in requests or rid in reused, rid  # only finished requests are freed
            del self.tokens[rid]
            self.tables.pop(rid, None)
        for data in out.new_requests:
            assert data.request_id not in self.tokens, data.request_id  # sent once
            self.tokens[data.request_id] = list(data.token_ids)
            self.num_prompt[data.request_id] = data.num_prompt_tokens
        for sr in out.scheduled:
            tokens = self.tokens[sr.request_id]
            at = sr.new_tokens_from
            assert at <= len(tokens)
            tokens[at : at + len(sr.new_token_ids)] = sr.new_token_ids
            start, end = sr.num_computed_tokens, sr.num_computed_tokens + sr.num_tokens
            assert sr.num_tokens >= 1 and end <= len(tokens)
            assert sr.samples == (end == len(tokens))
            table = self.tables.setdefault(sr.request_id, [])
            assert sr.new_blocks_from <= len(table), sr  # a delta continues the table (or restarts it)
            table[sr.new_blocks_from :] = sr.new_block_ids
            assert len(table) >= -(-end // bs), sr
            req = requests.get(sr.request_id)
            if not self.pipelined:  # the message is self-contained: we hold what the scheduler holds
                assert req is not None and tokens == req.all_token_ids and table == req.block_ids
                assert end == req.num_computed_tokens  # counted when scheduled
            for p in range(start):  # the context must be this request's tokens
                slot = table[p // bs] * bs + p % bs
                assert self.slots.get(slot) == tokens[p], (sr.request_id, p)
            for p in range(start, end):
                b = table[p // bs]
                blk = pool.blocks[b]
                # never write into a block another request shares or the prefix cache serves
                # (pipelined: the scheduler may already have offered the block this step completes;
                # only later steps read it, and the context check above covers them)
                if not self.pipelined:
                    assert blk.ref_cnt == 1 and blk.block_hash is None, (sr.request_id, p, blk)
                self.slots[b * bs + p % bs] = tokens[p]
            if sr.samples:
                token = self.token_for(sr.request_id)
                sampled[sr.request_id] = [SampledToken(token, LOGPROB)]
                tokens.append(token)
        return ModelRunnerOutput(sampled=sampled)


@dataclass
class StepLog:
    step: int
    scheduled: list[tuple[str, int, int, bool]]  # (request id, start, num tokens, samples)
    num_batched_tokens: int
    preempted: list[str]
    finished_ids: list[str]  # finished inside schedule(): aborted / timed out
    sampled: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)  # finished by update_from_output


@dataclass
class Run:
    outputs: dict[str, list[int]]
    logs: list[StepLog]
    requests: dict[str, Request]  # every request seen, finished ones included


def make_sched(
    num_blocks: int = 64,
    block_size: int = 4,
    budget: int = 64,
    max_seqs: int = 8,
    chunked: bool = True,
    caching: bool = True,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=caching)
    cfg = SchedulerConfig(
        max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked
    )
    return Scheduler(cfg, kv)


def make_req(
    rid: str,
    prompt: list[int],
    max_tokens: int = 8,
    priority: int = 5,
    arrival: float = 0.0,
    timeout_s: float = 600.0,
    mm_items: tuple[object, ...] = (),
    **params: object,
) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, **params)  # type: ignore[arg-type]
    return Request(
        rid,
        prompt,
        sp,
        priority=priority,
        timeout_s=timeout_s,
        arrival_time=arrival,
        eos_token_ids=(EOS,),
        max_tokens=max_tokens,
        mm_items=mm_items,
    )


def prompt_of(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 60) for _ in range(n)]


def check_pool(sched: Scheduler) -> None:
    """Block-pool invariants against the scheduler's running and waiting requests."""
    kv, pool = sched.kv, sched.kv.pool
    bs = kv.block_size
    refs: Counter[int] = Counter()
    for req in sched.running:
        assert req.status == RequestStatus.RUNNING
        assert len(set(req.block_ids)) == len(req.block_ids), req
        assert len(req.block_ids) * bs >= req.num_computed_tokens, req
        refs.update(req.block_ids)
    for req in sched.waiting:
        assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert req.block_ids == [] and req.num_computed_tokens == 0, req
    assert sum(b.ref_cnt for b in pool.blocks) == sum(refs.values())
    for b in pool.blocks:
        assert b.ref_cnt == refs[b.block_id], b
        assert (b.ref_cnt == 0) == (b.block_id in pool.free_queue), b
        if b.block_hash is not None:
            assert pool.cached[b.block_hash] == b.block_id
    assert len(pool.cached) == sum(b.block_hash is not None for b in pool.blocks)
    for req in sched.running:
        hashes: list[bytes] = []
        for i, b in enumerate(req.block_ids):
            blk = pool.blocks[b]
            full = (i + 1) * bs <= req.num_tokens
            if full:
                block_tokens = req.all_token_ids[i * bs : (i + 1) * bs]
                hashes.append(hash_block(hashes[-1] if hashes else None, block_tokens))
            if blk.block_hash is not None:  # a cached block holds exactly this prefix
                assert full and (i + 1) * bs <= req.num_computed_tokens
                assert blk.block_hash == hashes[i], (req, i)
            if refs[b] > 1:  # shared only as a cached prefix block, all earlier ones cached too
                assert blk.block_hash is not None, (req, i, blk)
                assert all(pool.blocks[x].block_hash is not None for x in req.block_ids[:i])


def assert_idle(sched: Scheduler) -> None:
    assert not sched.has_unfinished()
    assert sched.running == [] and sched.waiting == []
    sched.kv.pool.check_idle()
    assert sched.kv.num_tracked() == {"block hashes": 0, "cached counts": 0} and sched.pending_aborts == []


def _checked_schedule(sched: Scheduler, now: float, seen: dict[str, Request]) -> SchedulerOutput:
    seen.update(sched.requests)
    out = sched.schedule(now=now)
    budget = sched.config.max_num_batched_tokens
    assert out.num_batched_tokens == sum(s.num_tokens for s in out.scheduled) <= budget
    assert len(sched.running) <= sched.config.max_num_seqs
    ids = [s.request_id for s in out.scheduled]
    assert len(set(ids)) == len(ids)
    assert all(sched.requests[i].status == RequestStatus.RUNNING for i in ids)
    for rid in out.finished_ids:
        req = seen[rid]
        assert req.is_finished and req.block_ids == [] and rid not in sched.requests
    for rid in out.preempted_ids:
        req = seen[rid]
        assert req.metrics.num_preemptions >= 1
        if rid not in ids:
            assert req.status == RequestStatus.PREEMPTED and req.block_ids == []
    check_pool(sched)
    return out


def step_once(
    sched: Scheduler,
    runner: FakeRunner,
    step: int,
    now: float,
    seen: dict[str, Request],
    inflight: list[SchedulerOutput] | None = None,
) -> StepLog:
    """One schedule -> fake runner -> update_from_output, with the invariants checked after each.

    `inflight` (async scheduling, as the engine does with the "mp" executor): a list holding the
    step already scheduled; the next one is scheduled before that one runs and is left in it."""
    first = None
    if inflight is None:
        out = run_out = _checked_schedule(sched, now, seen)
    else:
        runner.pipelined = True
        first = None if inflight else _checked_schedule(sched, now, seen)
        run_out = inflight.pop() if inflight else first
        out = _checked_schedule(sched, now, seen)  # ahead: pending tokens are not known yet
        if out.has_work:
            inflight.append(out)
    log = StepLog(
        step,
        [(s.request_id, s.num_computed_tokens, s.num_tokens, s.samples) for s in out.scheduled],
        out.num_batched_tokens,
        list(out.preempted_ids),
        list(out.finished_ids) + (first.finished_ids if first is not None else []),
    )
    result = runner(run_out, sched.requests)
    for req in sched.update_from_output(run_out, result):
        log.sampled[req.request_id] = req.output_token_ids[-1]
        if req.is_finished:
            log.finished.append(req.request_id)
            assert req.block_ids == [] and req.request_id not in sched.requests
    check_pool(sched)
    return log


def run_until_idle(
    sched: Scheduler,
    max_steps: int = 500,
    runner: FakeRunner | None = None,
    t0: float = 0.0,
    dt: float = 0.001,
    pipelined: bool = False,
) -> Run:
    """Step until nothing is unfinished; fails past max_steps (a deadlock or a livelock)."""
    runner = runner or FakeRunner(sched)
    seen: dict[str, Request] = dict(sched.requests)
    logs: list[StepLog] = []
    inflight: list[SchedulerOutput] | None = [] if pipelined else None
    for step in range(max_steps):
        if not sched.has_unfinished() and not inflight:
            break
        logs.append(step_once(sched, runner, step, t0 + step * dt, seen, inflight))
    else:
        pytest.fail(f"not idle after {max_steps} steps: {sched.running} {sched.waiting}")
    assert_idle(sched)
    outputs = {rid: list(r.output_token_ids) for rid, r in seen.items()}
    return Run(outputs, logs, seen)


def expected_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    history, out = list(prompt), []
    while len(out) < max_tokens:
        t = next_token(history)
        history.append(t)
        out.append(t)
    return out


def solo(req: Request, eos_at: set[int] | None = None) -> list[int]:
    """The tokens the request produces alone in a big pool."""
    clone = make_req(
        req.request_id,
        req.prompt_token_ids,
        max_tokens=req.max_tokens,
        priority=req.priority,
        arrival=req.arrival_time,
        ignore_eos=req.params.ignore_eos,
        min_tokens=req.params.min_tokens,
        stop_token_ids=list(req.params.stop_token_ids),
    )
    sched = make_sched(num_blocks=256, budget=256)
    runner = FakeRunner(sched)
    if eos_at:
        runner.eos_at[req.request_id] = set(eos_at)
    sched.add_request(clone)
    run = run_until_idle(sched, runner=runner)
    return run.outputs[req.request_id]


class RecordingScheduler(Scheduler):
    """Records, for every preemption, the victim and the running requests at that moment."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.victims: list[tuple[Request, list[Request]]] = []

    def preempt(self, req: Request) -> None:
        self.victims.append((req, list(self.running)))
        super().preempt(req)


def make_recording(
    num_blocks: int, block_size: int = 4, budget: int = 64, max_seqs: int = 8
) -> RecordingScheduler:
    kv = KVCacheManager(num_blocks, block_size)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    return RecordingScheduler(cfg, kv)


def run_one(req: Request, eos_at: set[int] | None = None) -> Request:
    sched = make_sched()
    runner = FakeRunner(sched)
    if eos_at:
        runner.eos_at[req.request_id] = eos_at
    sched.add_request(req)
    run_until_idle(sched, runner=runner)
    return req
