"""What every route package shares: the engine client, the config, the shutdown state, the
metrics, and the request helpers (body reading, model-name checks, hang-up watching).

Each API package (`openai/`, `generate/`, `embeddings/`) builds its `APIRouter` from one
`ServerContext`; `build_app` (app.py) only composes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response

from inflight.engine.client import EngineClient
from inflight.sampling_params import ParamError
from inflight.server import fields as F
from inflight.server.config import ServerConfig
from inflight.server.embeddings.routes import Embedder
from inflight.server.fields import ModelNotFound, parse_body
from inflight.server.metrics import Metrics

T = TypeVar("T")
_PARSE_INLINE_BYTES = 1 << 20  # ~10 ms of json.loads: larger bodies parse in a worker thread


@dataclass
class Lifecycle:
    """Shutdown state: set by the signal handler (server/serve.py), read by the routes."""

    draining: bool = False  # SIGTERM received: new work gets 503, /health/ready is 503
    retry_after_s: int = 5  # what a refused client is told to wait (another replica may take it)


class BodyTooLarge(Exception):
    pass


@dataclass
class ServerContext:
    engine: EngineClient
    cfg: ServerConfig
    metrics: Metrics
    life: Lifecycle = field(default_factory=Lifecycle)
    embedder: Embedder = field(default_factory=Embedder)  # the encoder, loaded on first use

    def check_model(self, name: Any) -> str | None:
        """The LoRA adapter `name` selects (None: the base model); 404 for a model not served here."""
        if name is None or name in self.cfg.served_model_names:
            return None
        if not isinstance(name, str):  # as /v1/embeddings answers: a wrong type is a 400, not a 404
            raise ParamError("model: must be a string", "model")
        adapters = [a for a, _ in self.engine.lora_adapters()]
        if name in adapters:
            return name
        raise ModelNotFound(f"model: {name!r} is not served here; have {list(self.cfg.served_model_names) + adapters}")

    async def body(self, request: Request) -> dict[str, Any]:
        # read as it arrives: a chunked body has no content-length to refuse up front, and one
        # over the limit must be refused at the limit, never buffered whole
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.cfg.max_body_bytes:
                raise BodyTooLarge(f"body: larger than {self.cfg.max_body_bytes} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if len(raw) > _PARSE_INLINE_BYTES:  # a large body parses off the event loop
            return await asyncio.to_thread(parse_body, raw)
        return parse_body(raw)


def required_str(body: dict[str, Any], name: str) -> str:
    value = F.get_str(body, name)
    if not value:
        raise ParamError(f"{name}: required (a non-empty string)", name)
    return value


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | Response:
    """Run a handler while watching its connection: a client that hangs up before the response
    starts (a non-streamed request still generating) cancels it, which aborts its engine
    requests at the next step. Streamed responses watch their own connection once they start."""
    task = asyncio.ensure_future(work)

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()  # the handler's finally blocks close its streams: the requests are aborted
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.cancelled() or not watcher.done():
            raise  # cancelled from outside, not by the client leaving
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it
