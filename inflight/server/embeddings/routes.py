"""POST /v1/embeddings: the bundled all-MiniLM-L6-v2 encoder (inflight/embeddings), or the served
decoder model itself when the server pools its hidden states (`--embedding-pooling last|mean`)."""

from __future__ import annotations

import asyncio
import base64
import threading
import uuid
from typing import Any

import numpy as np
import torch

from inflight.engine.async_engine import AsyncEngine
from inflight.sampling_params import ParamError, embedding_params
from inflight.server.config import ServerConfig
from inflight.server.fields import ModelNotFound, get_int, get_str, integers

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MAX_INPUTS = 2048  # as OpenAI


class Embedder:
    """Loads the encoder on first use (it is 90 MB; chat-only deployments never pay for it)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._model: Any = None
        self._lock = threading.Lock()

    def model(self) -> Any:
        with self._lock:
            if self._model is None:
                from inflight.embeddings import EmbeddingModel

                self._model = EmbeddingModel.from_path(self.path)
            return self._model

    def encode(self, inputs: list[Any], dimensions: int | None) -> Any:
        model = self.model()
        with self._lock:  # one forward at a time: torch's threads are shared with the engine
            return model.encode(inputs, dimensions=dimensions)


def _inputs(body: dict[str, Any]) -> list[Any]:
    v = body.get("input")
    if isinstance(v, list) and v and all(isinstance(t, list) for t in v):
        v = [integers(t) or t for t in v]  # 3.0 counts as an integer (fields.integers)
    elif isinstance(v, list) and v and (ids := integers(v)) is not None:
        v = [ids]
    elif isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or len(v) > MAX_INPUTS:
        raise ParamError(f"input: a string, token ids, or an array of 1-{MAX_INPUTS} of those", "input")
    for item in v:
        if isinstance(item, str):
            if len(item) > 4 << 20:
                raise ParamError("input: texts are at most 4 MiB of characters", "input")
            if not item:  # SPEC §4, OpenAI: an empty text is refused
                raise ParamError("input: texts must not be empty", "input")
        elif not (isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item)):
            raise ParamError("input: items must be strings or non-empty arrays of token ids", "input")
    return v


async def embeddings(embedder: Embedder, engine: AsyncEngine, cfg: ServerConfig, body: dict[str, Any]) -> dict[str, Any]:
    model = get_str(body, "model", EMBEDDING_MODEL)
    decoder = model in cfg.served_model_names
    if decoder and cfg.embedding_pooling is None:
        raise ParamError(f"model: {model!r} serves no embeddings (start with --embedding-pooling last|mean)", "model")
    if not decoder and model != EMBEDDING_MODEL:
        raise ModelNotFound(f"model: {model!r} is not served here; embeddings: {[EMBEDDING_MODEL, *_pooled(cfg)]}")
    get_str(body, "user")  # OpenAI's end-user id: type-checked, nothing to do here (as on chat / completions)
    inputs = _with_instruction(_inputs(body), get_str(body, "instruction"))
    fmt = get_str(body, "encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ParamError('encoding_format: must be "float" or "base64"', "encoding_format")
    dims = get_int(body, "dimensions", None, lo=1)
    if decoder:
        vectors, tokens = await _decoder_embed(engine, inputs, cfg.embedding_pooling or "last", dims, cfg.max_queue)
    else:
        try:
            with engine.hold(len(inputs), cfg.max_queue):  # each input counts against the queue limit
                result = await engine.call(embedder.encode, inputs, dims)  # torch runs on one thread
        except ValueError as e:
            param = "dimensions" if "dimensions" in str(e) else "input"
            raise ParamError(str(e), param) from e
        vectors, tokens = list(result.embeddings), result.total_tokens
    data = []
    for i, row in enumerate(vectors):
        vec = row.numpy().astype(np.float32)
        emb: Any = base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    name = cfg.model_name if decoder else EMBEDDING_MODEL
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "data": data, "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip


def _with_instruction(inputs: list[Any], instruction: str | None) -> list[Any]:
    """Databricks `instruction`: prepended to each text, as instruction-tuned embedders (BGE's
    "Represent this sentence for searching relevant passages: ", E5's "query: ") expect it."""
    if not instruction:
        return inputs
    if any(not isinstance(item, str) for item in inputs):
        raise ParamError("instruction: only with text inputs (token-id inputs are already encoded)", "instruction")
    sep = "" if instruction[-1].isspace() else " "
    return [instruction + sep + item for item in inputs]


def _pooled(cfg: ServerConfig) -> list[str]:
    return list(cfg.served_model_names) if cfg.embedding_pooling else []


async def _decoder_embed(
    engine: AsyncEngine, inputs: list[Any], pooling: str, dims: int | None, queue_limit: int | None = None
) -> tuple[list[torch.Tensor], int]:
    """Each input is one engine request (batched with whatever else runs); 1 step after prefill.
    All are queued together or none (QueueFullError)."""
    params = embedding_params(pooling)
    size = sum(len(item) for item in inputs if isinstance(item, str))
    requests = await engine.run_input(lambda: [engine.make_request(item, params) for item in inputs], size)
    streams = engine.submit_all(requests, queue_limit=queue_limit, field="input")

    async def one(stream: Any) -> tuple[torch.Tensor, int]:
        final = None
        try:
            async for out in stream:
                final = out
        finally:
            await stream.aclose()
        assert final is not None and final.embedding is not None
        return final.embedding, len(final.prompt_token_ids)

    results = await asyncio.gather(*(one(st) for st in streams), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    vectors = [v for v, _ in results]  # type: ignore[misc]
    if dims is not None:
        if dims > vectors[0].numel():
            raise ParamError(f"dimensions: must be in [1, {vectors[0].numel()}]", "dimensions")
        vectors = [torch.nn.functional.normalize(v[:dims], dim=0) for v in vectors]
    return vectors, sum(n for _, n in results)  # type: ignore[misc]
