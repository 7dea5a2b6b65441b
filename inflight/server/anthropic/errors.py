"""Anthropic's error body: {"type": "error", "error": {"type": ..., "message": ...}} (its clients
read `error.type`), for /v1/messages; the status codes are the same as on our other routes."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}  # fmt: skip


def anthropic_error(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def as_anthropic(resp: JSONResponse) -> JSONResponse:
    """One of our OpenAI-shaped error responses (the Guard's refusals) in Anthropic's shape."""
    body = json.loads(bytes(resp.body))
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in ("content-length", "content-type")}
    return anthropic_error(body["error"]["message"], resp.status_code, headers)
