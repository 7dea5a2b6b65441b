"""Executors: how the engine reaches its model runner (vLLM's `distributed_executor_backend`).

    uni   the runner in the engine's own thread (default): execute() is a method call
    mp    the runner in a worker process (`python -m inflight.worker FD`: a fresh
          interpreter sharing no threads or CUDA context with the engine, whatever the parent's
          __main__ is), driven over a socket pair: the engine process never imports the model code

Both speak only the two messages of outputs.py: `SchedulerOutput` in, `ModelRunnerOutput` out.
The engine asks the executor, not the runner, how many KV blocks fit once the weights are
loaded, then has it allocate them. A worker that dies (killed, out of memory) turns the next
call into a `WorkerDiedError`: the engine fails every live request and reports unhealthy.
"""

from __future__ import annotations

import logging
import pickle
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from inflight.config import EngineConfig
from inflight.outputs import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

BACKENDS = ("uni", "mp")


class WorkerDiedError(RuntimeError):
    """The model worker is gone: nothing more can run (the engine is dead, not just this step)."""

    fatal = True


class UniExecutor:
    """The runner in this thread."""

    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        from inflight.worker.model_runner import ModelRunner

        self.runner = ModelRunner(config, progress=progress)

    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks()

    def allocate_kv_cache(self, config: EngineConfig, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(config, num_blocks)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute(out)

    def shutdown(self) -> None:
        pass


class MultiprocExecutor:
    """The runner in a spawned worker process; one request/reply per call over a pipe."""

    runner = None  # nothing of the model lives in this process

    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        ours, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "inflight.worker", str(theirs.fileno()), str(logging.getLogger("inflight").getEffectiveLevel())], pass_fds=[theirs.fileno()]
        )
        theirs.close()  # only the worker holds its end: its death reads as EOF here
        self._conn = Connection(ours.detach())
        self._dead: str | None = None
        # seconds spent in execute() calls, and the part the worker spent running them: the
        # difference is what crossing the process boundary costs (benchmarks/executor_overhead.py)
        self.call_seconds = 0.0
        self.worker_seconds = 0.0
        self.num_calls = 0
        self._blocks: int = self._call("load", config, progress)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def num_kv_blocks(self) -> int:
        return self._blocks

    def allocate_kv_cache(self, config: EngineConfig, num_blocks: int) -> None:
        self._call("allocate", config, num_blocks)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        start = time.perf_counter()
        result, seconds = self._call("execute", out)
        self.call_seconds += time.perf_counter() - start
        self.worker_seconds += seconds
        self.num_calls += 1
        return result  # type: ignore[no-any-return]

    def _call(self, op: str, *args: Any) -> Any:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        try:
            self._conn.send_bytes(pickle.dumps((op, args), protocol=pickle.HIGHEST_PROTOCOL))
            ok, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as e:
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                code = self._proc.wait()
            self._dead = f"model worker process died (exit code {code})"
            raise WorkerDiedError(self._dead) from e
        if not ok:
            error = RuntimeError(f"model worker: {value}")
            error.fatal = value.startswith("fatal: ")  # type: ignore[attr-defined]
            raise error
        return value

    def shutdown(self) -> None:
        if self._proc.poll() is None:
            try:
                self._conn.send_bytes(pickle.dumps(("stop", ())))
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._dead = self._dead or "shut down"

    def __del__(self) -> None:  # an engine dropped without shutdown() must not leave a worker behind
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


def worker_main(conn: Connection) -> None:
    """The worker process: build the runner, then answer calls until told to stop."""
    from inflight.worker.model_runner import ModelRunner

    runner: ModelRunner | None = None
    while True:
        try:
            op, args = pickle.loads(conn.recv_bytes())
        except EOFError:  # the engine is gone
            return
        if op == "stop":
            return
        try:
            if op == "load":
                runner = ModelRunner(*args)
                value: Any = runner.num_kv_blocks()
            elif op == "allocate":
                assert runner is not None
                value = runner.allocate_kv_cache(*args)
            else:
                assert runner is not None
                start = time.perf_counter()
                value = runner.execute(*args)
                value = (value, time.perf_counter() - start)
            reply = (True, value)
        except Exception as e:  # reported to the engine; the worker stays up for the next call
            fatal = (
                "fatal: " if getattr(e, "fatal", False) else ""
            )  # the device is unusable (model_runner._is_fatal)
            reply = (False, f"{fatal}{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
        conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def make_executor(config: EngineConfig, backend: str, progress: bool = True) -> UniExecutor | MultiprocExecutor:
    if backend == "uni":
        return UniExecutor(config, progress)
    if backend == "mp":
        return MultiprocExecutor(config, progress)
    raise ValueError(f"distributed_executor_backend: {backend!r}; use one of {', '.join(BACKENDS)}")
