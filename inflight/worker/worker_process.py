"""The model worker process's side of an executor (worker/executor.py): `Worker` (one process's
runner and the calls it answers), `worker_main` (the engine's worker, tensor parallel: rank 0)
and `follower_main` (ranks > 0). Started by `python -m inflight.worker` (worker/__main__.py).

Apart from executor.py and distributed.py so that neither imports the other: the executor spawns
processes and talks to them, distributed.py forms the ranks' process groups, this module runs in
the process they start."""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import threading
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from inflight.memory import Trimmer
from inflight.worker.distributed import RankGroup

logger = logging.getLogger(__name__)


class Worker:
    """One process's runner and the calls it answers; the same on every tensor-parallel rank."""

    def __init__(self, group: RankGroup | None = None) -> None:
        self.group = group
        self.runner: Any = None
        self.waited = 0.0  # seconds blocked on the engine before this call (worker_main sets it)

    def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        from inflight.worker.model_runner import ModelRunner

        if op == "load":
            config, progress = args
            group = self.group
            if group is None:
                self.runner = ModelRunner(config, progress)
                return self.runner.num_kv_blocks()
            if group.device is not None:  # one GPU per rank
                config = replace(config, model=replace(config.model, device=group.device))
            self.runner = ModelRunner(config, progress and group.tp.rank == 0, group.tp)
            return group.min(self.runner.num_kv_blocks())  # every rank must hold the pool
        assert self.runner is not None
        if op == "allocate":
            config, num_blocks = args
            if self.group is not None and self.group.device is not None:
                config = replace(config, model=replace(config.model, device=self.group.device))
            return self.runner.allocate_kv_cache(config, num_blocks)
        start = time.perf_counter()
        value = self.runner.execute(*args)
        return value, time.perf_counter() - start, self.waited


def _read_in_background(conn: Connection) -> queue.SimpleQueue[bytes]:
    """Every call the engine sends, read as it arrives. With async scheduling the engine sends
    step N+1 before it reads step N's reply: were the worker to read only between calls, a large
    step (images, p-tuning tables, grammars) and a large reply (logits) would each fill the
    socket, and both sides would block sending forever."""
    inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                inbox.put(conn.recv_bytes())
            except (EOFError, OSError):  # the engine is gone
                inbox.put(pickle.dumps(("stop", ())))
                return

    threading.Thread(target=read, name="inflight-worker-inbox", daemon=True).start()
    return inbox


def worker_main(conn: Connection, group: RankGroup | None = None) -> None:
    """The worker process (tensor parallel: rank 0): build the runner, then answer calls until
    told to stop; with a group, every call goes to the other ranks first."""
    worker = Worker(group)
    inbox = _read_in_background(conn)
    replied: float | None = None  # when the last step's reply went out
    # the model's tensors live here: hand malloc's free pages back (inflight/memory.py)
    trimmer = Trimmer()
    while True:
        raw = inbox.get()
        # idle between two steps: up to the engine's idle wait (async_engine) counts, a longer
        # wait is the engine having nothing to run
        waited = 0.0 if replied is None else time.perf_counter() - replied
        worker.waited = waited if waited < 0.05 else 0.0
        op, args = pickle.loads(raw)
        if op == "stop":
            if group is not None:
                group.stop_all(raw)
            return
        try:
            if group is not None:
                group.share(raw)
            reply = (True, worker.handle(op, args))
        except Exception as e:  # reported to the engine; the worker stays up for the next call
            fatal = (
                "fatal: " if getattr(e, "fatal", False) else ""
            )  # the device is unusable (model_runner._is_fatal)
            reply = (False, f"{fatal}{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
        try:
            conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            return
        if op == "execute":  # after the reply, before the idle clock starts: every 10 s, a few ms
            trimmer.after_step()
        replied = time.perf_counter() if op == "execute" else None


def follower_main(group: RankGroup) -> int:
    """A rank other than 0: run each call rank 0 broadcasts until "stop". Returns the exit code;
    any failure ends the process (the ranks would be out of step), which fails rank 0's next
    collective at once."""
    worker = Worker(group)
    while True:
        try:
            op, args = pickle.loads(group.share(None))
        except Exception as e:  # rank 0 is gone (its sockets closed) or the group broke
            logger.error("tensor parallel rank %d: lost rank 0 (%s); exiting", group.place.rank, e)
            return 1
        if op == "stop":
            with contextlib.suppress(Exception):  # leaving anyway
                group.close()
            return 0
        try:
            worker.handle(op, args)
        except Exception:
            logger.exception("tensor parallel rank %d: %s failed; exiting", group.place.rank, op)
            return 1
