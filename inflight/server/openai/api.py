"""The OpenAI routes (completions, chat), vLLM's LoRA load / unload and /tokenize, /detokenize,
and SageMaker's /invocations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from inflight.server.context import ServerContext, required_str, until_disconnected
from inflight.server.embeddings import routes as embeddings_routes
from inflight.server.errors import error_body
from inflight.server.lora_paths import runtime_adapter_path, startup_paths
from inflight.server.openai import routes, tokenize_routes


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()
    engine, cfg = ctx.engine, ctx.cfg

    @api.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await ctx.body(request)
        lora = ctx.check_model(body.get("model"))
        return await until_disconnected(request, routes.completions(engine, body, cfg, lora))

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await ctx.body(request)
        lora = ctx.check_model(body.get("model"))
        return await until_disconnected(request, routes.chat(engine, body, cfg, lora))

    @api.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body = await ctx.body(request)
        ctx.check_model(body.get("model"))
        return await engine.run_input(lambda: tokenize_routes.tokenize(engine, body), len(str(body.get("prompt") or "")))

    @api.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        body = await ctx.body(request)
        ctx.check_model(body.get("model"))
        return await engine.run_input(lambda: tokenize_routes.detokenize(engine, body))

    @api.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return tokenize_routes.tokenizer_info(engine)

    @api.post("/invocations")
    async def invocations(request: Request) -> Any:
        """SageMaker's single route (vLLM serves it): chat, completions or embeddings by body shape."""
        body = await ctx.body(request)
        kind = tokenize_routes.invocation_kind(body)
        if kind == "embeddings":
            return await until_disconnected(request, embeddings_routes.embeddings(ctx.embedder, engine, cfg, body))
        lora = ctx.check_model(body.get("model"))
        route = routes.chat if kind == "chat" else routes.completions
        return await until_disconnected(request, route(engine, body, cfg, lora))

    if engine.model_info.lora_enabled:  # as vLLM: without LoRA these routes do not exist (404)
        _lora_routes(api, ctx)
    return api


def _lora_routes(api: APIRouter, ctx: ServerContext) -> None:
    engine, cfg = ctx.engine, ctx.cfg
    startup = startup_paths(engine.lora_adapters())  # the --lora-modules directories

    @api.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await ctx.body(request)
        name, path = required_str(body, "lora_name"), required_str(body, "lora_path")
        real = runtime_adapter_path(name, path, cfg.served_model_names, cfg.lora_root, startup)
        await engine.load_lora_adapter(name, real)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @api.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        name = required_str(await ctx.body(request), "lora_name")
        if name not in [a for a, _ in engine.lora_adapters()]:  # vLLM's clients expect 404 here
            return error_body(f"lora_name: no adapter named {name!r} is loaded", "lora_name", 404, "model_not_found")
        await engine.unload_lora_adapter(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
