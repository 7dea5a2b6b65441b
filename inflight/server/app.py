"""The HTTP app: `build_app(engine)` so tests run the real server on a loopback port.

Routes: health, /metrics, /v1/models, the OpenAI completions / chat / embeddings endpoints
and the /v2 generate API; `Guard` (API keys, body size, queue limit, the HTTP counters) wraps
them all. The handlers only parse, validate and format: the engine thread does the model work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight.engine.async_engine import (
    AsyncEngine,
    DeadlineError,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
)
from inflight.reasoning import resolve_reasoning_parser
from inflight.sampling_params import ParamError
from inflight.server import fields as F
from inflight.server import openapi
from inflight.server.config import ServerConfig
from inflight.server.embeddings import routes as embeddings_routes
from inflight.server.embeddings.routes import EMBEDDING_MODEL, Embedder
from inflight.server.errors import error_body
from inflight.server.fields import ModelNotFound, parse_body
from inflight.server.generate import routes as generate_routes
from inflight.server.generate.protocol import TRITON_INPUTS, TRITON_OUTPUTS
from inflight.server.lora_paths import runtime_adapter_path, startup_paths
from inflight.server.metrics import Metrics
from inflight.server.openai import routes as openai_routes
from inflight.server.openai import tokenize_routes
from inflight.tools import detect_parser

logger = logging.getLogger(__name__)
T = TypeVar("T")
_PARSE_INLINE_BYTES = 1 << 20  # ~10 ms of json.loads: larger bodies parse in a worker thread


def with_reasoning(cfg: ServerConfig, tok: Any) -> ServerConfig:
    """`cfg` with its reasoning parser resolved against the model's tokenizer (SystemExit: the
    configured parser's tags are not tokens of this model)."""
    if cfg.reasoning is not None or cfg.reasoning_parser == "none" or tok is None:
        return cfg
    start, end = cfg.reasoning_tags or (None, None)
    try:
        return replace(cfg, reasoning=resolve_reasoning_parser(cfg.reasoning_parser, tok, start, end))
    except ValueError as e:
        raise SystemExit(f"--reasoning-parser: {e}") from e


@dataclass
class Lifecycle:
    """Shutdown state: set by the signal handler (server/serve.py), read by the routes."""

    draining: bool = False  # SIGTERM received: new work gets 503, /health/ready is 503
    retry_after_s: int = 5  # what a refused client is told to wait (another replica may take it)


def build_app(engine: AsyncEngine, config: ServerConfig | str) -> FastAPI:
    """The whole HTTP API over one engine. `config` may be just a model name (tests)."""
    if isinstance(config, str):
        config = ServerConfig(served_model_names=(config,))
    cfg = with_reasoning(config, engine.tokenizer)
    app = FastAPI(title="inflight", version="1")
    app.router.redirect_slashes = False  # `/v1/completions/` is a 404, not a 307 to follow
    metrics = Metrics(engine)
    life = app.state.lifecycle = Lifecycle()

    app.add_middleware(Guard, engine=engine, cfg=cfg, metrics=metrics, routes=app.router.routes, life=life)
    _install_error_handlers(app)
    openapi.install(app, auth=bool(cfg.api_keys), auth_metrics=cfg.auth_metrics, vocab_size=engine.model_info.vocab_size,
                    max_prompt_len=engine.model_info.max_prompt_len, max_num_seqs=engine.model_info.max_num_seqs,
                    tool_calls=bool(cfg.tool_call_parser or detect_parser(getattr(engine.tokenizer, "chat_template", None))),
                    embedding_models=(EMBEDDING_MODEL, *(cfg.served_model_names if cfg.embedding_pooling else ())),
                    max_inputs=min(2048, cfg.max_queue or 2048))  # fmt: skip

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(QueueFullError)
    async def _refused(_: Request, e: QueueFullError) -> JSONResponse:
        # queue full: 429; a timeout the queue ahead can't meet: 503 (DeadlineError); both say when to retry
        metrics.rejected.labels(e.reason).inc()
        status = 503 if isinstance(e, DeadlineError) else 429
        param = "timeout" if status == 503 else None
        return error_body(str(e), param, status, code=e.reason, headers={"Retry-After": str(e.retry_after)})

    @app.exception_handler(RequestFailedError)
    async def _failed(_: Request, e: RequestFailedError) -> JSONResponse:  # the engine failed this request alone
        return error_body(str(e), None, 500)

    @app.get("/health")
    @app.get("/v2/health/live")
    async def health() -> JSONResponse:
        dead = engine.stats.dead  # the engine thread's last snapshot: no engine state is read
        if dead is not None:
            return JSONResponse({"status": "unhealthy", "error": dead}, status_code=503)
        return JSONResponse({"status": "draining" if life.draining else "ok"})

    @app.get("/v2/health/ready")
    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        dead = engine.stats.dead
        if dead is not None:
            return JSONResponse({"status": "unhealthy", "error": dead}, status_code=503)
        if life.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    def _cards() -> list[dict[str, Any]]:
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "inflight", "root": cfg.model_name,
                  "max_model_len": engine.model_info.max_model_len} for name in cfg.served_model_names]  # fmt: skip
        cards += [{"id": name, "object": "model", "created": 0, "owned_by": "inflight", "root": path, "parent": cfg.model_name,
                   "max_model_len": engine.model_info.max_model_len} for name, path in engine.lora_adapters()]  # fmt: skip
        cards.append({"id": EMBEDDING_MODEL, "object": "model", "created": 0, "owned_by": "inflight", "root": EMBEDDING_MODEL})
        return cards

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": _cards()}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str) -> dict[str, Any]:
        for card in _cards():
            if card["id"] == model_id:
                return card
        raise ModelNotFound(f"model: {model_id!r} is not served here; have {[c['id'] for c in _cards()]}")

    @app.get("/v2/models/{model}")
    async def triton_model_metadata(model: str) -> dict[str, Any]:
        _check_model(model)
        return {
            "name": model, "versions": ["1"], "platform": "inflight",
            "inputs": [{"name": n, "datatype": t, "shape": shape} for n, t, shape in TRITON_INPUTS],
            "outputs": [{"name": n, "datatype": t, "shape": shape} for n, t, shape in TRITON_OUTPUTS],
        }  # fmt: skip

    @app.get("/v2/models/{model}/ready")
    async def triton_model_ready(model: str) -> JSONResponse:
        _check_model(model)
        up = engine.stats.dead is None and not life.draining
        return JSONResponse({"name": model, "ready": up}, status_code=200 if up else 503)

    def _check_model(name: Any) -> str | None:
        """The LoRA adapter `name` selects (None: the base model); 404 for a model not served here."""
        if name is None or name in cfg.served_model_names:
            return None
        if not isinstance(name, str):  # as /v1/embeddings answers: a wrong type is a 400, not a 404
            raise ParamError("model: must be a string", "model")
        adapters = [a for a, _ in engine.lora_adapters()]
        if isinstance(name, str) and name in adapters:
            return name
        raise ModelNotFound(f"model: {name!r} is not served here; have {list(cfg.served_model_names) + adapters}")

    async def _body(request: Request) -> dict[str, Any]:
        # read as it arrives: a chunked body has no content-length to refuse up front, and one
        # over the limit must be refused at the limit, never buffered whole
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise BodyTooLarge(f"body: larger than {cfg.max_body_bytes} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if len(raw) > _PARSE_INLINE_BYTES:  # a large body parses off the event loop
            return await asyncio.to_thread(parse_body, raw)
        return parse_body(raw)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _body(request)
        lora = _check_model(body.get("model"))
        work = openai_routes.completions(engine, body, cfg, lora)
        return await until_disconnected(request, work)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request)
        lora = _check_model(body.get("model"))
        work = openai_routes.chat(engine, body, cfg, lora)
        return await until_disconnected(request, work)

    if engine.model_info.lora_enabled:  # as vLLM: without LoRA these routes do not exist (404)
        startup = startup_paths(engine.lora_adapters())  # the --lora-modules directories

        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request) -> PlainTextResponse:
            body = await _body(request)
            name, path = _required_str(body, "lora_name"), _required_str(body, "lora_path")
            real = runtime_adapter_path(name, path, cfg.served_model_names, cfg.lora_root, startup)
            await engine.load_lora_adapter(name, real)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: Request) -> Response:
            name = _required_str(await _body(request), "lora_name")
            if name not in [a for a, _ in engine.lora_adapters()]:  # vLLM's clients expect 404 here
                return error_body(f"lora_name: no adapter named {name!r} is loaded", "lora_name", 404, "model_not_found")
            await engine.unload_lora_adapter(name)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    embedder = Embedder()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        return await until_disconnected(
            request, embeddings_routes.embeddings(embedder, engine, cfg, await _body(request))
        )

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"))
        return await engine.run_input(lambda: tokenize_routes.tokenize(engine, body), len(str(body.get("prompt") or "")))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"))
        return await engine.run_input(lambda: tokenize_routes.detokenize(engine, body))

    @app.post("/invocations")
    async def invocations(request: Request) -> Any:
        """SageMaker's single route (vLLM serves it): chat, completions or embeddings by body shape."""
        body = await _body(request)
        kind = tokenize_routes.invocation_kind(body)
        if kind == "embeddings":
            return await until_disconnected(request, embeddings_routes.embeddings(embedder, engine, cfg, body))
        lora = _check_model(body.get("model"))
        route = openai_routes.chat if kind == "chat" else openai_routes.completions
        return await until_disconnected(request, route(engine, body, cfg, lora))

    @app.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> Any:
        lora = _check_model(model)
        work = generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, False, lora, cfg.max_queue, cfg.media)
        return await until_disconnected(request, work)

    @app.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Any:
        lora = _check_model(model)
        work = generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, True, lora, cfg.max_queue, cfg.media)
        return await until_disconnected(request, work)

    return app


class BodyTooLarge(Exception):
    pass


def _required_str(body: dict[str, Any], name: str) -> str:
    value = F.get_str(body, name)
    if not value:
        raise ParamError(f"{name}: required (a non-empty string)", name)
    return value


def _install_error_handlers(app: FastAPI) -> None:
    """Every error a route or the framework raises becomes our (OpenAI's) error body."""

    @app.exception_handler(ParamError)
    async def _param_error(_: Request, e: ParamError) -> JSONResponse:
        return error_body(str(e), e.param, 400)

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return error_body(str(e), None, 503)

    @app.exception_handler(ModelNotFound)
    async def _not_found(_: Request, e: ModelNotFound) -> JSONResponse:
        return error_body(str(e), "model", 404, code="model_not_found")

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_: Request, e: BodyTooLarge) -> JSONResponse:
        # the rest of the upload is discarded unread as it arrives (server/connection.py)
        return error_body(str(e), "body", 413)

    @app.exception_handler(HTTPException)
    async def _framework(request: Request, e: HTTPException) -> JSONResponse:
        """The router's 404 (no such path) and 405 (path without that method)."""
        if e.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif e.status_code == 405:
            message = f"Method {request.method} not allowed on {request.url.path}"
        else:
            message = str(e.detail)
        return error_body(message, None, e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        param = ".".join(str(p) for p in errors[0]["loc"][1:]) if errors else None
        return error_body(f"{param}: {errors[0]['msg'] if errors else 'invalid'}", param, 400)


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




class Guard:
    """API keys, body size, drain and queue refusals; answers a bug with a clean 500; counts every
    response in /metrics by route. A plain ASGI middleware: a streamed response's events go
    straight through (Starlette's `BaseHTTPMiddleware` relays each one through a memory stream
    and a task switch)."""

    def __init__(
        self, app: ASGIApp, engine: AsyncEngine, cfg: ServerConfig, metrics: Metrics, routes: list[BaseRoute], life: Lifecycle
    ) -> None:
        self.app, self.engine, self.cfg, self.metrics, self.routes, self.life = app, engine, cfg, metrics, routes, life
        self.health = {"/health", "/health/ready", "/v2/health/live", "/v2/health/ready"}
        self.public = self.health | (set() if cfg.auth_metrics else {"/metrics"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self._count(scope, message["status"])
                if self.life.draining:  # pooled clients should reconnect (to another replica)
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        refusal = self._refuse(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, counted)
            return
        try:
            await self.app(scope, receive, counted)
        except ClientDisconnect:
            return  # the client went away (or timed out) while sending its body: nobody to answer
        except Exception as e:  # never user input: that is a ParamError
            if started:  # mid-response: uvicorn closes the connection
                raise
            logger.exception("unhandled error")
            # uvicorn would answer text/plain and close the connection after the client may have
            # queued its next request on it: our body, and the client is told to reconnect
            resp = error_body(f"internal error: {type(e).__name__}", None, 500, headers={"Connection": "close"})
            await resp(scope, receive, counted)

    def _count(self, scope: Scope, status: int) -> None:
        self.metrics.http.labels(self._route(scope), str(status)).inc()

    def _route(self, scope: Scope) -> str:
        """The route's path template (refusals answer before routing: match it here)."""
        route = scope.get("route")
        if route is not None:
            return getattr(route, "path", "unmatched")
        for r in self.routes:
            if r.matches(scope)[0] is not Match.NONE:
                return getattr(r, "path", "unmatched")
        return "unmatched"

    def _refuse(self, request: Request) -> Response | None:
        """401 without a valid key, 413 for oversized bodies, 503 while draining, 429 when the queue is full."""
        cfg, path = self.cfg, request.url.path
        if cfg.api_keys and path not in self.public:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
            if key not in cfg.api_keys:
                return error_body("invalid or missing API key", None, 401, code="invalid_api_key")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return error_body(f"body: larger than {cfg.max_body_bytes} bytes", "body", 413)
        if self.life.draining and path not in self.health and path != "/metrics":
            retry = {"Retry-After": str(self.life.retry_after_s)}
            return error_body("the server is shutting down; retry on another replica", None, 503, code="shutting_down", headers=retry)
        if request.method == "POST" and self.engine.num_queued_sequences >= cfg.max_queue:  # before reading the body
            self.metrics.rejected.labels("queue_full").inc()
            return error_body("the server is at capacity; retry shortly", None, 429, code="queue_full", headers={"Retry-After": "1"})
        return None
