"""The engine thread's side of an `AsyncEngine` (engine/async_engine.py): the step loop, the inbox
it drains between steps, what it publishes after each step (outputs to the registered streams,
the `StatsSnapshot`), and how it dies (every open stream ends with `EngineDeadError`). Only the
engine thread runs these methods; callers put messages on `inbox` and read `stats`."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from inflight.engine.client import EngineDeadError, StatsSnapshot
from inflight.engine.inbox import AbortRequest, AddRequest, CallFn, InboxMessage, Shutdown, run_call
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.streams import Streams
from inflight.memory import Trimmer
from inflight.outputs import RequestOutput
from inflight.request import FinishReason, Request

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05  # how long the idle loop blocks on its inbox before re-checking
# a step that raised fails only its own requests; this many in a row and the engine is declared
# dead (/health 503): something broken for every request, not one request's input
_MAX_FAILED_STEPS = 3


class EngineThread:
    def __init__(self, engine: LLMEngine, streams: Streams) -> None:
        self.engine = engine
        self.streams = streams
        self.inbox: queue.Queue[InboxMessage] = queue.Queue()
        self.stop = threading.Event()
        self.errored: BaseException | None = None  # the last exception a step raised
        self.observers: list[Callable[[RequestOutput], None]] = []
        self.num_steps = 0
        self.failed_steps = 0  # steps in a row that raised
        self.last_step_s = 0.0  # the last step's duration (AsyncEngine.work_budget_s)
        self.trimmer = Trimmer()  # hands malloc's free pages back (glibc): inflight/memory.py
        self.stats = self.snapshot()  # the engine thread has not started: reading here is safe

    def unregister(self, request_id: str, abort: bool) -> None:
        self.streams.unregister(request_id)
        if abort:
            self.inbox.put(AbortRequest(request_id))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.run_once()
        except BaseException as e:  # the loop itself broke: fail everyone, report unhealthy
            logger.exception("engine loop stopped")
            self.die(f"{type(e).__name__}: {e}")

    def run_once(self) -> None:
        while self.streams.dropped:
            self.unregister(*self.streams.dropped.popleft())
        try:
            busy = self.engine.has_unfinished_requests()
            got = self.drain_inbox(block=not busy)
            if not self.engine.has_unfinished_requests():
                if got:
                    self.publish([])
                self.trimmer.idle()
                return
            start = time.perf_counter()
            outputs = self.engine.step()
            seconds = time.perf_counter() - start
            self.last_step_s = seconds
            self.streams.observe_step(self.engine.last_step_tokens, seconds)
            self.num_steps += 1
            self.failed_steps = 0
            self.trimmer.after_step(busy=self.engine.has_unfinished_requests())
        except Exception as e:  # a bug fails the step's requests, never this thread
            logger.exception("engine step failed")
            self.errored = e
            self.failed_steps += 1
            error = f"engine error: {type(e).__name__}: {e}"
            # e.g. the model worker process died, or the CUDA context is gone: nothing can run
            fatal = getattr(e, "fatal", False) or self.failed_steps >= _MAX_FAILED_STEPS
            try:
                outputs = self.engine.finish_all(error) if fatal else self.engine.fail_step(error)
            except Exception:
                logger.exception("failing the step's requests failed")
                raise e from None
            if fatal:  # observers count them; the streams end with EngineDeadError from _die
                self.publish(outputs, to_streams=False)
                raise
        self.publish(outputs)

    def drain_inbox(self, block: bool) -> bool:
        """Handle every queued message; False if there were none."""
        try:
            msg = self.inbox.get(timeout=_IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            match msg:
                case AddRequest(request):
                    self.add(request)
                case AbortRequest(request_id):
                    self.engine.abort_request(request_id, FinishReason.ABORT)
                case CallFn():
                    run_call(msg)
                case Shutdown():
                    pass  # _stop is set: the loop ends after this drain
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def add(self, request: Request) -> None:
        stream = self.streams.get(request.request_id)
        if stream is None:  # the caller went away before the engine saw the request
            return
        try:
            self.engine.add_request(request)
        except Exception as e:  # e.g. an id whose earlier request is still being aborted
            loop, q = stream
            loop.call_soon_threadsafe(q.put_nowait, e)

    def snapshot(self, dead: str | None = None) -> StatsSnapshot:
        s = self.engine.stats()
        return StatsSnapshot(
            num_running=s.num_running, num_waiting=s.num_waiting, kv_cache_usage=s.kv_cache_usage,
            prefix_cache_hit_rate=s.prefix_cache_hit_rate, num_preemptions=s.num_preemptions, lora=s.lora,
            worker_busy_s=s.worker_busy_s, worker_idle_s=s.worker_idle_s,
            num_steps=self.num_steps, published_at=time.monotonic(),
            last_error=None if self.errored is None else f"{type(self.errored).__name__}: {self.errored}", dead=dead,
        )  # fmt: skip

    def publish(self, outputs: list[RequestOutput], to_streams: bool = True) -> None:
        self.stats = self.snapshot()  # one reference assignment: readers see the old or the new
        for fn in self.observers:
            for out in outputs:
                try:
                    fn(out)
                except Exception:  # an observer must never take the engine down
                    logger.exception("output observer failed")
        if to_streams:
            self.streams.deliver(outputs)

    def die(self, reason: str) -> None:
        """Mark the engine dead and end every open stream with an error (nothing waits forever)."""
        try:
            snap = self.snapshot(dead=reason)
        except Exception:  # engine state may be what broke
            snap = StatsSnapshot(num_steps=self.num_steps, published_at=time.monotonic(), dead=reason)
        self.stats = snap
        error = EngineDeadError(f"engine: not running ({reason})")
        self.streams.fail_all(error)
        while True:  # calls queued before the end: settle them too
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, CallFn):
                msg.loop.call_soon_threadsafe(lambda f=msg.future: f.done() or f.set_exception(error))
