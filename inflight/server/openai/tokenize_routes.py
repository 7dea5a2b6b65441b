"""vLLM's utility routes: POST /tokenize, POST /detokenize (`vllm bench serve` and other tools ask
for them), and POST /invocations (the SageMaker route, dispatched on the body's shape)."""

from __future__ import annotations

from typing import Any

from inflight.engine.client import EngineClient
from inflight.engine.tokenizer import encode_text
from inflight.sampling_params import ParamError
from inflight.server.fields import get_bool, get_int_list
from inflight.server.openai import protocol as proto
from inflight.server.openai.prompts import chat_text
from inflight.server.openai.tool_fields import tool_request


def _tokenizer(engine: EngineClient) -> Any:
    tok = engine.tokenizer
    if tok is None:
        raise ParamError("model: this model has no tokenizer", "model")
    return tok


def tokenize(engine: EngineClient, body: dict[str, Any]) -> dict[str, Any]:
    """`{"prompt": str}` or `{"messages": [...]}` (the chat template applied, as vLLM) ->
    `{"count", "max_model_len", "tokens", "token_strs"}`."""
    tok = _tokenizer(engine)
    if body.get("messages") is not None:
        messages = proto.chat_messages(body)
        tools = tool_request(body).tools or None
        text = chat_text(tok, body, messages, tools)
        add_special = get_bool(body, "add_special_tokens", False)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ParamError("prompt: must be a string (or send messages)", "prompt")
        if len(prompt) > proto.MAX_TEXT_CHARS:
            raise ParamError(f"prompt: longer than {proto.MAX_TEXT_CHARS} characters", "prompt")
        text, add_special = prompt, get_bool(body, "add_special_tokens", True)
    ids = encode_text(tok, text, "messages" if "messages" in body else "prompt", bool(add_special))
    strs = tok.convert_ids_to_tokens(ids) if get_bool(body, "return_token_strs", False) else None
    return {
        "count": len(ids),
        "max_model_len": engine.model_info.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


def detokenize(engine: EngineClient, body: dict[str, Any]) -> dict[str, Any]:
    """`{"tokens": [ids]}` -> `{"prompt": text}`."""
    tok = _tokenizer(engine)
    ids = get_int_list(body, "tokens")
    if ids is None:
        raise ParamError("tokens: required (an array of token ids)", "tokens")
    vocab = engine.model_info.vocab_size
    if any(t >= vocab for t in ids):
        raise ParamError(f"tokens: token ids must be < vocab size {vocab}", "tokens")
    return {"prompt": tok.decode(ids)}


def tokenizer_info(engine: EngineClient) -> dict[str, Any]:
    """vLLM's GET /tokenizer_info: the tokenizer's init kwargs (file paths dropped, added tokens
    as their text), its class and the chat template the server applies."""
    tok = _tokenizer(engine)
    config = {k: v for k, v in dict(getattr(tok, "init_kwargs", None) or {}).items() if k not in ("vocab_file", "merges_file")}
    info: dict[str, Any] = _json_safe(config) | {"tokenizer_class": type(tok).__name__}
    template = getattr(tok, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _json_safe(obj: Any) -> Any:
    if hasattr(obj, "content"):  # tokenizers' AddedToken
        return obj.content
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj if obj is None or isinstance(obj, str | int | float | bool) else str(obj)


def invocation_kind(body: dict[str, Any]) -> str:
    """Which endpoint a SageMaker /invocations body is for, from its shape (as vLLM decides)."""
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completions"
    if "input" in body:
        return "embeddings"
    raise ParamError(
        "body: /invocations needs messages (chat), prompt (completions) or input (embeddings)",
        "body",
    )
