"""LoRA device slots and the scheduler's adapter limit, without a model: running requests use
at most max_loras distinct adapters, a step's adapters always have slots, a slot a running
request uses is never evicted, others go least recently used first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.lora_slots import LoRASlots
from inflight.core.scheduler import Scheduler
from inflight.request import FinishReason, Request
from inflight.sampling_params import SamplingParams


def test_slots_lru_and_protection() -> None:
    slots = LoRASlots(2)
    got, loads = slots.assign({1: "A", 2: "B"}, keep={1, 2})
    assert got == {1: 0, 2: 1} and loads == [(0, "A"), (1, "B")]
    got, loads = slots.assign({2: "B"}, keep=set())  # 2 used now: 1 is the least recent
    assert loads == [] and slots.num_hits == 1
    got, loads = slots.assign({3: "C"}, keep=set())
    assert got == {3: 0} and loads == [(0, "C")] and slots.num_evictions == 1
    got, loads = slots.assign({1: "A"}, keep={3})  # 3 is running: 2 goes although more recent
    assert got == {1: 1} and 2 not in slots.resident
    with pytest.raises(RuntimeError):
        slots.assign({4: "D"}, keep={1, 3})


def _req(rid: str, uid: int | None) -> Request:
    lora = None if uid is None else SimpleNamespace(uid=uid, adapter=f"adapter-{uid}", cache_key=b"lora" + bytes([uid]))
    return Request(rid, [5, 6, 7, 8, 9], SamplingParams(max_tokens=4), max_tokens=4, lora=lora)


def test_scheduler_runs_at_most_max_loras_adapters() -> None:
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=2),
        KVCacheManager(64, 4),
    )
    reqs = [_req("a1", 1), _req("b1", 2), _req("c1", 3), _req("base", None), _req("a2", 1)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    ran = {s.request_id: s.lora_slot for s in out.scheduled}
    assert ran == {"a1": 0, "b1": 1, "base": -1, "a2": 0}  # c1 waits: both slots are held
    assert out.lora_loads == [(0, "adapter-1"), (1, "adapter-2")]
    assert [r.request_id for r in sched.waiting] == ["c1"]
    sched.finish(reqs[1], FinishReason.ABORT)  # b's last request ends: its slot may go to c
    out = sched.schedule()
    ran = {s.request_id: s.lora_slot for s in out.scheduled}
    assert ran["c1"] == 1 and out.lora_loads == [(1, "adapter-3")]
    assert sched.lora_slots.num_evictions == 1
    keys = [sched.kv._extra_key(r, 0) for r in (reqs[0], reqs[2], reqs[3])]  # adapters 1, 3, none
    assert len(set(keys)) == 3
