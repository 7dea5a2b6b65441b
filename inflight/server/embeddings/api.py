"""POST /v1/embeddings."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from inflight.server.context import ServerContext, until_disconnected
from inflight.server.embeddings import routes


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/embeddings")
    async def embeddings(request: Request) -> Any:
        work = routes.embeddings(ctx.embedder, ctx.engine, ctx.cfg, await ctx.body(request))
        return await until_disconnected(request, work)

    return api
