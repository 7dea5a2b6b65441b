"""POST /v1/embeddings over the bundled all-MiniLM-L6-v2 encoder (inflight/embeddings)."""

from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any

import numpy as np

from inflight.sampling_params import ParamError
from inflight.server.fields import get_int, get_str

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
    if isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)):
        v = [v]
    if not isinstance(v, list) or not v or len(v) > MAX_INPUTS:
        raise ParamError(f"input: a string, token ids, or an array of 1-{MAX_INPUTS} of those", "input")
    for item in v:
        if isinstance(item, str):
            if len(item) > 4 << 20:
                raise ParamError("input: texts are at most 4 MiB of characters", "input")
        elif not (isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item)):
            raise ParamError("input: items must be strings or non-empty arrays of token ids", "input")
    return v


async def embeddings(embedder: Embedder, body: dict[str, Any]) -> dict[str, Any]:
    model = get_str(body, "model", EMBEDDING_MODEL)
    if model != EMBEDDING_MODEL:
        raise ParamError(f"model: embeddings are served by {EMBEDDING_MODEL!r}", "model")
    inputs = _inputs(body)
    fmt = get_str(body, "encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ParamError('encoding_format: must be "float" or "base64"', "encoding_format")
    dims = get_int(body, "dimensions", None, lo=1)
    try:
        result = await asyncio.to_thread(embedder.encode, inputs, dims)
    except ValueError as e:
        param = "dimensions" if "dimensions" in str(e) else "input"
        raise ParamError(str(e), param) from e
    data = []
    for i, row in enumerate(result.embeddings):
        vec = row.numpy().astype(np.float32)
        emb: Any = base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = result.total_tokens
    return {"object": "list", "data": data, "model": EMBEDDING_MODEL, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
