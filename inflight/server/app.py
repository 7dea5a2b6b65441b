"""The HTTP app: `build_app(engine)` so tests run the real server on a loopback port.

This is the first slice of the server issue: health, model list, and the OpenAI
completions and chat endpoints (streaming and not). Full validation, the /v2
generate API, metrics, auth and TLS arrive with the server issue.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from inflight.engine.async_engine import AsyncEngine
from inflight.sampling_params import ParamError
from inflight.server import generate_routes, openai_routes
from inflight.server.config import ServerConfig


def error_body(message: str, param: str | None, status: int) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def build_app(engine: AsyncEngine, config: ServerConfig | str) -> FastAPI:
    """The whole HTTP API over one engine. `config` may be just a model name (tests)."""
    if isinstance(config, str):
        config = ServerConfig(served_model_names=(config,))
    cfg = config
    app = FastAPI(title="inflight")

    @app.exception_handler(ParamError)
    async def _param_error(_: Request, e: ParamError) -> JSONResponse:
        return error_body(str(e), e.param, 400)

    @app.exception_handler(ModelNotFound)
    async def _not_found(_: Request, e: ModelNotFound) -> JSONResponse:
        return error_body(str(e), "model", 404)

    @app.get("/health")
    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "inflight", "root": cfg.model_name}
                 for name in cfg.served_model_names]  # fmt: skip
        return {"object": "list", "data": cards}

    def _check_model(name: Any) -> None:
        if name is not None and name not in cfg.served_model_names:
            raise ModelNotFound(f"model: {name!r} is not served here; have {list(cfg.served_model_names)}")

    async def _body(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ParamError(f"body: invalid JSON ({e})", "body") from e
        if not isinstance(body, dict):
            raise ParamError("body: must be a JSON object", "body")
        return body

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"))
        return await openai_routes.completions(engine, body, cfg.model_name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request)
        _check_model(body.get("model"))
        return await openai_routes.chat(engine, body, cfg.model_name)

    @app.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> Any:
        _check_model(model)
        return await generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, stream=False)

    @app.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Any:
        _check_model(model)
        return await generate_routes.generate(engine, await _body(request), model, cfg.full_text_enabled, stream=True)

    return app


class ModelNotFound(Exception):
    pass
