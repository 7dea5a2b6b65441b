"""OpenAI's Responses API: POST /v1/responses, GET / DELETE /v1/responses/{id}.

The request becomes a chat-completions body (protocol.py) and runs as one `ChatRun` (the same
engine request as /v1/chat/completions); output.py shapes what it yields. Stored responses are
kept per API key (store.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inflight.engine.async_engine import EngineDeadError, RequestFailedError
from inflight.server.context import ServerContext, until_disconnected
from inflight.server.errors import error_body
from inflight.server.fields import get_str
from inflight.server.openai.chat_run import ChatRun
from inflight.server.responses.output import Event, ResponseBuilder, new_id, usage_object
from inflight.server.responses.protocol import parse
from inflight.server.responses.store import ResponseStore


def api_key(request: Request) -> str:
    """The key the request was let in with (Guard checked it): stored responses are per key."""
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key") or ""


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()
    store = ResponseStore(ctx.cfg.responses_store_size, ctx.cfg.responses_store_bytes)

    @api.post("/v1/responses")
    async def create(request: Request) -> Any:
        body = await ctx.body(request)
        lora = ctx.check_model(body.get("model"))
        return await until_disconnected(request, _create(ctx, store, body, api_key(request), lora))

    @api.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Any:
        item = store.get(api_key(request), response_id)
        if item is None:
            return _not_found(response_id)
        return item.response

    @api.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Any:
        item = store.get(api_key(request), response_id)
        if item is None:
            return _not_found(response_id)
        return _page(item.input_items, dict(request.query_params))

    @api.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Any:
        if not store.delete(api_key(request), response_id):
            return _not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    return api


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> Any:
    """OpenAI's cursor page: `order` (desc by default), `limit` (1-100, 20), `after` (an item id)."""
    order, limit, after = query.get("order", "desc"), query.get("limit", "20"), query.get("after")
    # fullmatch, not isdigit: "²" is a digit to isdigit and a ValueError to int()
    if order not in ("asc", "desc") or not re.fullmatch(r"[0-9]{1,3}", limit, re.ASCII) or not 1 <= int(limit) <= 100:
        return error_body("order: asc or desc; limit: 1-100", "order" if order not in ("asc", "desc") else "limit", 400)
    ordered = items if order == "asc" else items[::-1]
    ids = [i["id"] for i in ordered]
    if after is not None and after not in ids:
        return error_body(f"after: no input item {after!r} in this response", "after", 400)
    start = ids.index(after) + 1 if after is not None else 0
    data = ordered[start : start + int(limit)]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + int(limit) < len(ordered)}  # fmt: skip


def _not_found(response_id: str, param: str | None = None) -> JSONResponse:
    return error_body(f"No response found with id '{response_id}'.", param, 404, code="not_found")


async def _create(ctx: ServerContext, store: ResponseStore, body: dict[str, Any], key: str, lora: str | None) -> Any:
    cfg = ctx.cfg
    prev_id = get_str(body, "previous_response_id")
    history: list[dict[str, Any]] = []
    if prev_id is not None:
        prev = store.get(key, prev_id)
        if prev is None:
            return _not_found(prev_id, "previous_response_id")
        history = prev.conversation
    rr = parse(body, history, cfg.reasoning)
    max_out, info = rr.echo["max_output_tokens"], ctx.engine.model_info
    if rr.echo["truncation"] == "auto" and max_out:  # room for the output too, not just the prompt limit
        rr.chat_body["truncate_prompt_tokens"] = max(1, min(info.max_prompt_len, info.max_model_len - max_out))
    run = await ChatRun.start(ctx.engine, rr.chat_body, cfg, lora, rr.budget, "resp", final_only=not rr.stream)
    builder = ResponseBuilder(new_id("resp"), lora or cfg.model_name, rr.echo | {"store": rr.store})

    def finished(piece_finish: str | None) -> list[Event]:
        events = builder.finish(piece_finish, run.extracted, usage_object(*run.usage()))
        if rr.store:
            store.put(key, builder.response(usage_object(*run.usage())), rr.turn + builder.conversation(), rr.input_items)
        return events

    if not rr.stream:
        finish = None
        async for piece in run.pieces():
            builder.feed(piece)
            finish = piece.finish_reason or finish
        finished(finish)
        return builder.response(usage_object(*run.usage()))

    async def events() -> AsyncIterator[str]:
        for ev in builder.start():
            yield _sse(ev)
        finish = None
        try:
            async for piece in run.pieces():
                for ev in builder.feed(piece):
                    yield _sse(ev)
                finish = piece.finish_reason or finish
            for ev in finished(finish):
                yield _sse(ev)
        except (RequestFailedError, EngineDeadError) as e:  # the engine failed it: say so, end cleanly
            yield _sse({"type": "error", "sequence_number": builder.seq, "code": "server_error", "message": str(e), "param": None})

    return StreamingResponse(events(), media_type="text/event-stream")


def _sse(ev: Event) -> str:
    return f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n"
