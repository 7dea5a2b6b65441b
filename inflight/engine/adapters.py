"""The engine's LoRA adapters, around the step loop: the host-memory registry (lora/registry.py),
which adapters live requests hold, and the figures of both adapter caches.

The step loop never reads this: a request carries its `LoRARequest` (filled here when it is
added), and the scheduler's device slots (core/lora_slots.py) take it from there. Callers reach
adapters as `LLMEngine.adapters` (LLM.load_lora_adapter, `--lora-modules`, the AsyncEngine's
load / unload / list); the input processor reads the registry to validate a prompt's lora_* fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inflight.config import EngineConfig
from inflight.core.lora_slots import LoRASlots
from inflight.errors import ParamError
from inflight.lora.adapter import LoRAAdapter, LoRAShapes
from inflight.lora.registry import HostCacheStats, LoRARegistry
from inflight.request import Request


@dataclass(frozen=True)
class LoRAStats:
    """The two adapter caches: host memory (registry) and the device slots (scheduler)."""

    host: HostCacheStats
    num_resident: int  # adapters in device slots
    loads: int  # copied into a device slot
    evictions: int  # slot reused for another adapter
    hits: int  # a step's adapter was in its slot already (once per step)


class EngineAdapters:
    """The adapters of one engine; `registry` is None when LoRA is off (every call that needs it
    is then a ParamError naming the field)."""

    def __init__(self, config: EngineConfig, requests: Mapping[str, Request]) -> None:
        self.registry: LoRARegistry | None = None
        if config.enable_lora:
            shapes = LoRAShapes.from_hf(config.model.hf_config)
            self.registry = LoRARegistry(shapes, config.model.dtype, config.max_lora_rank, config.lora_host_capacity)
        self._requests = requests  # every live sequence (the engine's), read for the adapters in use

    def _checked(self, param: str) -> LoRARegistry:
        if self.registry is None:
            raise ParamError(f"{param}: LoRA adapters are not enabled (start the engine with enable_lora)", param)
        return self.registry

    def load(self, name: str, path: str) -> LoRAAdapter:
        """Register a PEFT adapter directory under `name` (engine thread; ParamError naming the
        field if it does not fit)."""
        return self._checked("lora_name").load(name, path, self.in_use())

    def unload(self, name: str) -> None:
        self._checked("lora_name").unload(name)

    def listed(self) -> list[tuple[str, str]]:
        """(name, directory) of the adapters served by name; [] when LoRA is off. Any thread: the
        registry copies its table under its own lock."""
        return self.registry.adapters() if self.registry is not None else []

    def activate(self, request: Request) -> None:
        """The request's adapter weights into host memory (a task id's first use, an evicted adapter)."""
        if request.lora is not None:
            self._checked("lora_name").activate(request.lora, self.in_use())

    def in_use(self) -> set[int]:
        return {r.lora.uid for r in self._requests.values() if r.lora is not None}

    def trim(self) -> None:
        """A request ended: drop the adapters held past max_cpu_loras while they were in use."""
        if self.registry is not None and self.registry.over_capacity:
            self.registry.trim(self.in_use())

    def stats(self, slots: LoRASlots) -> LoRAStats | None:
        if self.registry is None:
            return None
        return LoRAStats(self.registry.stats(), len(slots.resident), slots.num_loads, slots.num_evictions, slots.num_hits)
