"""The HTTP app: `build_app(engine)` so tests run the real server on a loopback port.

One `APIRouter` per API package (status, `openai/`, `embeddings/`, `generate/`) over one
`ServerContext`; `Guard` (API keys, body size, queue limit, the HTTP counters) wraps them all.
The handlers only parse, validate and format: the engine thread does the model work.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from fastapi import FastAPI

from inflight.engine.client import EngineClient
from inflight.reasoning import resolve_reasoning_parser
from inflight.server import openapi, status
from inflight.server.anthropic import api as anthropic
from inflight.server.config import ServerConfig
from inflight.server.context import Lifecycle, ServerContext
from inflight.server.embeddings import api as embeddings
from inflight.server.embeddings.routes import EMBEDDING_MODEL
from inflight.server.generate import api as generate
from inflight.server.guard import Guard, install_error_handlers
from inflight.server.metrics import Metrics
from inflight.server.openai import api as openai
from inflight.server.responses import api as responses
from inflight.tools import detect_parser

logger = logging.getLogger(__name__)

__all__ = ["Lifecycle", "build_app"]


def build_app(engine: EngineClient, config: ServerConfig | str) -> FastAPI:
    """The whole HTTP API over one engine. `config` may be just a model name (tests)."""
    cfg = ServerConfig(served_model_names=(config,)) if isinstance(config, str) else config
    cfg = with_reasoning(cfg, engine.tokenizer)
    app = FastAPI(title="inflight", version="1")
    app.router.redirect_slashes = False  # `/v1/completions/` is a 404, not a 307 to follow
    ctx = ServerContext(engine, cfg, Metrics(engine))
    app.state.lifecycle = ctx.life  # server/serve.py's SIGTERM handler sets `draining`

    app.add_middleware(Guard, engine=engine, cfg=cfg, metrics=ctx.metrics, routes=app.router.routes, life=ctx.life)
    install_error_handlers(app, ctx.metrics)
    _install_openapi(app, ctx)
    for package in (status, openai, responses, anthropic, embeddings, generate):
        app.include_router(package.router(ctx))
    return app


def with_reasoning(cfg: ServerConfig, tok: Any) -> ServerConfig:
    """`cfg` with its reasoning parser resolved against the model's tokenizer (SystemExit: the
    configured parser's tags are not tokens of this model)."""
    if cfg.reasoning is not None or cfg.reasoning_parser == "none" or tok is None:
        return cfg
    start, end = cfg.reasoning_tags or (None, None)
    try:
        return replace(cfg, reasoning=resolve_reasoning_parser(cfg.reasoning_parser, tok, start, end))
    except ValueError as e:
        raise SystemExit(f"--reasoning-parser: {e}") from e


def _install_openapi(app: FastAPI, ctx: ServerContext) -> None:
    engine, cfg, info = ctx.engine, ctx.cfg, ctx.engine.model_info
    tool_calls = bool(_tool_call_parser(cfg, engine))
    openapi.install(app, auth=bool(cfg.api_keys), auth_metrics=cfg.auth_metrics, vocab_size=info.vocab_size,
                    max_prompt_len=info.max_prompt_len, max_num_seqs=info.max_num_seqs, tool_calls=tool_calls,
                    embedding_models=(EMBEDDING_MODEL, *(cfg.served_model_names if cfg.embedding_pooling else ())),
                    max_inputs=min(2048, cfg.max_queue or 2048))  # fmt: skip


def _tool_call_parser(cfg: ServerConfig, engine: EngineClient) -> str | None:
    """The tool-call format requests are parsed with (each request asks the same), logged once."""
    if cfg.tool_call_parser:
        logger.info("tool calls: %s (--tool-call-parser)", cfg.tool_call_parser)
        return cfg.tool_call_parser
    detected = detect_parser(getattr(engine.tokenizer, "chat_template", None))
    if detected:
        logger.info("tool calls: %s (picked from the chat template; --tool-call-parser overrides)", detected)
    else:
        logger.info("tool calls: off (the chat template shows no tool-call format; --tool-call-parser turns them on)")
    return detected
