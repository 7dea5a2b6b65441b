"""The HTTP app: `build_app(engine)` so tests run the real server on a loopback port.

Routes: health, /metrics, /v1/models, the OpenAI completions / chat / embeddings endpoints
and the /v2 generate API; `Guard` (API keys, body size, queue limit, the HTTP counters) wraps
them all. The handlers only parse, validate and format: the engine thread does the model work.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight.engine.async_engine import AsyncEngine, EngineDeadError
from inflight.sampling_params import ParamError
from inflight.server import embeddings_routes, generate_routes, openai_routes
from inflight.server import fields as F
from inflight.server.config import ServerConfig
from inflight.server.embeddings_routes import EMBEDDING_MODEL, Embedder
from inflight.server.fields import ModelNotFound
from inflight.server.metrics import Metrics

logger = logging.getLogger(__name__)


def error_body(message: str, param: str | None, status: int, code: str | int | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code if code is not None else status}}
    return JSONResponse(body, status_code=status)


def build_app(engine: AsyncEngine, config: ServerConfig | str) -> FastAPI:
    """The whole HTTP API over one engine. `config` may be just a model name (tests)."""
    if isinstance(config, str):
        config = ServerConfig(served_model_names=(config,))
    cfg = config
    app = FastAPI(title="inflight")
    metrics = Metrics(engine)

    install_guards(app, engine, cfg, metrics)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(ParamError)
    async def _param_error(_: Request, e: ParamError) -> JSONResponse:
        return error_body(str(e), e.param, 400)

    @app.exception_handler(Exception)
    async def _bug(_: Request, e: Exception) -> JSONResponse:  # never user input: that is a ParamError
        logger.exception("unhandled error")
        return error_body(f"internal error: {type(e).__name__}", None, 500)

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return error_body(str(e), None, 503)

    @app.exception_handler(ModelNotFound)
    async def _not_found(_: Request, e: ModelNotFound) -> JSONResponse:
        return error_body(str(e), "model", 404)

    @app.get("/health")
    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    async def health() -> JSONResponse:
        dead = engine.stats.dead  # the engine thread's last snapshot: no engine state is read
        if dead is not None:
            return JSONResponse({"status": "unhealthy", "error": dead}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "inflight", "root": cfg.model_name,
                  "max_model_len": engine.model_info.max_model_len} for name in cfg.served_model_names]  # fmt: skip
        cards += [{"id": name, "object": "model", "created": 0, "owned_by": "inflight", "root": path, "parent": cfg.model_name,
                   "max_model_len": engine.model_info.max_model_len} for name, path in engine.lora_adapters()]  # fmt: skip
        cards.append({"id": EMBEDDING_MODEL, "object": "model", "created": 0, "owned_by": "inflight", "root": EMBEDDING_MODEL})
        return {"object": "list", "data": cards}

    def _check_model(name: Any) -> str | None:
        """The LoRA adapter `name` selects (None: the base model); 404 for a model not served here."""
        if name is None or name in cfg.served_model_names:
            return None
        adapters = [a for a, _ in engine.lora_adapters()]
        if isinstance(name, str) and name in adapters:
            return name
        raise ModelNotFound(f"model: {name!r} is not served here; have {list(cfg.served_model_names) + adapters}")

    async def _body(request: Request) -> dict[str, Any]:
        raw = await request.body()  # chunked bodies have no content-length to check up front
        if len(raw) > cfg.max_body_bytes:
            raise BodyTooLarge(f"body: larger than {cfg.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ParamError(f"body: invalid JSON ({e})", "body") from e
        if not isinstance(body, dict):
            raise ParamError("body: must be a JSON object", "body")
        return body

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_: Request, e: BodyTooLarge) -> JSONResponse:
        return error_body(str(e), "body", 413)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _body(request)
        lora = _check_model(body.get("model"))
        return await openai_routes.completions(engine, body, lora or cfg.model_name, cfg.perf_extras, lora)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request)
        lora = _check_model(body.get("model"))
        return await openai_routes.chat(engine, body, lora or cfg.model_name, cfg.perf_extras, cfg.tool_call_parser, lora)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await _body(request)
        name, path = _required_str(body, "lora_name"), _required_str(body, "lora_path")
        await engine.load_lora_adapter(name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        name = _required_str(await _body(request), "lora_name")
        await engine.unload_lora_adapter(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    embedder = Embedder()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        return await embeddings_routes.embeddings(embedder, engine, cfg, await _body(request))

    @app.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> Any:
        lora = _check_model(model)
        return await generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, stream=False, lora_name=lora)

    @app.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Any:
        lora = _check_model(model)
        return await generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, stream=True, lora_name=lora)

    return app


class BodyTooLarge(Exception):
    pass


def _required_str(body: dict[str, Any], name: str) -> str:
    value = F.get_str(body, name)
    if not value:
        raise ParamError(f"{name}: required (a non-empty string)", name)
    return value


def install_guards(app: FastAPI, engine: AsyncEngine, cfg: ServerConfig, metrics: Metrics) -> None:
    """API keys, body size, queue limit; counts every response in /metrics."""
    app.add_middleware(Guard, engine=engine, cfg=cfg, metrics=metrics)


class Guard:
    """A plain ASGI middleware: a streamed response's events go straight through (Starlette's
    `BaseHTTPMiddleware` relays each one through a memory stream and a task switch)."""

    def __init__(self, app: ASGIApp, engine: AsyncEngine, cfg: ServerConfig, metrics: Metrics) -> None:
        self.app, self.engine, self.cfg, self.metrics = app, engine, cfg, metrics
        self.public = {"/health", "/v2/health/live", "/v2/health/ready"} | (set() if cfg.auth_metrics else {"/metrics"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._count(scope, message["status"])
            await send(message)

        refusal = self._refuse(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, counted)
            return
        try:
            await self.app(scope, receive, counted)
        except Exception:  # the outermost error handler answers 500
            self._count(scope, 500)
            raise

    def _count(self, scope: Scope, status: int) -> None:
        route = scope.get("route")
        self.metrics.http.labels(getattr(route, "path", "unmatched"), str(status)).inc()

    def _refuse(self, request: Request) -> Response | None:
        """401 without a valid key, 413 for oversized bodies, 429 when the queue is full."""
        cfg = self.cfg
        if cfg.api_keys and request.url.path not in self.public:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
            if key not in cfg.api_keys:
                return error_body("invalid or missing API key", None, 401, code="invalid_api_key")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return error_body(f"body: larger than {cfg.max_body_bytes} bytes", "body", 413)
        if request.method == "POST" and self.engine.num_unfinished >= cfg.max_queue:
            resp = error_body("the server is at capacity; retry shortly", None, 429, code="queue_full")
            resp.headers["Retry-After"] = "1"
            return resp
        return None
