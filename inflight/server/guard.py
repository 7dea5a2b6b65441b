"""What wraps every route: `Guard` (API keys, body size, drain and queue refusals, a clean 500,
the HTTP counters) and the exception handlers that turn every error into our one error body."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight.engine.async_engine import (
    DeadlineError,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
)
from inflight.engine.client import EngineClient
from inflight.sampling_params import ParamError
from inflight.server.anthropic.errors import as_anthropic
from inflight.server.config import ServerConfig
from inflight.server.context import BodyTooLarge, Lifecycle
from inflight.server.errors import error_body
from inflight.server.fields import ModelNotFound
from inflight.server.metrics import Metrics

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every error a route or the framework raises becomes our (OpenAI's) error body."""

    @app.exception_handler(ParamError)
    async def _param_error(_: Request, e: ParamError) -> JSONResponse:
        return error_body(str(e), e.param, 400, code=e.code)

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
            # Starlette's Allow names the first route on the path only (GET of GET + DELETE /v1/responses/{id})
            allowed = {m for r in _leaves(request.app.router.routes) if r.matches(request.scope)[0] is not Match.NONE
                       for m in getattr(r, "methods", None) or ()}  # fmt: skip
            if allowed:
                return error_body(message, None, 405, headers={"Allow": ", ".join(sorted(allowed))})
        else:
            message = str(e.detail)
        return error_body(message, None, e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        param = ".".join(str(p) for p in errors[0]["loc"][1:]) if errors else None
        return error_body(f"{param}: {errors[0]['msg'] if errors else 'invalid'}", param, 400)


def _leaves(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes, those of included routers too (FastAPI keeps an APIRouter whole)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        yield from _leaves(inner.routes) if inner is not None else (r,)


class Guard:
    """API keys, body size, drain and queue refusals; answers a bug with a clean 500; counts every
    response in /metrics by route. A plain ASGI middleware: a streamed response's events go
    straight through (Starlette's `BaseHTTPMiddleware` relays each one through a memory stream
    and a task switch)."""

    def __init__(
        self, app: ASGIApp, engine: EngineClient, cfg: ServerConfig, metrics: Metrics, routes: list[BaseRoute], life: Lifecycle
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
        if isinstance(refusal, JSONResponse) and scope["path"].startswith("/v1/messages"):
            refusal = as_anthropic(refusal)  # Anthropic's clients read their own error shape
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
            if scope["path"].startswith("/v1/messages"):
                resp = as_anthropic(resp)
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
