"""LoRA device slots: which adapter sits in which of the runner's `max_loras` slots.

The scheduler decides this as it decides KV blocks, so the runner only copies what it is told
(`SchedulerOutput.lora_loads`) and every piece names its slot (`ScheduledRequest.lora_slot`).
Adapters are keyed by uid (`LoRARequest.uid`); the weights are an opaque payload here.

Invariant (the scheduler keeps it): the running requests use at most `num_slots` distinct
adapters, so a step's adapters always fit, and a slot whose adapter a running request uses is
never evicted; among the others the least recently used goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class LoRASlots:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.resident: OrderedDict[int, int] = (
            OrderedDict()
        )  # uid -> slot, least recently used first
        self.num_loads = 0
        self.num_evictions = 0
        self.num_hits = 0  # a step's adapter was resident already (counted once per step)

    def assign(
        self, needed: dict[int, Any], keep: set[int]
    ) -> tuple[dict[int, int], list[tuple[int, Any]]]:
        """Slots for this step's adapters (uid -> payload). `keep`: uids running requests use.

        Returns (uid -> slot, [(slot, payload) to copy into the slot before the forward]).
        """
        loads: list[tuple[int, Any]] = []
        for uid in needed:
            if uid in self.resident:
                self.resident.move_to_end(uid)
                self.num_hits += 1
        for uid, payload in needed.items():
            if uid in self.resident:
                continue
            slot = self._free_slot(set(needed) | keep)
            self.resident[uid] = slot
            loads.append((slot, payload))
            self.num_loads += 1
        return {uid: self.resident[uid] for uid in needed}, loads

    def _free_slot(self, protected: set[int]) -> int:
        used = set(self.resident.values())
        for slot in range(self.num_slots):
            if slot not in used:
                return slot
        for uid, slot in self.resident.items():  # least recently used first
            if uid not in protected:
                del self.resident[uid]
                self.num_evictions += 1
                return slot
        raise RuntimeError(f"LoRA slots: all {self.num_slots} hold adapters running requests use")
