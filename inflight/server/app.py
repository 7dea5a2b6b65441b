"""The HTTP app: `build_app(engine)` so tests run the real server on a loopback port.

This is the first slice of the server issue: health, model list, and the OpenAI
completions and chat endpoints (streaming and not). Full validation, the /v2
generate API, metrics, auth and TLS arrive with the server issue.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.tokenizer import apply_chat_template
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError, SamplingParams

_SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
    "include_stop_str_in_output", "skip_special_tokens", "min_tokens",
)  # fmt: skip


def error_body(message: str, param: str | None, status: int) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def _params(body: dict[str, Any]) -> SamplingParams:
    kwargs = {k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None}
    if isinstance(kwargs.get("stop"), str):
        kwargs["stop"] = [kwargs["stop"]]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    kwargs["max_tokens"] = max_tokens
    if body.get("logprobs") not in (None, False):
        lp = body["logprobs"]
        kwargs["logprobs"] = int(body.get("top_logprobs") or 0) if lp is True else int(lp)
    return SamplingParams(**kwargs)


def _usage(out: RequestOutput) -> dict[str, int]:
    p, c = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


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
        body = await _body(request)
        prompt = body.get("prompt")
        if prompt is None:
            raise ParamError("prompt: required", "prompt")
        params = _params(body)
        gen = engine.generate(prompt, params, request_id=f"cmpl-{uuid.uuid4().hex}")
        return await _respond(gen, body, "text_completion", _completion_choice)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ParamError("messages: must be a non-empty list", "messages")
        tok = engine.engine.tokenizer
        text = apply_chat_template(tok, messages, tools=body.get("tools"))
        prompt = {"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)}
        gen = engine.generate(prompt, _params(body), request_id=f"chatcmpl-{uuid.uuid4().hex}")
        return await _respond(gen, body, "chat.completion", _chat_choice)

    async def _respond(gen: AsyncIterator[RequestOutput], body: dict, kind: str, choice: Any) -> Any:
        first = await anext(gen)  # surfaces ParamError as a 400 before any byte is sent
        created = int(time.time())
        if body.get("stream") is True:
            return StreamingResponse(_stream(first, gen, kind, created, choice), media_type="text/event-stream")
        out = first
        async for out in gen:  # noqa: B007 (drain to the final output)
            pass
        return {
            "id": out.request_id, "object": kind, "created": created, "model": model_name,
            "choices": [choice(out, stream=False)], "usage": _usage(out),
        }  # fmt: skip

    async def _stream(first: RequestOutput, gen: AsyncIterator[RequestOutput], kind: str, created: int, choice: Any):  # type: ignore[no-untyped-def]
        chunk_kind = kind + ".chunk" if kind == "chat.completion" else kind
        if kind == "chat.completion":
            head = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            yield _sse(first.request_id, chunk_kind, created, model_name, head)
        out = first
        try:
            while True:
                if out.finished or out.outputs[0].delta_text:  # a token that completes no text sends nothing
                    yield _sse(out.request_id, chunk_kind, created, model_name, choice(out, stream=True))
                if out.finished:
                    break
                out = await anext(gen)
            yield "data: [DONE]\n\n"
        finally:
            await gen.aclose()  # a disconnected client aborts its request now, not at GC

    return app


def _sse(rid: str, kind: str, created: int, model: str, choice: dict) -> str:
    body = {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _finish(out: RequestOutput) -> str | None:
    reason = out.outputs[0].finish_reason
    return None if reason is None else ("length" if reason == "length" else "stop")


def _completion_choice(out: RequestOutput, stream: bool) -> dict[str, Any]:
    c = out.outputs[0]
    return {"index": 0, "text": c.delta_text if stream else c.text, "logprobs": None, "finish_reason": _finish(out)}


def _chat_choice(out: RequestOutput, stream: bool) -> dict[str, Any]:
    c = out.outputs[0]
    if stream:
        return {"index": 0, "delta": {"content": c.delta_text}, "finish_reason": _finish(out)}
    message = {"role": "assistant", "content": c.text}
    return {"index": 0, "message": message, "finish_reason": _finish(out)}
