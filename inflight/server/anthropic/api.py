"""Anthropic's Messages API: POST /v1/messages (streamed or not) and /v1/messages/count_tokens.

The body becomes a chat-completions body (protocol.py) run as one `ChatRun`, the same engine
request as /v1/chat/completions; output.py shapes what it yields. `x-api-key` is one of the
accepted API-key headers (the Guard's); errors use Anthropic's body (errors.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import (
    DeadlineError,
    EngineDeadError,
    QueueFullError,
    RequestFailedError,
)
from inflight.sampling_params import ParamError
from inflight.server.anthropic.errors import anthropic_error
from inflight.server.anthropic.output import Event, MessageBuilder
from inflight.server.anthropic.protocol import parse
from inflight.server.context import ServerContext, until_disconnected
from inflight.server.fields import ModelNotFound
from inflight.server.openai import protocol as proto
from inflight.server.openai.chat_run import ChatRun
from inflight.server.openai.prompts import chat_prompt
from inflight.server.openai.tool_fields import tool_request


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages")
    async def messages(request: Request) -> Any:
        return await _answer(ctx, request, lambda body, lora: _create(ctx, body, lora))

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        return await _answer(ctx, request, lambda body, _: _count(ctx, body))

    return api


async def _answer(ctx: ServerContext, request: Request, work: Callable[[dict[str, Any], str | None], Awaitable[Any]]) -> Any:
    """Run a handler; its refusals in Anthropic's error shape."""
    try:
        body = await ctx.body(request)
        lora = ctx.check_model(body.get("model"))
        return await until_disconnected(request, work(body, lora))
    except ParamError as e:
        return anthropic_error(str(e), 400)
    except ModelNotFound as e:
        return anthropic_error(str(e), 404)
    except QueueFullError as e:
        ctx.metrics.rejected.labels(e.reason).inc()
        return anthropic_error(str(e), 503 if isinstance(e, DeadlineError) else 429, {"Retry-After": str(e.retry_after)})
    except RequestFailedError as e:
        return anthropic_error(str(e), 500)
    except EngineDeadError as e:
        return anthropic_error(str(e), 503)


async def _count(ctx: ServerContext, body: dict[str, Any]) -> dict[str, Any]:
    """The prompt's tokens as the chat template renders it (system, messages, tools)."""
    mr = parse(body, ctx.cfg.reasoning, count_only=True)
    req = proto.common(mr.chat_body, chat=True)
    messages = proto.chat_messages(mr.chat_body, [] if ctx.engine.takes_images else None)
    tools = tool_request(mr.chat_body).tools or None
    prompts = await ctx.engine.run_input(lambda: chat_prompt(ctx.engine, mr.chat_body, messages, tools, req))
    return {"input_tokens": len(prompts.items[0]["prompt_token_ids"])}


async def _create(ctx: ServerContext, body: dict[str, Any], lora: str | None) -> Any:
    mr = parse(body, ctx.cfg.reasoning)
    run = await ChatRun.start(ctx.engine, mr.chat_body, ctx.cfg, lora, mr.budget, "msg", final_only=not mr.stream)
    builder = MessageBuilder(lora or str(body["model"]), run.num_prompt_tokens)

    def usage() -> dict[str, Any]:
        prompt, generated, _, cached = run.usage()
        return {"input_tokens": prompt - cached, "output_tokens": generated, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0}  # fmt: skip

    if not mr.stream:
        last = None
        async for piece in run.pieces():
            builder.feed(piece)
            last = piece
        if run.extracted is not None and run.extracted.error:
            return anthropic_error(f"malformed tool call: {run.extracted.error}", 500)
        _, reason, seq = builder.finish(last and last.finish_reason, last and last.stop_reason, run.extracted, run.usage()[1])
        return builder.message(reason, seq, usage())

    async def events() -> AsyncIterator[str]:
        for ev in builder.start():
            yield _sse(ev)
        last = None
        try:
            async for piece in run.pieces():
                for ev in builder.feed(piece):
                    yield _sse(ev)
                last = piece
            if run.extracted is not None and run.extracted.error:
                raise RequestFailedError(f"malformed tool call: {run.extracted.error}")
            closing, _, _ = builder.finish(last and last.finish_reason, last and last.stop_reason, run.extracted, run.usage()[1])
            for ev in closing:
                yield _sse(ev)
        except (RequestFailedError, EngineDeadError) as e:  # the engine failed it: say so, end cleanly
            yield _sse({"type": "error", "error": {"type": "api_error", "message": str(e)}})

    return StreamingResponse(events(), media_type="text/event-stream")


def _sse(ev: Event) -> str:
    return f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n"


