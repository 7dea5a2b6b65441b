"""The model worker process of the "mp" executor: `python -m inflight.worker FD LOGLEVEL`
(worker/executor.py): FD is its end of the socket pair, LOGLEVEL the engine's `inflight` level."""

import logging
import sys
from multiprocessing.connection import Connection

from inflight.worker.executor import worker_main

logging.basicConfig(format="%(levelname)s %(name)s (model worker): %(message)s")
logging.getLogger("inflight").setLevel(int(sys.argv[2]))
worker_main(Connection(int(sys.argv[1])))
