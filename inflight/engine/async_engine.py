"""AsyncEngine: the engine client the server talks to; the step loop runs on its own thread.

The engine thread owns all engine state. Callers tokenize and validate in their own thread
(`make_request` is pure; the server runs it in the input threads, `run_input`), then register
requests (`submit` / `submit_all`: admission, engine/admission.py, is decided there, under the
lock, all or none) and hand typed messages (`AddRequest`, `AbortRequest`, `CallFn`, `Shutdown`)
over a thread-safe inbox; outputs come back per request through a `RequestStream` (an
`asyncio.Queue` filled with `loop.call_soon_threadsafe`). A caller that stops listening
(client disconnect, cancellation, a stream dropped unread) aborts its request, which is
finished and its blocks freed at the start of the next step. After each step the engine thread publishes an immutable
`StatsSnapshot` (`stats`), which /metrics and /health read without touching engine
state. Facts about the model the routes need are in `model_info`, fixed at start.

The server uses only the `EngineClient` interface (engine/client.py, a typing.Protocol that this
class and the data-parallel `ReplicaRouter` implement). `engine` (the LLMEngine) is for tests and
offline code on the engine thread.

All torch work of a server belongs on the engine thread: `launch` builds the engine
there and `call` runs other model work (the embedding encoder) there between steps.
With libgomp, a second thread that ever ran a parallel region keeps its own idle
OpenMP team, and once a process has more OpenMP threads than cores every team stops
spin-waiting between regions: each decode step then pays thousands of futex
sleeps and wake-ups (measured: a served run 0.8x the offline one, see ARCHITECTURE).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from typing_extensions import Unpack

from inflight.engine.admission import DeadlineError, QueueFullError
from inflight.engine.client import (
    EngineClient,
    EngineDeadError,
    EngineRequest,
    ModelInfo,
    RequestFailedError,
    RequestStream,
    StatsSnapshot,
    stream_request,
)
from inflight.engine.engine_thread import EngineThread
from inflight.engine.inbox import AbortRequest, AddRequest, CallFn, Shutdown
from inflight.engine.input_processor import RequestOptions
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.streams import Streams
from inflight.engine.tokenizer import PromptInput
from inflight.outputs import RequestOutput
from inflight.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_LARGE_INPUT_CHARS = 1 << 16  # ~10 ms to tokenize; larger inputs are tokenized in their own lane
T = TypeVar("T")

__all__ = [
    "AsyncEngine", "DeadlineError", "EngineClient", "EngineDeadError", "EngineRequest", "ModelInfo", "QueueFullError",
    "RequestFailedError", "RequestStream", "StatsSnapshot", "stream_request",
]  # fmt: skip



class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        model = engine.config.model
        self._model_info = ModelInfo(
            path=model.path, architecture=model.architecture, max_model_len=engine.max_model_len,
            max_prompt_len=min(engine.max_model_len - 1, engine.config.max_input_tokens or engine.max_model_len),
            vocab_size=model.vocab_size, dtype=str(model.dtype).removeprefix("torch."), device=str(model.device),
            max_prompt_chars=engine.inputs.max_prompt_chars, lora_enabled=engine.adapters.registry is not None,
            max_num_seqs=engine.config.scheduler.max_num_seqs,
        )  # fmt: skip
        self.streams = Streams()  # the registered requests' queues and admission (engine/streams.py)
        self._streams, self._tickets = self.streams.queues, self.streams.tickets
        self.admission = self.streams.admission
        self._et = self._step_loop(engine)  # the step loop's side (engine/engine_thread.py)
        self._inbox = self._et.inbox
        # tokenization and chat templates run in these threads, never on the event loop (the Rust
        # tokenizer releases the GIL): one lane for large inputs, one for the rest, so a 4 MiB
        # prompt (seconds) never holds up a short one, and at most one large input is tokenized at once
        self._input_pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"inflight-input-{lane}") for lane in ("small", "large")]
        # grammar compiles have their own threads: never queued behind media fetches or other to_thread work
        self._grammar_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="inflight-grammar")
        self._thread: threading.Thread | None = None

    def _step_loop(self, engine: LLMEngine) -> EngineThread:
        """The side that steps `engine` (a `CoreEngine` talks to another process instead)."""
        return EngineThread(engine, self.streams)

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
            self._et.run()

        threading.Thread(target=run, name="inflight-engine", daemon=True).start()
        got = built.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._et.run, name="inflight-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        for pool in [*self._input_pools, self._grammar_pool]:
            pool.shutdown(wait=False, cancel_futures=True)
        self._et.stop.set()
        self._inbox.put(Shutdown())  # wakes an idle loop now
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.engine.shutdown()

    def add_observer(self, fn: Callable[[RequestOutput], None]) -> None:
        """Call `fn(output)` on the engine thread for every output (metrics, logging)."""
        self._et.observers.append(fn)

    @property
    def num_unfinished(self) -> int:
        """Requests known to the engine or on their way to it (read from any thread)."""
        return len(self.streams)

    @property
    def num_queued_sequences(self) -> int:
        """Engine sequences held by registered requests (what `queue_limit` counts)."""
        return self.admission.num_sequences

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stats(self) -> StatsSnapshot:
        """The snapshot the engine thread published last (a plain read: no engine state)."""
        return self._et.stats

    @property
    def errored(self) -> BaseException | None:
        """The last exception a step raised."""
        return self._et.errored

    @property
    def model_info(self) -> ModelInfo:
        """What the routes may know about the served model, fixed once the engine is built."""
        return self._model_info

    @property
    def tokenizer(self) -> Any | None:
        """The model's tokenizer (None: the model serves token ids only). Thread-safe to encode with."""
        return self.engine.tokenizer

    @property
    def takes_images(self) -> bool:
        """A vision-language model: chat image / video parts are accepted."""
        return self.engine.inputs.vision_processor is not None

    def process_media(self, modality: str, value: Any) -> Any:
        """Preprocess an image / video for `make_request` (NumPy + Pillow: call it off the event
        loop); ParamError for a text model."""
        return self.engine.inputs.process_media(modality, value)

    # ------------------------------------------------------------ API
    def make_request(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> EngineRequest:
        """Tokenize and validate on the caller's thread (ParamError if invalid); `submit` runs it.
        Options: `RequestOptions` (engine/input_processor.py); the request id defaults to a uuid."""
        if options.get("request_id") is None:
            options["request_id"] = uuid.uuid4().hex
        return self.engine.make_request(prompt, params, **options)

    # ------------------------------------------------------------ LoRA adapters
    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Read and register a PEFT adapter directory, on the engine thread (ParamError if it does not fit)."""
        await self.call(self.engine.adapters.load, name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        await self.call(self.engine.adapters.unload, name)

    def lora_adapters(self) -> list[tuple[str, str]]:
        """(name, directory) of the adapters served by name; [] when LoRA is off. Any thread: the
        registry copies its table under its own lock, which the engine thread holds to change it
        (so an adapter is listed as soon as `load_lora_adapter` returns)."""
        return self.engine.adapters.listed()

    async def compile_grammars(self, requests: Sequence[EngineRequest]) -> None:
        """Compile the requests' structured-output grammars in a worker thread, off the step loop
        (ParamError if one is invalid). Requests of one body share a grammar: the backend's cache
        compiles it once."""
        constrained = [r for r in requests if r.params.structured_outputs is not None]
        if constrained:
            await asyncio.get_running_loop().run_in_executor(
                self._grammar_pool, lambda: [self.engine.compile_grammar(r) for r in constrained]
            )

    async def make_request_async(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> EngineRequest:
        """`make_request` in an input thread: a long prompt never holds up the event loop."""
        size = len(prompt) if isinstance(prompt, str) else 0
        return await self.run_input(lambda: self.make_request(prompt, params, **options), size)

    async def run_input(self, fn: Callable[[], T], size: int = 0) -> T:
        """`fn()` in an input thread (tokenizing, chat templates): off the event loop and off the
        engine thread. `size`: the characters of text it handles (large inputs take their own lane).
        No torch work belongs here (see the module docstring)."""
        pool = self._input_pools[size > _LARGE_INPUT_CHARS]
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def generate(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> AsyncIterator[RequestOutput]:
        """Yield incremental outputs until the request finishes.

        Raises ParamError (before yielding anything) for invalid input.
        """
        request = await self.make_request_async(prompt, params, **options)
        async for out in stream_request(self, request):
            yield out

    def submit(self, request: EngineRequest, *, queue_limit: int | None = None) -> RequestStream:
        """Queue a request built by `make_request` (grammar compiled: `compile_grammars`); its stream."""
        return self.submit_all([request], queue_limit=queue_limit)[0]

    def submit_all(
        self, requests: Sequence[EngineRequest], *, queue_limit: int | None = None, field: str = "prompt"
    ) -> list[RequestStream]:
        """Register and queue requests together, or none of them: a duplicate id is a ParamError,
        more sequences than `queue_limit` allows a QueueFullError (a ParamError naming `field`, the
        body's list of inputs, if they could never fit), a timeout that can't be met a
        DeadlineError (admission.py). Call from the event loop the streams are read on."""
        self._check_alive()
        self.start()
        queues = self.streams.register(requests, queue_limit, field)
        streams = [RequestStream(self, r.request_id, q) for r, q in zip(requests, queues)]
        if self._et.stats.dead is not None:  # EngineThread.die marks dead, then fails the streams registered by then
            for st in streams:
                st.close(abort=False)
            self._check_alive()
        for r in requests:
            self._inbox.put(AddRequest(r))
        return streams

    @contextlib.contextmanager
    def hold(self, sequences: int, queue_limit: int | None = None, field: str = "input") -> Iterator[None]:
        """Count work that is not an engine request (the embedding encoder's inputs) against the
        queue limit while it runs; QueueFullError if it doesn't fit now, ParamError if never."""
        with self.streams.hold(sequences, queue_limit, field):
            yield

    def unregister(self, request_id: str, abort: bool) -> None:
        """A stream is closed (`RequestStream.close`): its queue goes, and its request is aborted if `abort`."""
        self._et.unregister(request_id, abort)

    async def abort(self, request_id: str) -> None:
        self._inbox.put(AbortRequest(request_id))

    def abort_all(self) -> int:
        """Abort every registered request (the end of a shutdown drain): each stream ends with
        its final output, finish reason `abort`. Returns how many were asked to stop."""
        ids = self.streams.ids()
        for rid in ids:
            self._inbox.put(AbortRequest(rid))
        return len(ids)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the engine thread, between two steps; its result or exception."""
        self._check_alive()
        self.start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._inbox.put(CallFn(fn, args, loop, fut))
        return await fut

    def work_budget_s(self) -> float:
        """Seconds of other model work (the embedding encoder) the engine thread may do between two
        steps; call it there. While requests run: half the last step's time, so their inter-token
        latency stays under 2x (1.5x plus the work's granularity); idle: 0.1 s, so a new request
        waits at most that."""
        if not self.engine.has_unfinished_requests():
            return 0.1
        return max(0.5 * self._et.last_step_s, 0.002)

    def _check_alive(self) -> None:
        if self._et.stats.dead is not None:
            raise EngineDeadError(f"engine: not running ({self._et.stats.dead})")
