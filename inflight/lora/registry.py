"""The engine's adapters: names and TensorRT-LLM task ids, and the host-memory LRU cache.

Two ways to name an adapter:
  by name     registered from a PEFT directory (`--lora-modules`, POST /v1/load_lora_adapter,
              `LLM.load_lora_adapter`); selected by OpenAI `model` or the prompt's `lora_name`
  by task id  TensorRT-LLM's `lora_task_id`: sent once with `lora_weights` + `lora_config`,
              then alone while it stays cached; an id that is not cached is an error

Weights live in host memory, at most `max_cpu_loras` adapters, least recently used evicted
first, never one a live request uses. An evicted named adapter is read from its directory
again when next used; an evicted task id is gone (TensorRT-LLM's semantics). The device
level (`max_loras` slots) is the scheduler's (core/lora_slots.py).

Threads: `select` (tokenize-time validation) runs on the caller's thread and only reads;
`activate`, `load` and `unload` run on the engine thread; a lock guards the maps.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from inflight.errors import ParamError
from inflight.lora.adapter import LoRAAdapter, LoRAShapes, from_trt, load_peft

_U64_MAX = 2**64 - 1


@dataclass(eq=False)
class LoRARequest:
    """The adapter a request runs with. `uid` keys the device slots and the prefix cache (two
    adapters never share KV blocks); `adapter` is filled by `activate` on the engine thread."""

    uid: int
    name: str
    adapter: LoRAAdapter | None = None
    task_id: int | None = None

    @property
    def cache_key(self) -> bytes:
        return b"lora:" + self.uid.to_bytes(8, "little")

    def __getstate__(self) -> dict[str, object]:
        """Without its weights: a request's inputs travel to the runner, the weights do not (the
        runner gets them once per slot load, SchedulerOutput.lora_loads)."""
        return {**self.__dict__, "adapter": None}


@dataclass(frozen=True)
class HostCacheStats:
    num_cached: int = 0  # adapters in host memory
    num_registered: int = 0  # adapters known by name
    loads: int = 0  # read from a directory or taken from a request's tensors
    evictions: int = 0
    hits: int = 0  # a request's adapter was in host memory already


class LoRARegistry:
    def __init__(
        self, shapes: LoRAShapes, dtype: torch.dtype, max_rank: int, max_cpu_loras: int
    ) -> None:
        self.shapes = shapes
        self.dtype = dtype
        self.max_rank = max_rank
        self.capacity = max_cpu_loras
        self._lock = threading.Lock()
        self._uids = itertools.count(1)
        self.names: dict[str, tuple[int, str]] = {}  # name -> (uid, PEFT directory)
        self.tasks: dict[int, int] = {}  # TensorRT-LLM task id -> uid of its cached weights
        self._cached: OrderedDict[int, LoRAAdapter] = OrderedDict()  # uid -> weights, LRU first
        self._loads = self._evictions = self._hits = 0

    # ------------------------------------------------------------ by name (engine thread)
    def load(self, name: str, path: str, in_use: set[int] = frozenset()) -> LoRAAdapter:  # type: ignore[assignment]
        """Register a PEFT directory under `name` (read and checked now)."""
        if not isinstance(name, str) or not name:
            raise ParamError("lora_name: must be a non-empty string", "lora_name")
        if not isinstance(path, str) or not path:
            raise ParamError("lora_path: must be a non-empty string", "lora_path")
        with self._lock:
            if name in self.names:
                raise ParamError(
                    f"lora_name: an adapter named {name!r} is already loaded", "lora_name"
                )
        adapter = load_peft(path, self.shapes, self.max_rank, self.dtype, name)
        with self._lock:
            adapter.uid = next(self._uids)
            self.names[name] = (adapter.uid, path)
            self._insert(adapter, in_use)
        return adapter

    def unload(self, name: str) -> None:
        with self._lock:
            if name not in self.names:
                raise ParamError(f"lora_name: no adapter named {name!r} is loaded", "lora_name")
            uid, _ = self.names.pop(name)
            self._cached.pop(uid, None)  # requests running with it keep their own reference

    def adapters(self) -> list[tuple[str, str]]:
        """(name, directory) of every adapter registered by name."""
        with self._lock:
            return [(name, path) for name, (_, path) in self.names.items()]

    # ------------------------------------------------------------ requests
    def select(self, fields: dict[str, Any]) -> LoRARequest | None:
        """The adapter a prompt's fields ask for (caller's thread; reads only). Fields:
        `lora_name`, or `lora_task_id` with optional `lora_weights` + `lora_config`."""
        name, task = fields.get("lora_name"), fields.get("lora_task_id")
        weights, config = fields.get("lora_weights"), fields.get("lora_config")
        if name is not None:
            if task is not None or weights is not None or config is not None:
                raise ParamError(
                    "lora_name: give an adapter name or a lora_task_id, not both", "lora_name"
                )
            with self._lock:
                known = self.names.get(name) if isinstance(name, str) else None
            if known is None:
                raise ParamError(f"lora_name: no adapter named {name!r} is loaded", "lora_name")
            return LoRARequest(known[0], name)
        if task is None:
            if weights is not None or config is not None:
                raise ParamError(
                    "lora_task_id: lora_weights and lora_config need a lora_task_id", "lora_task_id"
                )
            return None
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task <= _U64_MAX:
            raise ParamError("lora_task_id: must be an unsigned 64-bit integer", "lora_task_id")
        if (weights is None) != (config is None):
            missing = "lora_config" if config is None else "lora_weights"
            raise ParamError(f"{missing}: lora_weights and lora_config come together", missing)
        if weights is None:
            with self._lock:
                uid = self.tasks.get(task)
            if uid is None:
                raise ParamError(
                    f"lora_task_id: task {task} is not cached; send it with lora_weights and lora_config first",
                    "lora_task_id",
                )
            return LoRARequest(uid, f"task-{task}", task_id=task)
        adapter = from_trt(weights, config, self.shapes, self.max_rank, self.dtype, f"task-{task}")
        return LoRARequest(0, adapter.name, adapter, task_id=task)  # uid given by activate

    def activate(self, lora: LoRARequest, in_use: set[int]) -> None:
        """Make sure the request's adapter is in host memory (engine thread, when the request is
        added); `in_use`: uids of live requests, which eviction skips."""
        with self._lock:
            if (
                lora.adapter is not None and lora.uid == 0
            ):  # TensorRT-LLM weights came with the request
                self._activate_task(lora, in_use)
                return
            cached = self._cached.get(lora.uid)
            if cached is not None:
                self._cached.move_to_end(lora.uid)
                self._hits += 1
                lora.adapter = cached
                return
            if lora.task_id is not None:
                raise ParamError(
                    f"lora_task_id: task {lora.task_id} was evicted from the cache; send its weights again",
                    "lora_task_id",
                )
            entry = self.names.get(lora.name)
            if entry is None or entry[0] != lora.uid:
                raise ParamError(f"lora_name: adapter {lora.name!r} was unloaded", "lora_name")
        adapter = load_peft(
            entry[1], self.shapes, self.max_rank, self.dtype, lora.name
        )  # evicted: read it again
        with self._lock:
            adapter.uid = lora.uid
            self._insert(adapter, in_use)
        lora.adapter = adapter

    def _activate_task(self, lora: LoRARequest, in_use: set[int]) -> None:
        adapter = lora.adapter
        assert adapter is not None and lora.task_id is not None
        uid = self.tasks.get(lora.task_id)
        cached = self._cached.get(uid) if uid is not None else None
        if cached is not None:
            if not cached.same_weights(adapter):
                raise ParamError(
                    f"lora_weights: task {lora.task_id} is cached with different weights (task ids are globally unique)",
                    "lora_weights",
                )
            self._cached.move_to_end(cached.uid)
            self._hits += 1
            lora.uid, lora.adapter = cached.uid, cached
            return
        adapter.uid = lora.uid = next(self._uids)
        self.tasks[lora.task_id] = adapter.uid
        self._insert(adapter, in_use)

    def _insert(self, adapter: LoRAAdapter, in_use: set[int]) -> None:
        """Add to the LRU (lock held), evicting the least recently used adapters no live request
        uses; when every cached adapter is in use the cache holds more until they finish (`trim`)."""
        self._cached[adapter.uid] = adapter
        self._loads += 1
        self._evict(in_use | {adapter.uid})

    def _evict(self, keep: set[int]) -> None:
        for uid in list(self._cached):
            if len(self._cached) <= self.capacity:
                break
            if uid not in keep:
                del self._cached[uid]
                self._evictions += 1
                self.tasks = {t: u for t, u in self.tasks.items() if u != uid}

    @property
    def over_capacity(self) -> bool:
        return len(self._cached) > self.capacity

    def trim(self, in_use: set[int]) -> None:
        """Back to `max_cpu_loras` once the requests that held extra adapters finished (engine thread)."""
        with self._lock:
            self._evict(in_use)

    def stats(self) -> HostCacheStats:
        with self._lock:
            return HostCacheStats(
                len(self._cached), len(self.names), self._loads, self._evictions, self._hits
            )
