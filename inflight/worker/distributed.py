"""Tensor-parallel ranks: one process per rank, all in one torch.distributed process group.

Who starts which rank (the rank's place travels in torchrun's environment variables:
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE):

  one node        the engine's `TensorParallelExecutor` (worker/executor.py) spawns ranks
                  0..N-1 as `python -m inflight.worker`
  node K > 0      `inflight serve --nnodes M --node-rank K ...` spawns that node's ranks and
                  waits for them (no front end, no engine)
  torchrun        every process runs `inflight serve`: RANK 0 is the front end and spawns one
                  worker with RANK=0; every other rank becomes a follower in place

One call (load, allocate, execute, stop): the engine pickles it over a socket to rank 0; rank 0
broadcasts the same bytes to every other rank on a gloo *control* group; every rank runs it;
only rank 0 answers. The model's collectives (all-reduce, all-gather) run on the main group:
gloo on CPU, nccl on CUDA (one GPU per rank, cuda:LOCAL_RANK). The main group has the
configured collective timeout, so a hung rank fails the step; the control group waits as long
as the server idles (a rank that exits closes its sockets, which fails the others' waits at once).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from inflight import platform
from inflight.config import ParallelConfig
from inflight.models.parallel import TensorParallel

logger = logging.getLogger(__name__)

# the control group waits for the engine's next call however long the server idles
_IDLE_TIMEOUT = timedelta(days=30)


@dataclass(frozen=True)
class RankPlace:
    """Where one rank stands; crosses into its process as torchrun-style environment variables."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str = "gloo"  # "nccl" on CUDA
    timeout_s: float = 120.0  # the main group's collectives

    def env(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "INFLIGHT_TP_BACKEND": self.backend, "INFLIGHT_TP_TIMEOUT": str(self.timeout_s),
        }  # fmt: skip

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RankPlace | None:
        """The place torchrun (or our spawner) wrote; None outside a group of 2 or more."""
        env = dict(os.environ if environ is None else environ)
        world = int(env.get("WORLD_SIZE", "1"))
        if world < 2 or "RANK" not in env:
            return None
        return cls(
            rank=int(env["RANK"]), world_size=world,
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=int(env.get("MASTER_PORT", "29500")),
            backend=env.get("INFLIGHT_TP_BACKEND", "nccl" if torch.cuda.is_available() else "gloo"),
            timeout_s=float(env.get("INFLIGHT_TP_TIMEOUT", "120")),
        )  # fmt: skip


def free_port() -> int:
    """A free TCP port on this machine (rank 0's store, one node)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def threads_per_rank(sharers: int) -> tuple[int, str]:
    """(intra-op threads, why): INFLIGHT_THREADS_PER_RANK, else this machine's cores split
    evenly between the `sharers` model processes it runs (never fewer than 1)."""
    given = os.environ.get("INFLIGHT_THREADS_PER_RANK")
    if given:
        return max(1, int(given)), "INFLIGHT_THREADS_PER_RANK"
    cores = platform.current().cpu.num_cores
    return max(1, cores // sharers), f"{cores} cores / {sharers} model processes on this node"


class RankGroup:
    """This process's rank: the model's group (`tp`) and the control group calls travel on."""

    def __init__(self, place: RankPlace) -> None:
        self.place = place
        if place.backend == "gloo":
            threads, why = threads_per_rank(
                int(os.environ.get("INFLIGHT_CORE_SHARERS", place.local_world_size))
            )
            torch.set_num_threads(threads)
            logger.info(
                "tensor parallel rank %d of %d: %d threads (%s)",
                place.rank,
                place.world_size,
                threads,
                why,
            )
        else:
            torch.cuda.set_device(place.local_rank)
        dist.init_process_group(
            place.backend, init_method=f"tcp://{place.master_addr}:{place.master_port}",
            rank=place.rank, world_size=place.world_size, timeout=timedelta(seconds=place.timeout_s),
        )  # fmt: skip
        self.control = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT)
        self.tp = TensorParallel(place.rank, place.world_size, dist.group.WORLD)
        logger.info(
            "tensor parallel rank %d of %d joined (%s)", place.rank, place.world_size, place.backend
        )

    @property
    def device(self) -> torch.device | None:
        """The rank's own device on CUDA (cuda:LOCAL_RANK); None on CPU (the config's)."""
        return torch.device("cuda", self.place.local_rank) if self.place.backend == "nccl" else None

    def share(self, raw: bytes | None) -> bytes:
        """Rank 0's call bytes on every rank (rank 0 passes them, the others None)."""
        box = [raw]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]  # type: ignore[return-value]

    def min(self, n: int) -> int:
        """The smallest `n` over the ranks (KV blocks: every rank must hold the pool)."""
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def stop_all(self, raw: bytes) -> None:
        """Rank 0 leaving: tell the ranks still there to stop (the others are gone already)."""
        try:
            self.share(raw)
            self.close()
        except Exception as e:  # a lost rank: nothing to tell it
            logger.info("tensor parallel rank 0: stopping without the other ranks (%s)", e)


def node_places(par: ParallelConfig, node_rank: int, backend: str) -> list[RankPlace]:
    """The ranks one node runs: node K holds ranks [K * per_node, (K + 1) * per_node)."""
    per_node = par.ranks_per_node
    port = par.master_port or free_port()
    return [
        RankPlace(
            node_rank * per_node + i,
            par.tensor_parallel_size,
            i,
            per_node,
            par.master_addr,
            port,
            backend,
            par.collective_timeout_s,
        )  # fmt: skip
        for i in range(per_node)
    ]
