"""Data parallelism: R engine replicas behind one front end, and the router that picks one.

`ReplicaRouter` is an `EngineClient` (engine/client.py: the interface the server uses; LoRA adapters
are loaded into every replica) over R `AsyncEngine`s, each with its own engine thread, scheduler, KV pool and
model worker process(es) (`mp`, or one per rank when tensor parallel: never two torch
workloads in one process, see the libgomp invariant in docs/ARCHITECTURE.md).

Routing: the replica holding the longest cached prefix of the prompt, else the least loaded.
What a replica holds is the router's own record of the full prompt blocks it sent there
(chained hashes of `block_size` tokens, the prefix cache's granularity), kept per replica in
LRU order and bounded by that replica's KV pool; it does not see evictions, so it is the
replica most likely to hold the prefix (SGLang's router keeps the same kind of approximate
tree). Load = requests in flight on a replica; ties go to the replica that got fewer requests.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from inflight.engine.async_engine import (
    AsyncEngine,
    EngineRequest,
    RequestStream,
    StatsSnapshot,
)
from inflight.outputs import RequestOutput

logger = logging.getLogger(__name__)
T = TypeVar("T")


class PrefixIndex:
    """The full prompt blocks sent to one replica (chained hashes, LRU, at most `capacity`)."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def hashes(self, tokens: Sequence[int], salt: bytes = b"") -> list[int]:
        bs, h, out = self.block_size, hash(salt), []
        for start in range(0, len(tokens) - bs + 1, bs):
            h = hash((h, tuple(tokens[start : start + bs])))
            out.append(h)
        return out

    def matched(self, hashes: list[int]) -> int:
        """Leading blocks of the prompt this replica was sent."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def add(self, hashes: list[int]) -> None:
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def _first(name: str) -> Any:
    """A method of the client interface that replica 0 answers (AsyncEngine's signature and doc)."""
    method = getattr(AsyncEngine, name)

    @functools.wraps(method)
    def call(self: ReplicaRouter, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.replicas[0], name)(*args, **kwargs)

    return call


def _first_property(name: str) -> property:
    """A property of the client interface that replica 0 answers."""
    return property(lambda self: getattr(self.replicas[0], name), doc=getattr(AsyncEngine, name).__doc__)


@dataclass(frozen=True)
class Route:
    replica: int
    matched_blocks: int  # 0: chosen as the least loaded


class ReplicaRouter:
    def __init__(
        self, replicas: list[AsyncEngine], block_size: int, capacity_blocks: list[int]
    ) -> None:
        assert replicas
        self.replicas = replicas
        self.indexes = [PrefixIndex(block_size, cap) for cap in capacity_blocks]
        self.routed = [0] * len(replicas)  # requests sent to each replica

    @classmethod
    def of(cls, replicas: list[AsyncEngine]) -> ReplicaRouter:
        """A router over built replicas (their block size and pool sizes read once, at start)."""
        engines = [r.engine for r in replicas]
        return cls(
            replicas, engines[0].config.cache.block_size, [e.kv.pool.num_blocks for e in engines]
        )

    # ------------------------------------------------------------ routing
    def route(self, request: EngineRequest) -> Route:
        lora = getattr(
            request.lora, "uid", None
        )  # an adapter's blocks are its own in the prefix cache
        salt = request.cache_salt + (b"" if lora is None else str(lora).encode())
        hashes = self.indexes[0].hashes(request.prompt_token_ids, salt)
        live = [i for i, r in enumerate(self.replicas) if r.stats.dead is None] or list(
            range(len(self.replicas))
        )
        matched = {i: self.indexes[i].matched(hashes) for i in live}

        def load(i: int) -> tuple[int, int]:
            return self.replicas[i].num_unfinished, self.routed[i]

        best = max(matched.values())
        if best > 0:
            choice = min((i for i in live if matched[i] == best), key=load)
        else:
            choice = min(live, key=load)
        self.indexes[choice].add(hashes)
        self.routed[choice] += 1
        return Route(choice, best)

    # ------------------------------------------------------------ the engine-client interface
    # what any replica answers alike (a request made by one runs on any: the tokenizer, the limits
    # and the compiled grammars are the same): replica 0's methods, signatures included
    make_request = _first("make_request")
    make_request_async = _first("make_request_async")
    run_input = _first("run_input")
    process_media = _first("process_media")
    compile_grammars = _first("compile_grammars")  # a compiled grammar is a value any replica runs
    hold = _first("hold")
    call = _first("call")
    work_budget_s = _first("work_budget_s")  # of replica 0's engine thread, where `call` runs
    lora_adapters = _first("lora_adapters")
    tokenizer = _first_property("tokenizer")
    model_info = _first_property("model_info")
    takes_images = _first_property("takes_images")
    # written against the client interface: they reach this router's own make_request / submit_all
    generate = AsyncEngine.generate
    submit = AsyncEngine.submit

    def submit_all(
        self, requests: Sequence[EngineRequest], *, queue_limit: int | None = None, field: str = "prompt"
    ) -> list[RequestStream]:
        """The requests of one body go to one replica together (admitted all or none there),
        chosen by the first one's prompt; `queue_limit` applies to each replica."""
        route = self.route(requests[0])
        logger.debug("%s -> replica %d (%d cached blocks)", requests[0].request_id, route.replica, route.matched_blocks)
        return self.replicas[route.replica].submit_all(requests, queue_limit=queue_limit, field=field)

    async def abort(self, request_id: str) -> None:
        for r in self.replicas:  # an id a replica does not hold is nothing to it
            await r.abort(request_id)

    def abort_all(self) -> int:
        return sum(r.abort_all() for r in self.replicas)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Every replica serves every adapter (a request may go to any of them)."""
        for r in self.replicas:
            await r.load_lora_adapter(name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        for r in self.replicas:
            await r.unload_lora_adapter(name)

    @property
    def num_unfinished(self) -> int:
        return sum(r.num_unfinished for r in self.replicas)

    @property
    def num_queued_sequences(self) -> int:
        return sum(r.num_queued_sequences for r in self.replicas)

    def add_observer(self, fn: Callable[[RequestOutput], None]) -> None:
        for r in self.replicas:
            r.add_observer(fn)

    @property
    def replica_stats(self) -> list[StatsSnapshot]:
        return [r.stats for r in self.replicas]

    @property
    def stats(self) -> StatsSnapshot:
        """All replicas together: counts summed, KV usage and prefix hit rate averaged; dead when
        any replica is (the server reports unhealthy; the router stops sending it requests)."""
        snaps = self.replica_stats
        dead = [f"replica {i}: {s.dead}" for i, s in enumerate(snaps) if s.dead is not None]
        errors = [
            f"replica {i}: {s.last_error}" for i, s in enumerate(snaps) if s.last_error is not None
        ]
        n = len(snaps)
        return StatsSnapshot(
            num_running=sum(s.num_running for s in snaps), num_waiting=sum(s.num_waiting for s in snaps),
            kv_cache_usage=sum(s.kv_cache_usage for s in snaps) / n,
            prefix_cache_hit_rate=sum(s.prefix_cache_hit_rate for s in snaps) / n,
            num_preemptions=sum(s.num_preemptions for s in snaps), num_steps=sum(s.num_steps for s in snaps),
            published_at=max(s.published_at for s in snaps), last_error="; ".join(errors) or None,
            lora=snaps[0].lora,  # replica 0's adapter caches (every replica loads the same adapters)
            dead="; ".join(dead) or None, worker_busy_s=_sum(s.worker_busy_s for s in snaps),
            worker_idle_s=_sum(s.worker_idle_s for s in snaps),
        )  # fmt: skip

    def shutdown(self) -> None:
        for r in self.replicas:
            r.shutdown()


def _sum(values: Iterable[float | None]) -> float | None:
    """The sum of the replicas' figures; None if none has one (no worker process)."""
    got = [v for v in values if v is not None]
    return sum(got) if got else None
