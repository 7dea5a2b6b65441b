"""/openapi.json: the routes' real request and response bodies, SSE streams and error codes.

The routes read raw JSON (validation lives in the protocol layer, errors name the field), so
FastAPI sees no models; this module describes them. The schemas say what a valid request is
(ranges of SPEC.md §4) closely enough that generated clients and property-based testers
(schemathesis) produce requests the server accepts, and every response the server sends matches.
Unknown request fields are ignored, as OpenAI does (`additionalProperties` stays open).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from inflight.server.openapi_schemas import _CHOICE_NEEDS_TOOLS, _NO_TOOL_CALLS, SCHEMAS, _ref


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _sse(description: str) -> dict[str, Any]:
    """One server-sent event as clients parse it: its `data` line (JSON text, or [DONE])."""
    return {"type": "object", "description": description, "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


_ERRORS = {
    "400": "invalid field (named in error.param)", "401": "bad or missing API key", "404": "unknown model",
    "413": "body larger than --max-body-bytes", "429": "queue full (Retry-After)", "503": "shutting down or engine down (Retry-After)",
}  # fmt: skip

# the bodies of the routes with no request schema here (fields in docs/API.md): what a body must have
_REQUIRED = {"/v1/responses": ["input"], "/v1/messages": ["model", "messages", "max_tokens"], "/v1/messages/count_tokens": ["model", "messages"]}
_ANTHROPIC_ERROR = {"content": {"application/json": {"schema": {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                          "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}}}}  # fmt: skip

# (method, path) -> (request schema or None, 200 response, error codes); stream: 200 may be SSE
_STREAMED = "text/event-stream"
OPERATIONS: dict[tuple[str, str], tuple[str | None, dict[str, Any], tuple[str, ...]]] = {
    ("post", "/v1/completions"): ("CompletionRequest", {"description": "a completion (JSON), or with stream: text_completion chunks as SSE, then data: [DONE]",
        "content": {"application/json": {"schema": _ref("CompletionResponse")}, _STREAMED: {"schema": _sse("data: {text_completion chunk} events")}}}, ("400", "401", "404", "413", "429", "503")),
    ("post", "/v1/chat/completions"): ("ChatCompletionRequest", {"description": "a chat completion (JSON), or with stream: chat.completion.chunk SSE, then data: [DONE]",
        "content": {"application/json": {"schema": _ref("ChatCompletionResponse")}, _STREAMED: {"schema": _sse("data: {chat.completion.chunk} events")}}}, ("400", "401", "404", "413", "429", "503")),
    ("post", "/v1/embeddings"): ("EmbeddingRequest", _json("EmbeddingResponse", "embeddings"), ("400", "401", "404", "413", "429", "503")),
    ("post", "/v2/models/{model}/generate"): ("GenerateRequest", _json("GenerateResponse", "the generated text"), ("400", "401", "404", "413", "429", "503")),
    ("post", "/v2/models/{model}/generate_stream"): ("GenerateRequest", {"description": "one data:{event} per new text piece; the last has details.finish_reason",
        "content": {_STREAMED: {"schema": _sse("data:{generate event} lines (MindIE bodies; Triton / TensorRT-LLM bodies: data: {generate event})")}}}, ("400", "401", "404", "413", "429", "503")),
    ("post", "/v1/load_lora_adapter"): ("LoadLoraRequest", {"description": "loaded", "content": {"text/plain": {"schema": {"type": "string"}}}}, ("400", "401", "404", "413")),
    ("post", "/v1/unload_lora_adapter"): ("UnloadLoraRequest", {"description": "unloaded", "content": {"text/plain": {"schema": {"type": "string"}}}}, ("400", "401", "404", "413")),
    ("post", "/tokenize"): ("TokenizeRequest", _json("TokenizeResponse", "the prompt's token ids (vLLM)"), ("400", "401", "404", "413")),
    ("post", "/detokenize"): ("DetokenizeRequest", _json("DetokenizeResponse", "the tokens' text (vLLM)"), ("400", "401", "404", "413")),
    ("post", "/invocations"): ("InvocationRequest", _json("InvocationResponse", "as the endpoint the body's shape selects"), ("400", "401", "404", "413", "429", "503")),
    ("post", "/v1/responses"): (None, {"description": "a response object (OpenAI Responses API; fields in docs/API.md), or with stream: its events as SSE (event: + data: lines)",
        "content": {"application/json": {"schema": {"type": "object"}}, _STREAMED: {"schema": _sse("event: response.* / data: {event} lines")}}}, ("400", "401", "404", "413", "429", "503")),
    ("get", "/v1/responses/{response_id}"): (None, {"description": "a stored response (per API key)", "content": {"application/json": {"schema": {"type": "object"}}}}, ("401", "404")),
    ("delete", "/v1/responses/{response_id}"): (None, {"description": "deleted", "content": {"application/json": {"schema": {"type": "object"}}}}, ("401", "404")),
    ("get", "/v1/responses/{response_id}/input_items"): (None, {"description": "a stored response's input items", "content": {"application/json": {"schema": {"type": "object"}}}}, ("400", "401", "404")),
    ("post", "/v1/messages"): (None, {"description": "an Anthropic message, or with stream: its events as SSE; errors in Anthropic's shape (docs/API.md)"},
                               ("400", "401", "404", "413", "429", "503")),
    ("post", "/v1/messages/count_tokens"): (None, {"description": "{input_tokens}; errors in Anthropic's shape"}, ("400", "401", "404", "413", "429", "503")),
    ("get", "/v1/models"): (None, _json("ModelList", "served models"), ("401",)),
    ("get", "/v1/models/{model_id}"): (None, _json("Model", "one served model"), ("401", "404")),
    ("get", "/v2/models/{model}"): (None, _json("TritonModelMetadata", "Triton model metadata"), ("401", "404")),
    ("get", "/v2/models/{model}/ready"): (None, _json("ModelReady", "ready (503: draining or engine down)"), ("401", "404", "503")),
    ("get", "/metrics"): (None, {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}, ("401",)),
    ("get", "/health"): (None, _json("Health", "the process is up (200 while draining)"), ("503",)),
    ("get", "/v2/health/live"): (None, _json("Health", "the process is up (200 while draining)"), ("503",)),
    ("get", "/health/ready"): (None, _json("Health", "ready for requests (503: draining or engine down)"), ("503",)),
    ("get", "/v2/health/ready"): (None, _json("Health", "ready for requests (503: draining or engine down)"), ("503",)),
}  # fmt: skip


def _with_vocab(node: Any, limits: dict[str, Any]) -> Any:
    """The schemas with this server's limits: token ids below its vocabulary size, token-id prompts
    within its input limit, n / best_of within its running batch, its tool-call and embedding models."""
    if isinstance(node, dict):
        if node.get("x-token-id"):
            return {"type": "integer", "minimum": 0, "maximum": limits["vocab_size"] - 1}
        if node.get("x-embedding-models"):
            return {k: v for k, v in node.items() if k != "x-embedding-models"} | {"enum": [*limits["embedding_models"], None]}
        if node.get("x-tool-rule"):
            return _NO_TOOL_CALLS if limits["no_tool_calls"] else _CHOICE_NEEDS_TOOLS
        out = {k: _with_vocab(v, limits) for k, v in node.items() if k not in ("x-prompt-ids", "x-max-seqs", "x-seqs-max", "x-max-inputs")}
        if node.get("x-max-inputs"):  # embeddings: 2,048 inputs (OpenAI), each a queued sequence
            out["maxItems"] = limits["max_inputs"]
        if node.get("x-prompt-ids"):
            out["maxItems"] = limits["max_prompt_len"]
        if node.get("x-max-seqs"):
            out["maximum"] = limits["max_num_seqs"]
        if node.get("x-seqs-max"):  # the largest allowed: >= any n
            out["minimum"] = limits["max_num_seqs"]
        return out
    if isinstance(node, list):
        return [_with_vocab(v, limits) for v in node]
    return node


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    out = schema | {"nullable": True}
    if "enum" in out and None not in out["enum"]:  # nullable does not extend an enum
        out["enum"] = [*out["enum"], None]
    return out


def _nulls_allowed(node: Any) -> Any:
    """Request schemas: an optional field may be null, which the server reads as absent."""
    if isinstance(node, list):
        return [_nulls_allowed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nulls_allowed(v) for k, v in node.items()}
    if isinstance(out.get("properties"), dict):
        required = set(out.get("required", []))
        out["properties"] = {k: v if k in required or "$ref" in v else _nullable(v) for k, v in out["properties"].items()}
    return out


def install(
    app: FastAPI, auth: bool, auth_metrics: bool, vocab_size: int, max_prompt_len: int = 64, max_num_seqs: int = 64,
    tool_calls: bool = True, embedding_models: tuple[str, ...] = ("all-MiniLM-L6-v2",), max_inputs: int = 2048,
) -> None:
    """Replace FastAPI's generated document (no bodies, a 422 that never happens) with ours."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = {name: _nulls_allowed(v) if name.endswith(("Request", "Message")) else v for name, v in SCHEMAS.items()}
        limits = {"vocab_size": vocab_size, "max_prompt_len": max_prompt_len, "max_num_seqs": max_num_seqs, "no_tool_calls": not tool_calls,
                  "embedding_models": list(embedding_models), "max_inputs": max_inputs}
        doc["components"] = {"schemas": _with_vocab(schemas, limits)}
        if auth:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"},
                                                    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}  # fmt: skip
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                request, ok, errors = OPERATIONS.get((method, path.replace("{model_id:path}", "{model_id}")), (None, {"description": "OK"}, ()))
                protected = auth and not path.startswith(("/health", "/v2/health")) and (path != "/metrics" or auth_metrics)
                codes = errors if protected else tuple(c for c in errors if c != "401")
                anthropic = path.startswith("/v1/messages")  # {"type": "error", "error": {"type", "message"}}
                op["responses"] = {"200": ok} | {c: _ANTHROPIC_ERROR | {"description": _ERRORS[c]} if anthropic else _json("Error", _ERRORS[c])
                                                 for c in codes}  # fmt: skip
                if request is not None:
                    op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
                elif method == "post" and path in _REQUIRED:  # a JSON object with these, always
                    schema = {"type": "object", "required": _REQUIRED[path]}
                    op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
                if protected:
                    op["security"] = [{"bearer": []}, {"apiKey": []}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
