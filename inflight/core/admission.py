"""Admission: waiting requests, best first, into the running set while the step's budget, its
seats and the block pool allow (step 3 of the scheduler's step, core/scheduler.py; the engine's
admission at registration is another, engine/admission.py). Prefix-cache hits skip their cached
tokens. A waiting request only preempts running requests strictly worse than itself, so nothing
ping-pongs.

Batch-size caps (MindIE `batch_size`, `SamplingParams.max_batch_size`): the running
set never holds more than min(max_num_seqs, every running request's cap) sequences,
so each step of a capped request runs at most its cap rows. A waiting request is
admitted only if that still holds with it (and its own cap) counted, preempting
strictly worse running requests when that is enough (a priority-1 `batch_size: 1`
request runs alone at once). When the best waiting request cannot be admitted, no
request behind it is either: the running set drains down to its cap, so it never
starves. The price: while a capped request waits for the drain and while it runs,
everyone else runs in a smaller batch (less throughput for the server).
"""

from __future__ import annotations

from typing import Any

from inflight.core.pieces import drafts_fitting
from inflight.request import Request, RequestStatus, order_key

# core/scheduler.py's, which imports this module: these functions are steps of its step, on its
# request sets, its step state (budget, seat_victims, ahead) and its shared steps (preempt: tests record it)
Scheduler = Any


def admit_waiting(sched: Scheduler, now: float, preempted: list[str]) -> None:
    """Waiting requests, best first, while the budget, the seats and the pool allow."""
    if not sched.waiting:
        return
    sched.waiting.sort(key=order_key)
    adapters = sched.running_adapters() if sched.num_lora else set()
    for req in list(sched.waiting):
        if sched.budget == 0:
            break
        if req.num_pending:
            continue  # preempted while its token was in flight: it waits for that token
        lora = req.lora.uid if req.lora is not None else None
        if lora is not None and lora not in adapters and len(adapters) >= sched.lora_slots.num_slots:
            continue  # its adapter would need a slot that running requests hold: later
        if any(v.sort_key() < req.sort_key() for v in sched.seat_victims):
            break  # a request preempted for a seat this step is waiting again, ahead of this one
        if not _admit(sched, req, now, preempted):
            break
        if lora is not None:
            adapters.add(lora)


def _admit(sched: Scheduler, req: Request, now: float, preempted: list[str]) -> bool:
    """Try to start a waiting request. False stops admission for this step."""
    if not _make_seat(sched, req, preempted):
        return False
    fresh = req.num_computed_tokens == 0 and not req.params.needs_whole_prompt
    hits = sched.kv.find_cached_prefix(req) if fresh else []
    computed = len(hits) * sched.kv.block_size if hits else req.num_computed_tokens  # forked: > 0
    remaining = req.num_tokens - computed
    n = sched.fit_encoder(req, computed, min(remaining, sched.budget))
    if n == 0 or (n < remaining and not sched.config.enable_chunked_prefill):
        return False
    k = drafts_fitting(req, n, sched.budget, computed)
    n += k if sched.kv.can_allocate(req, n + k, hits) else 0  # drafts never preempt anyone
    sched.reserve_lookahead(req, n, hits)
    while not sched.kv.can_allocate(req, n, hits):
        if not _preempt_worse_than(sched, req, preempted):
            return False
    sched.kv.allocate(req, n + sched.ahead.get(req.request_id, 0), hits)
    if req.status == RequestStatus.WAITING:
        req.metrics.num_cached_tokens = len(hits) * sched.kv.block_size
    sched.waiting.remove(req)
    sched.running.append(req)
    req.status = RequestStatus.RUNNING
    sched.schedule_piece(req, n, now)
    return True


def _seq_limit(sched: Scheduler, req: Request, running: list[Request]) -> int:
    """The most running sequences with `req` among them: max_num_seqs, lowered by the
    batch-size caps of `req` and of `running`."""
    caps = [cap for r in (req, *running) if (cap := r.inputs.params.max_batch_size)]  # (per admission: O(running))
    return min([sched.config.max_num_seqs, *caps])


def _make_seat(sched: Scheduler, req: Request, preempted: list[str]) -> bool:
    """Room for `req` in the running set, preempting running requests strictly worse than it
    (worst first) when that is enough; when it is not, False and nothing is preempted."""
    kept = [r for r in sched.running if r.order <= req.order]  # (sort_key, without 2 calls a request)
    if len(kept) >= _seq_limit(sched, req, kept):
        return False
    while len(sched.running) >= _seq_limit(sched, req, sched.running):
        sched.seat_victims.append(sched.worst_running())
        _preempt_worse_than(sched, req, preempted)  # a worse one exists until only `kept` is left
    return True


def _preempt_worse_than(sched: Scheduler, req: Request, preempted: list[str]) -> bool:
    if not sched.running:
        return False
    victim = sched.worst_running()
    if victim.sort_key() <= req.sort_key():
        return False
    preempted.append(victim.request_id)
    sched.preempt(victim)
    return True
