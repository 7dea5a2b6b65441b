"""One request body and one stream-event parser per serving API.

completions  POST /v1/completions            `data: {chunk}` ... usage chunk ... `data: [DONE]`
chat         POST /v1/chat/completions       the same, after a role-only first chunk
generate     POST /v2/models/{m}/generate_stream  `data:{event}`; the last event has
             details.finish_reason; every event has details.generated_tokens (so far)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from inflight.bench.dataset import SampleRequest


@dataclass(frozen=True)
class RequestConfig:
    """What every request of a run shares."""

    model: str  # the served model name
    ignore_eos: bool
    temperature: float
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chunk:
    """One parsed stream event."""

    is_token: bool = False  # carries generated output: it times TTFT / ITL
    text: str = ""
    output_tokens: int | None = None  # the server's count of generated tokens (so far)
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False  # the stream's normal last event
    error: str | None = None


class Backend(Protocol):
    def path(self, model: str) -> str: ...
    def body(self, req: SampleRequest, cfg: RequestConfig) -> dict[str, Any]: ...
    def parse(self, data: str) -> Chunk: ...


def _openai_body(cfg: RequestConfig, output_len: int) -> dict[str, Any]:
    return {
        "model": cfg.model, "max_tokens": output_len, "temperature": cfg.temperature,
        "ignore_eos": cfg.ignore_eos, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def _openai_parse(data: str, choice_chunk: Any) -> Chunk:
    if data == "[DONE]":
        return Chunk(done=True)
    obj = json.loads(data)
    if "error" in obj:
        return Chunk(error=str(obj["error"]))
    usage = obj.get("usage") or {}
    choices = obj.get("choices") or []
    chunk = choice_chunk(choices[0]) if choices else Chunk()
    chunk.output_tokens = usage.get("completion_tokens")
    chunk.prompt_tokens = usage.get("prompt_tokens")
    return chunk


class Completions:
    def path(self, model: str) -> str:
        return "/v1/completions"

    def body(self, req: SampleRequest, cfg: RequestConfig) -> dict[str, Any]:
        return _openai_body(cfg, req.output_len) | {"prompt": req.prompt} | cfg.extra_body

    def parse(self, data: str) -> Chunk:
        def choice(c: dict[str, Any]) -> Chunk:
            return Chunk(
                is_token=True, text=c.get("text") or "", finish_reason=c.get("finish_reason")
            )

        return _openai_parse(data, choice)


class Chat:
    def path(self, model: str) -> str:
        return "/v1/chat/completions"

    def body(self, req: SampleRequest, cfg: RequestConfig) -> dict[str, Any]:
        messages = [{"role": "user", "content": req.prompt}]
        return _openai_body(cfg, req.output_len) | {"messages": messages} | cfg.extra_body

    def parse(self, data: str) -> Chunk:
        def choice(c: dict[str, Any]) -> Chunk:
            delta = c.get("delta") or {}
            content = delta.get("content") or ""
            # the first chunk only announces the role: no token has been generated yet
            is_token = bool(content) or "role" not in delta
            return Chunk(is_token=is_token, text=content, finish_reason=c.get("finish_reason"))

        return _openai_parse(data, choice)


class Generate:
    def path(self, model: str) -> str:
        return f"/v2/models/{quote(model, safe='')}/generate_stream"

    def body(self, req: SampleRequest, cfg: RequestConfig) -> dict[str, Any]:
        params = {
            "max_new_tokens": req.output_len,
            "ignore_eos": cfg.ignore_eos,
            "temperature": cfg.temperature,
        }
        return {"text_input": req.prompt, "parameters": params | cfg.extra_body}

    def parse(self, data: str) -> Chunk:
        obj = json.loads(data)
        if "error" in obj:
            return Chunk(error=str(obj["error"]))
        details = obj.get("details") or {}
        reason = details.get("finish_reason")
        return Chunk(
            is_token=True, text=obj.get("text_output") or "", output_tokens=details.get("generated_tokens"),
            finish_reason=reason, done=reason is not None,
        )  # fmt: skip


BACKENDS: dict[str, type[Backend]] = {
    "completions": Completions,
    "chat": Chat,
    "generate": Generate,
}
