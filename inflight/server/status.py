"""The routes that describe the server rather than run a model: /health (and Triton's
/v2/health/*), /metrics, /v1/models. They read only the engine's published snapshot."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from inflight.server.context import ServerContext
from inflight.server.embeddings.routes import EMBEDDING_MODEL
from inflight.server.fields import ModelNotFound


def model_cards(ctx: ServerContext) -> list[dict[str, Any]]:
    """As vLLM lists them: the base models (the served names, then the encoder), each with
    `parent: null`, then the loaded LoRA adapters, whose parent is the served model."""
    cfg, max_len = ctx.cfg, ctx.engine.model_info.max_model_len
    card = {"object": "model", "created": 0, "owned_by": "inflight"}
    cards = [card | {"id": name, "root": cfg.model_name, "parent": None, "max_model_len": max_len} for name in cfg.served_model_names]
    cards.append(card | {"id": EMBEDDING_MODEL, "root": EMBEDDING_MODEL, "parent": None})
    cards += [card | {"id": name, "root": path, "parent": cfg.model_name, "max_model_len": max_len}
              for name, path in ctx.engine.lora_adapters()]  # fmt: skip
    return cards


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()
    engine, life = ctx.engine, ctx.life

    @api.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @api.head("/metrics", include_in_schema=False)  # probes: vLLM's mounted Prometheus app answers HEAD
    async def prometheus_metrics_head() -> Response:
        return Response(media_type=CONTENT_TYPE_LATEST)

    @api.get("/health")
    @api.get("/v2/health/live")
    async def health() -> JSONResponse:
        dead = engine.stats.dead  # the engine thread's last snapshot: no engine state is read
        if dead is not None:
            return JSONResponse({"status": "unhealthy", "error": dead}, status_code=503)
        return JSONResponse({"status": "draining" if life.draining else "ok"})

    @api.get("/v2/health/ready")
    @api.get("/health/ready")
    async def ready() -> JSONResponse:
        dead = engine.stats.dead
        if dead is not None:
            return JSONResponse({"status": "unhealthy", "error": dead}, status_code=503)
        if life.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": model_cards(ctx)}

    @api.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str) -> dict[str, Any]:
        cards = model_cards(ctx)
        for card in cards:
            if card["id"] == model_id:
                return card
        raise ModelNotFound(f"model: {model_id!r} is not served here; have {[c['id'] for c in cards]}")

    return api
