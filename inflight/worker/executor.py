"""Executors: how the engine reaches its model runner (vLLM's `distributed_executor_backend`).

    uni   the runner in the engine's process (default): in its thread on CPU, on a runner thread
          of its own on a GPU with async scheduling (steps overlap the engine's host work)
    mp    the runner in a worker process (`python -m inflight.worker FD`: a fresh
          interpreter sharing no threads or CUDA context with the engine, whatever the parent's
          __main__ is), driven over a socket pair: the engine process never imports the model code
    tensor_parallel_size > 1: one such worker per rank (`TensorParallelExecutor`); the engine
          talks to rank 0, which hands every call to the other ranks (worker/distributed.py)

Both speak only the two messages of outputs.py: `SchedulerOutput` in, `ModelRunnerOutput` out.
The engine asks the executor, not the runner, how many KV blocks fit once the weights are
loaded, then has it allocate them. A worker that dies (killed, out of memory) turns the next
call into a `WorkerDiedError`: the engine fails every live request and reports unhealthy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from inflight.config import EngineConfig
from inflight.outputs import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from inflight.worker.distributed import RankPlace

logger = logging.getLogger(__name__)

BACKENDS = ("uni", "mp")
T = TypeVar("T")


class WorkerDiedError(RuntimeError):
    """The model worker is gone: nothing more can run (the engine is dead, not just this step)."""

    fatal = True


class UniExecutor:
    """The runner in this process. On a GPU with async scheduling it runs on a thread of its own
    (`threaded`): the engine schedules step N+1 and turns step N-1's output into responses while
    the runner thread waits on the GPU for step N (a decode step's wait releases the GIL), so
    the GPU no longer idles through the engine's host work between steps (on the H100,
    docs/GPU.md: ~12 ms of a 256-request step before the engine's host cost was cut). The runner
    thread does all of the runner's work, loading and graph capture included, so one thread owns
    the model (the libgomp invariant of docs/ARCHITECTURE.md) and steps run in the order sent.
    On CPU the runner stays in the engine's thread: there the forward's OpenMP team has every
    core, and a second busy thread would take one from it."""

    def __init__(self, config: EngineConfig, progress: bool = True, threaded: bool = False) -> None:
        from inflight.worker.model_runner import ModelRunner

        self.pipelined = threaded  # a step runs when submitted: the engine can schedule the next meanwhile
        # the current CUDA device is per thread: the runner thread's is the model's
        self._pool = ThreadPoolExecutor(1, "inflight-runner", _use_device, (config.model.device,)) if threaded else None
        self.runner = self._run(ModelRunner, config, progress=progress)
        self._submitted: list[SchedulerOutput | Future[ModelRunnerOutput]] = []

    def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs) if self._pool is None else self._pool.submit(fn, *args, **kwargs).result()

    def submit(self, out: SchedulerOutput) -> None:
        self._submitted.append(out if self._pool is None else self._pool.submit(self.runner.execute, out))

    def collect(self) -> ModelRunnerOutput:
        step = self._submitted.pop(0)
        return step.result() if isinstance(step, Future) else self.runner.execute(step)

    def drain(self) -> None:
        """Wait for (threaded) and drop every step still submitted (after a failed step)."""
        steps, self._submitted = self._submitted, []
        for step in steps:
            if isinstance(step, Future):
                with contextlib.suppress(Exception):  # the step's error was reported with the first one
                    step.result()

    def num_kv_blocks(self) -> int:
        return self._run(self.runner.num_kv_blocks)

    def allocate_kv_cache(self, config: EngineConfig, num_blocks: int) -> None:
        self._run(self.runner.allocate_kv_cache, config, num_blocks)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.submit(out)
        return self.collect()

    def shutdown(self) -> None:
        pass  # an engine may still step after shutdown() (nothing to stop); the thread ends with the pool


def _use_device(device: Any) -> None:
    if device.type == "cuda" and device.index is not None:
        import torch

        torch.cuda.set_device(device)


def spawn_worker(fd: int | None, place: RankPlace | None = None, sharers: int = 1) -> subprocess.Popen[bytes]:
    """`python -m inflight.worker FD LOGLEVEL`: FD its end of the engine's socket pair ("-" for a
    rank other than 0), a rank's place in its environment. `sharers`: model processes splitting
    this machine's cores (tensor-parallel ranks x data-parallel replicas): each gets its share."""
    env = None
    if place is not None or sharers > 1:
        from inflight.worker.distributed import threads_per_rank

        env = {**os.environ, **(place.env() if place is not None else {}), "INFLIGHT_CORE_SHARERS": str(sharers)}
        if place is None or place.backend == "gloo":  # the OpenMP runtime reads it once, at start
            env["OMP_NUM_THREADS"] = str(threads_per_rank(sharers)[0])
    level = str(logging.getLogger("inflight").getEffectiveLevel())
    args = [sys.executable, "-m", "inflight.worker", "-" if fd is None else str(fd), level]
    return subprocess.Popen(args, pass_fds=[] if fd is None else [fd], env=env)


def watch(proc: subprocess.Popen[bytes], name: str, closing: threading.Event) -> None:
    """Reap `proc` the moment it exits (a killed worker is never left a zombie) and say so in the
    log unless the executor is shutting down. Popen's wait is thread-safe: the executor's own
    polls see the exit code this thread collected."""

    def run() -> None:
        code = proc.wait()
        if not closing.is_set():
            logger.error("%s (pid %d) exited with code %d", name, proc.pid, code)

    threading.Thread(target=run, name=f"inflight-reap-{proc.pid}", daemon=True).start()


class MultiprocExecutor:
    """The runner in a spawned worker process; one request/reply per call over a pipe.

    Steps are submitted and collected separately, and the worker answers them in order, so the
    engine can send step N+1 before it reads step N's output (async scheduling): the worker
    finds the next step waiting when it finishes one."""

    runner = None  # nothing of the model lives in this process
    pipelined = True
    # a call that fails is one failed step; the worker stays up (True: the engine dies)
    errors_fatal = False
    step_timeout_s: float | None = None  # a step not answered by then kills the engine (None: wait)

    def __init__(
        self, config: EngineConfig, progress: bool = True, place: RankPlace | None = None, sharers: int | None = None
    ) -> None:
        ours, theirs = socket.socketpair()
        self._proc = spawn_worker(theirs.fileno(), place, sharers or config.parallel.core_sharers)
        self._closing = getattr(self, "_closing", threading.Event())
        watch(self._proc, "model worker" if place is None else f"model worker rank {place.rank}", self._closing)
        theirs.close()  # only the worker holds its end: its death reads as EOF here
        self._conn = Connection(ours.detach())
        self._dead: str | None = None
        # seconds spent in execute() calls, and the part the worker spent running them: the
        # difference is what crossing the process boundary costs (benchmarks/executor_overhead.py)
        self.call_seconds = 0.0
        self.worker_seconds = 0.0
        # seconds the worker sat waiting for its next step between two steps (what async
        # scheduling hides; the first step after an idle spell is not counted)
        self.worker_idle_seconds = 0.0
        self.num_calls = 0
        self._in_flight: list[float] = []  # submit times of the steps sent and not yet collected
        self._blocks: int = self._call("load", config, progress)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def num_kv_blocks(self) -> int:
        return self._blocks

    def allocate_kv_cache(self, config: EngineConfig, num_blocks: int) -> None:
        self._call("allocate", config, num_blocks)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.submit(out)
        return self.collect()

    def submit(self, out: SchedulerOutput) -> None:
        """Send a step; the worker runs the steps it is sent in order."""
        self._send("execute", (out,))
        self._in_flight.append(time.perf_counter())

    def collect(self) -> ModelRunnerOutput:
        """The output of the oldest step submitted and not collected yet."""
        start = self._in_flight.pop(0)
        result, seconds, idle = self._recv("execute")
        self.call_seconds += time.perf_counter() - start
        self.worker_seconds += seconds
        self.worker_idle_seconds += idle
        self.num_calls += 1
        return result  # type: ignore[no-any-return]

    def drain(self) -> None:
        """Read and drop the outputs of every step still in flight (after a failed step)."""
        while self._in_flight:
            self._in_flight.pop()
            try:
                self._recv("execute")
            except Exception:  # noqa: BLE001 - the step's error was reported with the first one
                if self._dead is not None:
                    self._in_flight.clear()

    def _call(self, op: str, *args: Any) -> Any:
        self._send(op, args)
        return self._recv(op)

    def _send(self, op: str, args: tuple[Any, ...]) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        try:
            self._conn.send_bytes(pickle.dumps((op, args), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as e:
            self._died(e)

    def _recv(self, op: str) -> Any:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)
        try:
            if op == "execute" and self.step_timeout_s is not None and not self._conn.poll(self.step_timeout_s):
                self._dead = f"model worker: no answer to a step within {self.step_timeout_s:g} s (collective_timeout_s): a hung rank"
                logger.error("%s; stopping every rank, the engine is dead", self._dead)
                self._stop_all()
                raise WorkerDiedError(self._dead)
            ok, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as e:
            self._died(e)
        if not ok:
            if self.errors_fatal:
                self._dead = f"model worker: {value}"
                raise WorkerDiedError(self._dead)
            error = RuntimeError(f"model worker: {value}")
            error.fatal = value.startswith("fatal: ")  # type: ignore[attr-defined]
            raise error
        return value

    def _died(self, e: BaseException) -> NoReturn:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._dead = f"model worker process died (exit code {code})"
        raise WorkerDiedError(self._dead) from e

    def _stop_all(self) -> None:
        """A hung worker is killed (SIGKILL ends a stopped process too) and reaped."""
        self._closing.set()
        self._proc.kill()
        self._proc.wait()

    def shutdown(self) -> None:
        self._closing.set()
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
            if (closing := getattr(self, "_closing", None)) is not None:
                closing.set()  # our own kill: not a worker death to log
            proc.kill()


class TensorParallelExecutor(MultiprocExecutor):
    """tensor_parallel_size ranks, one worker process each; the engine talks to rank 0 only.

    On one node it spawns every rank; with several nodes, the ranks of node 0 (the others are
    started there: `inflight serve --node-rank K`); under torchrun (this process is RANK 0)
    only rank 0's worker, the other ranks being torchrun's processes. A failed call is fatal:
    the ranks may be out of step, so the engine fails its requests and reports unhealthy.
    """

    errors_fatal = True
    # ranks other than 0 do not sample: they learn each token from the next step's message, so
    # that message can only be built once the step's output is read
    pipelined = False

    def __init__(self, config: EngineConfig, progress: bool = True) -> None:
        from inflight.worker.distributed import RankPlace, node_places

        par = config.parallel
        backend = "nccl" if config.model.device.type == "cuda" else "gloo"
        torchrun = RankPlace.from_env()
        if torchrun is not None:
            if torchrun.rank != 0 or torchrun.world_size != par.tensor_parallel_size:
                raise ValueError(
                    f"tensor_parallel_size: {par.tensor_parallel_size}, but torchrun started rank "
                    f"{torchrun.rank} of WORLD_SIZE {torchrun.world_size} (the front end runs on rank 0)"
                )
            places = [replace(torchrun, backend=backend, timeout_s=par.collective_timeout_s)]
            sharers = torchrun.local_world_size  # torchrun's processes on this node
        else:
            places = node_places(par, 0, backend)
            sharers = par.core_sharers
        self.places = places
        # a step not answered within one collective timeout fails the engine and stops the ranks
        # (rank 0 itself waits on a hung rank in the control group's broadcast, which has no
        # such timeout: cutting the step at one collective timeout is the documented bound)
        self.step_timeout_s = par.collective_timeout_s
        self._closing = threading.Event()
        self._followers = [spawn_worker(None, p, sharers) for p in places[1:]]
        for p, proc in zip(places[1:], self._followers, strict=True):
            watch(proc, f"model worker rank {p.rank}", self._closing)
        try:
            super().__init__(config, progress, places[0], sharers)
        except BaseException:  # a rank failed to start or load: none may linger
            for proc in [getattr(self, "_proc", None), *self._followers]:
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            raise

    @property
    def pids(self) -> list[int]:
        """Every local rank's process id, rank 0 first."""
        return [self._proc.pid] + [p.pid for p in self._followers]

    def shutdown(self) -> None:
        super().shutdown()  # rank 0 tells the others to stop
        self._stop_followers()

    def _stop_all(self) -> None:
        super()._stop_all()
        for proc in self._followers:
            proc.kill()
            proc.wait()

    def _stop_followers(self, wait: float = 10) -> None:
        for proc in self._followers:
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __del__(self) -> None:
        super().__del__()
        for proc in getattr(self, "_followers", []):
            if proc.poll() is None:
                proc.kill()


def runner_thread(config: EngineConfig) -> bool:
    """Whether `uni` runs the runner on a thread of its own: `INFLIGHT_RUNNER_THREAD` 1, else (0 / auto)
    in the engine's thread. Off by default: on the H100 (2026-11-27,
    docs/GPU.md) the thread made offline 256 x (512 -> 256) 8 % slower (6,647 vs 7,198 tok/s in one
    report): its kernel launches and the engine's host work contend for the GIL."""
    env = os.environ.get("INFLIGHT_RUNNER_THREAD", "auto") or "auto"
    if env not in ("0", "1", "auto"):
        raise ValueError(f"INFLIGHT_RUNNER_THREAD: {env!r} is not one of 0, 1, auto")
    return env == "1"


def make_executor(config: EngineConfig, backend: str, progress: bool = True) -> UniExecutor | MultiprocExecutor:
    if config.parallel.tensor_parallel_size > 1:
        return TensorParallelExecutor(config, progress)
    if backend == "uni":
        return UniExecutor(config, progress, threaded=runner_thread(config))
    if backend == "mp":
        return MultiprocExecutor(config, progress)
    raise ValueError(f"distributed_executor_backend: {backend!r}; use one of {', '.join(BACKENDS)}")
