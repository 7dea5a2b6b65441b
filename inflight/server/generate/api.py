"""The /v2 routes: MindIE's generate / generate_stream and Triton's model metadata and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from inflight.server.context import ServerContext, until_disconnected
from inflight.server.generate import routes
from inflight.server.generate.tensors import TRITON_INPUTS, TRITON_OUTPUTS


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()
    engine, cfg = ctx.engine, ctx.cfg

    @api.get("/v2/models/{model}")
    async def triton_model_metadata(model: str) -> dict[str, Any]:
        ctx.check_model(model)
        return {
            "name": model, "versions": ["1"], "platform": "inflight",
            "inputs": [{"name": n, "datatype": t, "shape": shape} for n, t, shape in TRITON_INPUTS],
            "outputs": [{"name": n, "datatype": t, "shape": shape} for n, t, shape in TRITON_OUTPUTS],
        }  # fmt: skip

    @api.get("/v2/models/{model}/ready")
    async def triton_model_ready(model: str) -> JSONResponse:
        ctx.check_model(model)
        up = engine.stats.dead is None and not ctx.life.draining
        return JSONResponse({"name": model, "ready": up}, status_code=200 if up else 503)

    async def run(model: str, request: Request, stream: bool) -> Any:
        lora = ctx.check_model(model)
        body = await ctx.body(request)
        work = routes.generate(engine, body, model, cfg.full_text_enabled, stream, lora, cfg.max_queue, cfg.media, cfg.v2_stream_dialect)
        return await until_disconnected(request, work)

    @api.post("/v2/models/{model}/generate")
    async def generate(model: str, request: Request) -> Any:
        return await run(model, request, False)

    @api.post("/v2/models/{model}/generate_stream")
    async def generate_stream(model: str, request: Request) -> Any:
        return await run(model, request, True)

    return api
