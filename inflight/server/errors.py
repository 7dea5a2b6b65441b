"""The one error body every response of ours uses (OpenAI's): {"error": {message, type, param, code}}."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import (
    JSONResponse,  # fastapi re-exports it; fastapi itself costs ~1 s at `inflight --help`
)


def error_payload(message: str, param: str | None, status: int, code: str | int | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code if code is not None else status}}


def error_body(
    message: str, param: str | None, status: int, code: str | int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_payload(message, param, status, code), status_code=status, headers=headers)


def error_bytes(message: str, status: int, code: str | int | None = None) -> bytes:
    return json.dumps(error_payload(message, None, status, code)).encode()
