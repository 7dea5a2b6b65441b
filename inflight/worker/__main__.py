"""A model worker process: `python -m inflight.worker FD LOGLEVEL` (worker/worker_process.py).

FD is its end of the engine's socket pair ("-": a tensor-parallel rank other than 0, which
takes its calls from rank 0), LOGLEVEL the engine's `inflight` level. A tensor-parallel rank
finds its place in torchrun-style environment variables (worker/distributed.py)."""

import logging
import sys
from multiprocessing.connection import Connection

from inflight import memory
from inflight.worker.distributed import RankGroup, RankPlace
from inflight.worker.worker_process import follower_main, worker_main

memory.configure()  # before the model loads (oneDNN reads it at its first primitive)

place = RankPlace.from_env()
name = "model worker" if place is None else f"rank {place.rank}"
logging.basicConfig(format=f"%(levelname)s %(name)s ({name}): %(message)s")
logging.getLogger("inflight").setLevel(int(sys.argv[2]))
group = RankGroup(place) if place is not None else None
if sys.argv[1] == "-":
    assert group is not None, "a worker without an engine connection must be a tensor-parallel rank"
    sys.exit(follower_main(group))
worker_main(Connection(int(sys.argv[1])), group)
