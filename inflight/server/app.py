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
from inflight.server import openai_routes


def error_body(message: str, param: str | None, status: int) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def build_app(engine: AsyncEngine, model_name: str) -> FastAPI:
    app = FastAPI(title="inflight")

    @app.exception_handler(ParamError)
    async def _param_error(_: Request, e: ParamError) -> JSONResponse:
        return error_body(str(e), e.param, 400)

    @app.get("/health")
    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "inflight"}
        return {"object": "list", "data": [card]}

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
        return await openai_routes.completions(engine, await _body(request), model_name)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await openai_routes.chat(engine, await _body(request), model_name)

    return app


