"""Server configuration: what the HTTP layer needs beyond the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.multimodal.media import MediaOptions
from inflight.reasoning import ReasoningParser
from inflight.server.connection import ConnectionLimits


@dataclass(frozen=True)
class ServerConfig:
    # the first name is the one reported; any alias is accepted in requests and URLs
    served_model_names: tuple[str, ...] = ("model",)
    full_text_enabled: bool = False  # /v2 text_output is the whole text so far (MindIE)
    api_keys: tuple[str, ...] = ()  # empty = no auth
    auth_metrics: bool = True  # /metrics needs the key too (health never does)
    max_body_bytes: int = 64 << 20  # text inputs are at most 4 MiB of characters (x4 UTF-8, JSON escapes)
    max_queue: int = 1024  # waiting + running requests before 429
    perf_extras: bool = False  # MindIE prefill_time / decode_time_arr / batch_size / queue_wait_time
    # MindIE's defaults where they differ from OpenAI's: usage in the final chunk of every stream,
    # completions max_tokens up to max_iter_times / the context instead of 16
    mindie_defaults: bool = False
    tool_call_parser: str | None = None  # hermes | llama3_json | mistral; None: detected from the chat template
    # qwen3 | deepseek_r1 | tags | none; None: detected from the chat template (docs/REASONING.md)
    reasoning_parser: str | None = None
    reasoning_tags: tuple[str, str] | None = None  # the `tags` parser's start and end token
    reasoning: ReasoningParser | None = None  # the resolved parser: build_app sets it from the tokenizer
    responses_store_size: int = 1024  # /v1/responses kept for GET and previous_response_id (0: none)
    responses_store_bytes: int = 256 << 20  # and their JSON bytes at most, all keys together
    embedding_pooling: str | None = None  # "last" | "mean": /v1/embeddings also serves the decoder model
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)  # per-connection timeouts and sizes
    shutdown_timeout: float = 30.0  # SIGTERM: in-flight requests get this long, then are aborted
    media: MediaOptions = field(default_factory=MediaOptions)  # images / video: sources and limits
    # runtime LoRA loads read only under this directory (None: only the --lora-modules ones; lora_paths.py)
    lora_root: str | None = None
    # /v2 stream framing: "auto" (Triton / TensorRT-LLM bodies get Triton's `data: {...}`, MindIE
    # bodies MindIE's `data:{...}`), or one of "mindie" / "triton" for every request (generate/routes.py)
    v2_stream_dialect: str = "auto"
    max_logprobs: int = 20  # vLLM's --max-logprobs: the most (prompt) logprobs a request may ask; -1: no cap
    per_request_metrics: bool = False  # vLLM's --enable-per-request-metrics: a `metrics` object per response

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]
