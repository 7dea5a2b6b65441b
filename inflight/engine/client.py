"""The engine client: the interface the server (and `LLM`-free callers) use, as a type.

`EngineClient` is what `AsyncEngine` (one engine, engine/async_engine.py) and `ReplicaRouter`
(data-parallel replicas, engine/router.py) both are; tests/unit/test_engine_client_protocol.py
checks that each has every member with the same signature. The values it hands out live here
too: the request handle, the per-request `RequestStream`, `StatsSnapshot` and `ModelInfo`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from typing_extensions import Unpack

from inflight.engine.adapters import LoRAStats
from inflight.engine.input_processor import RequestOptions
from inflight.engine.tokenizer import PromptInput
from inflight.outputs import RequestOutput
from inflight.request import Request
from inflight.sampling_params import SamplingParams

T = TypeVar("T")

# The request handle `make_request` returns and `submit` takes; callers treat it as opaque.
EngineRequest = Request


@dataclass(frozen=True)
class StatsSnapshot:
    """The engine's state after a step, published by the engine thread (read from any thread)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of blocks in use (cached-free blocks count as free)
    prefix_cache_hit_rate: float = 0.0  # prompt tokens served from the cache / looked up
    num_preemptions: int = 0  # since start
    num_steps: int = 0  # engine steps run since start
    published_at: float = 0.0  # time.monotonic() of publication
    # LoRA (None: off): host and device caches of the adapters (engine/adapters.py)
    lora: LoRAStats | None = None
    last_error: str | None = None  # the last failed step (its requests were failed; the engine goes on)
    dead: str | None = None  # the step loop has stopped: why (health is 503, new requests fail)
    # the model worker process (`mp`; None: the model runs in the engine thread): seconds it ran
    # steps, and seconds it waited for its next step between two steps (gaps over 50 ms, nothing
    # to run, excluded): idle / (busy + idle) is how much the engine process starves the model
    worker_busy_s: float | None = None
    worker_idle_s: float | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the routes may know about the served model; fixed once the engine is built."""

    path: str
    architecture: str
    max_model_len: int  # prompt + output tokens of one request (after KV-pool capping)
    max_prompt_len: int  # prompt tokens of one request at most: min(max_model_len - 1, max_input_tokens)
    vocab_size: int
    dtype: str  # "float32" | "bfloat16" | "float16"
    device: str  # "cpu" | "cuda" | "cuda:1" ...
    max_prompt_chars: int  # longer prompt text can't fit the input token limit: refused before tokenizing
    lora_enabled: bool = False  # adapters can be loaded (enable_lora)
    max_num_seqs: int = 64  # sequences of one request (n, best_of, beams) at most: the running batch


class EngineDeadError(RuntimeError):
    """The step loop has stopped; no request can run."""


class RequestFailedError(RuntimeError):
    """The engine failed this request (its step raised); other requests go on."""


class RequestStream:
    """One registered request's outputs, in order; an async iterator (`async for`, `aclose`).

    Registered when made (`AsyncEngine.submit`): the request is queued already. Closing it
    before the final output (or dropping it) aborts the request."""

    def __init__(self, engine: Any, request_id: str, q: asyncio.Queue[Any]) -> None:  # the AsyncEngine
        self._engine, self.request_id, self._q = engine, request_id, q
        self._finished = False
        self._closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        out = await self._q.get()
        if isinstance(out, BaseException):
            self._finished = True
            self.close(abort=False)
            raise out
        if out.finished:
            self._finished = True
            self.close(abort=False)
            if out.error is not None:
                raise RequestFailedError(out.error)
        return out  # type: ignore[no-any-return]

    def ready(self) -> bool:
        """An output (or the end) is queued: the next `__anext__` returns without waiting."""
        return not self._q.empty()

    async def aclose(self) -> None:
        self.close(abort=not self._finished)

    def close(self, abort: bool) -> None:
        """Stop reading: the engine forgets the stream, and aborts its request if `abort`."""
        if not self._closed:
            self._closed = True
            self._engine.unregister(self.request_id, abort)

    def __del__(self) -> None:  # never iterated or closed (a response that never started): abort it
        if not getattr(self, "_closed", True):
            self._closed = True
            # no locks here (the collector may run inside any locked region): the engine thread unregisters it
            self._engine.streams.dropped.append((self.request_id, not self._finished))


async def stream_request(client: EngineClient, request: EngineRequest) -> AsyncIterator[RequestOutput]:
    """`generate`'s body for any client with compile_grammars + submit (AsyncEngine, ReplicaRouter):
    compile the request's grammar, queue it, yield its outputs."""
    await client.compile_grammars([request])
    stream = client.submit(request)
    try:
        async for out in stream:
            yield out
    finally:
        await stream.aclose()  # closing us must close the inner stream now (it sends the abort)


@runtime_checkable
class EngineClient(Protocol):
    """What the server may ask of an engine; nothing else (tests/server/test_engine_client.py).
    Threads: `make_request` and `process_media` run in the caller's thread (the server: the input
    threads, `run_input`); the rest on the event loop the streams are read on."""

    # ------------------------------------------------ facts, fixed at start or published per step
    @property
    def tokenizer(self) -> Any | None: ...
    @property
    def model_info(self) -> ModelInfo: ...
    @property
    def takes_images(self) -> bool: ...
    @property
    def stats(self) -> StatsSnapshot: ...
    @property
    def num_unfinished(self) -> int: ...
    @property
    def num_queued_sequences(self) -> int: ...

    # ------------------------------------------------ requests
    def make_request(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> EngineRequest: ...
    async def make_request_async(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> EngineRequest: ...
    async def run_input(self, fn: Callable[[], T], size: int = 0) -> T: ...
    def process_media(self, modality: str, value: Any) -> Any: ...
    async def compile_grammars(self, requests: Sequence[EngineRequest]) -> None: ...
    def submit(self, request: EngineRequest, *, queue_limit: int | None = None) -> RequestStream: ...
    def submit_all(
        self, requests: Sequence[EngineRequest], *, queue_limit: int | None = None, field: str = "prompt"
    ) -> list[RequestStream]: ...
    def generate(
        self, prompt: PromptInput, params: SamplingParams | None = None, **options: Unpack[RequestOptions]
    ) -> AsyncIterator[RequestOutput]: ...
    def hold(self, sequences: int, queue_limit: int | None = None, field: str = "input") -> contextlib.AbstractContextManager[None]: ...
    async def abort(self, request_id: str) -> None: ...
    def abort_all(self) -> int: ...
    async def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    def work_budget_s(self) -> float: ...
    def add_observer(self, fn: Callable[[RequestOutput], None]) -> None: ...

    # ------------------------------------------------ LoRA adapters
    async def load_lora_adapter(self, name: str, path: str) -> None: ...
    async def unload_lora_adapter(self, name: str) -> None: ...
    def lora_adapters(self) -> list[tuple[str, str]]: ...
    def shutdown(self) -> None: ...
