"""AsyncEngine: an asyncio front for the step loop, which runs on its own thread.

The engine thread owns all engine state. Callers tokenize and validate in
their own thread (`LLMEngine.make_request` is pure), then hand requests and
aborts over a thread-safe inbox; outputs come back per request through an
`asyncio.Queue` filled with `loop.call_soon_threadsafe`. A caller that stops
listening (client disconnect, cancellation) aborts its request, which is
finished and its blocks freed at the start of the next step.

All torch work of a server belongs on the engine thread: `launch` builds the engine
there and `call` runs other model work (the embedding encoder) there between steps.
With libgomp, a second thread that ever ran a parallel region keeps its own idle
OpenMP team, and once a process has more OpenMP threads than cores every team stops
spin-waiting between regions: each decode step then pays thousands of futex
sleeps and wake-ups (measured: a served run 0.8x the offline one, see ARCHITECTURE).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.tokenizer import PromptInput
from inflight.outputs import RequestOutput
from inflight.request import FinishReason, Request
from inflight.sampling_params import ParamError, SamplingParams

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05  # how long the idle loop blocks on its inbox before re-checking
T = TypeVar("T")


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        # request id -> (caller's loop, its queue of outputs, or of the exception that ended it)
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.errored: BaseException | None = None
        self._observers: list[Callable[[RequestOutput], None]] = []

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def launch(cls, build: Callable[[], LLMEngine]) -> AsyncEngine:
        """Build the engine on a new engine thread and run the step loop there.

        Returns once the engine is built; an exception from `build` is raised here.
        """
        built: queue.Queue[AsyncEngine | BaseException] = queue.Queue(maxsize=1)

        def run() -> None:
            try:
                self = cls(build())
            except BaseException as e:  # handed to the caller, which re-raises it
                built.put(e)
                return
            self._thread = threading.current_thread()
            built.put(self)
            self._loop()

        threading.Thread(target=run, name="inflight-engine", daemon=True).start()
        got = built.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="inflight-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def add_observer(self, fn: Callable[[RequestOutput], None]) -> None:
        """Call `fn(output)` on the engine thread for every output (metrics, logging)."""
        self._observers.append(fn)

    @property
    def num_unfinished(self) -> int:
        """Requests known to the engine or on their way to it (read from any thread)."""
        return len(self._streams)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ API
    async def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        priority: int = 5,
        timeout: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until the request finishes.

        Raises ParamError (before yielding anything) for invalid input.
        """
        request = self.engine.make_request(
            prompt, params, request_id=request_id or uuid.uuid4().hex, priority=priority, timeout=timeout
        )
        stream = self.submit(request)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()  # closing us must close the inner stream now (it sends the abort)

    async def submit(self, request: Request) -> AsyncIterator[RequestOutput]:
        """Run an already-built request (the server builds them with extra fields)."""
        self.start()
        if request.params.structured_outputs is not None and request.grammar is None:
            # compiling can take a while: a worker thread does it, the step loop never waits
            await asyncio.to_thread(self.engine.compile_grammar, request)
        rid = request.request_id
        q: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            if rid in self._streams:
                raise ParamError(f"request_id: {rid!r} is already in use", "request_id")
            self._streams[rid] = (asyncio.get_running_loop(), q)
        self._inbox.put(("add", request))
        finished = False
        try:
            while not finished:
                out = await q.get()
                if isinstance(out, BaseException):
                    finished = True
                    raise out
                finished = out.finished
                yield out
        finally:
            with self._lock:
                self._streams.pop(rid, None)
            if not finished:
                self._inbox.put(("abort", rid))

    async def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the engine thread, between two steps; its result or exception."""
        self.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._inbox.put(("call", (fn, args, loop, fut)))
        return await fut

    # ------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox(block=not self.engine.has_unfinished_requests())
                if not self.engine.has_unfinished_requests():
                    continue
                outputs = self.engine.step()
            except Exception as e:  # a bug must fail the live requests, never kill this thread
                logger.exception("engine step failed")
                self.errored = e
                outputs = self.engine.finish_all(f"engine error: {e}")
            self._publish(outputs)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "add":
                self._add(payload)
            elif kind == "call":
                self._call(*payload)
            else:
                self.engine.abort_request(payload, FinishReason.ABORT)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, request: Request) -> None:
        with self._lock:
            stream = self._streams.get(request.request_id)
        if stream is None:  # the caller went away before the engine saw the request
            return
        try:
            self.engine.add_request(request)
        except Exception as e:  # e.g. an id whose earlier request is still being aborted
            loop, q = stream
            loop.call_soon_threadsafe(q.put_nowait, e)

    @staticmethod
    def _call(fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> None:
        def settle(ok: bool, value: Any) -> None:
            if not fut.done():  # the caller may have been cancelled meanwhile
                fut.set_result(value) if ok else fut.set_exception(value)

        try:
            result, ok = fn(*args), True
        except Exception as e:
            result, ok = e, False
        loop.call_soon_threadsafe(settle, ok, result)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        for fn in self._observers:
            for out in outputs:
                try:
                    fn(out)
                except Exception:  # an observer must never take the engine down
                    logger.exception("output observer failed")
        with self._lock:
            targets = [(self._streams.get(o.request_id), o) for o in outputs]
        for stream, out in targets:
            if stream is not None:
                loop, q = stream
                loop.call_soon_threadsafe(q.put_nowait, out)
