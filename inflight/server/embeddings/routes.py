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

from inflight.engine.client import EngineClient
from inflight.sampling_params import ParamError, embedding_params
from inflight.server.config import ServerConfig
from inflight.server.fields import ModelNotFound, get_bool, get_int, get_str, integers

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
MAX_INPUTS = 2048  # as OpenAI


# The encoder runs between engine steps, a layer of a batch at a time, for about half as long as the
# last step took (EngineClient.work_budget_s): running decodes' inter-token latency stays under
# about 2x (a whole 2,048-input request once ran in one go and stopped every stream for 27 s).
EMBED_BATCH_TOKENS = 256  # padded tokens per batch (one max-length row of all-MiniLM-L6-v2): a unit is 1/7 of it
MAX_REQUEST_TOKENS = 300_000  # OpenAI's per-request limit, summed over the inputs


class Embedder:
    """Loads the encoder on first use (it is 90 MB; chat-only deployments never pay for it).
    All its torch work runs on the engine thread (docs/ARCHITECTURE.md, the libgomp rule);
    tokenizing runs in the engine client's input threads."""

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

    async def encode(self, engine: EngineClient, inputs: list[Any], dims: int | None, truncate: int | None, queue_limit: int) -> Any:
        model = await engine.call(self.model)
        if dims is not None and dims > model.dim:
            raise ParamError(f"dimensions: must be in [1, {model.dim}]", "dimensions")
        if truncate is not None and truncate > model.max_seq_length:
            raise ParamError(f"truncate_prompt_tokens: must be <= {model.max_seq_length}, the encoder's length", "truncate_prompt_tokens")
        keep: bool | int = False if truncate is None else True if truncate == -1 else truncate
        size = sum(len(x) for x in inputs if isinstance(x, str))
        try:
            ids = await engine.run_input(lambda: model.tokenize(inputs, truncate=keep), size)
        except ValueError as e:
            raise ParamError(str(e).replace("embeddings: input", "input: item"), "input") from e
        total = sum(len(r) for r in ids)
        if total > MAX_REQUEST_TOKENS:
            raise ParamError(f"input: {total} tokens in all; at most {MAX_REQUEST_TOKENS} per request", "input")
        with engine.hold(len(inputs), queue_limit):  # each input counts against the queue limit
            job = model.job(ids, EMBED_BATCH_TOKENS)
            while not await engine.call(job.advance, engine.work_budget_s):  # between engine steps
                pass
            return await engine.call(job.finish, dims)


def _truncate(body: dict[str, Any]) -> int | None:
    """Tokens to keep per text when truncation is asked for (-1: the model's length): vLLM's
    truncate_prompt_tokens, TEI's `truncate`, Databricks' error_behavior "truncate". None: a text
    past the model's length is a 400 naming `input` (OpenAI's behaviour)."""
    keep = get_int(body, "truncate_prompt_tokens", None, lo=-1)
    if keep == 0:
        raise ParamError("truncate_prompt_tokens: -1 (the model's length) or a number of tokens >= 1", "truncate_prompt_tokens")
    behavior = get_str(body, "error_behavior", "error")
    if behavior not in ("error", "truncate"):
        raise ParamError('error_behavior: must be "error" or "truncate"', "error_behavior")
    truncate = get_bool(body, "truncate")  # read first: a wrong type is a 400 whatever else is given
    if keep is None and (behavior == "truncate" or truncate):
        keep = -1
    return keep


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


async def embeddings(embedder: Embedder, engine: EngineClient, cfg: ServerConfig, body: dict[str, Any]) -> dict[str, Any]:
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
    truncate = _truncate(body)
    if decoder:
        if truncate is not None:
            raise ParamError("truncate_prompt_tokens: only the all-MiniLM-L6-v2 encoder truncates its inputs", "truncate_prompt_tokens")
        vectors, tokens = await _decoder_embed(engine, inputs, cfg.embedding_pooling or "last", dims, cfg.max_queue)
    else:
        result = await embedder.encode(engine, inputs, dims, truncate, cfg.max_queue)
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
    engine: EngineClient, inputs: list[Any], pooling: str, dims: int | None, queue_limit: int | None = None
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
