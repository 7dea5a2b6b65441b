"""Request bodies -> engine prompts: the chat template with vLLM's options, fill-in-the-middle
`suffix`, and prompt truncation (vLLM `truncate_prompt_tokens` / `truncation_side`, Databricks
`error_behavior: "truncate"`). Everything here tokenizes on the caller's thread; a problem is a
ParamError naming the field."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from inflight.engine.client import EngineClient
from inflight.engine.tokenizer import apply_chat_template, encode_text
from inflight.sampling_params import ParamError
from inflight.server.fields import get_bool, get_dict, get_list, get_str
from inflight.server.openai import protocol as proto

logger = logging.getLogger(__name__)

# fill-in-the-middle token sets, (prefix, suffix, middle), as the model families name them
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)


@dataclass
class Prompts:
    """Engine prompts of one body, plus what the server has to tell the client about them."""

    items: list[Any]
    warnings: list[str] = field(default_factory=list)


def _vocab(tok: Any) -> dict[str, int]:
    try:
        return dict(tok.get_vocab())
    except (AttributeError, NotImplementedError):
        return {}


def fim_prompt(tok: Any, prompt: str, suffix: str) -> str:
    """`suffix` as OpenAI defines it (the text after the insertion), for models with FIM tokens."""
    vocab = _vocab(tok) if tok is not None else {}
    for pre, suf, mid in FIM_TOKENS:
        if pre in vocab and suf in vocab and mid in vocab:
            return f"{pre}{prompt}{suf}{suffix}{mid}"
    raise ParamError(
        "suffix: this model has no fill-in-the-middle tokens (needs <|fim_prefix|>/<|fim_suffix|>/<|fim_middle|> "
        "or <fim_prefix>/<fim_suffix>/<fim_middle>), so a suffix cannot be honoured",
        "suffix",
    )


def completion_prompts(
    engine: EngineClient, body: dict[str, Any], req: proto.OpenAIRequest
) -> Prompts:
    """`prompt` (+ `suffix`, truncation, `error_behavior`) -> engine prompts."""
    raw = proto.completion_prompts(body)
    suffix = get_str(body, "suffix")
    get_bool(
        body, "use_raw_prompt"
    )  # Databricks: prompts are never templated here, so both values hold
    behavior = get_str(body, "error_behavior", "error")
    if behavior not in ("error", "truncate"):
        raise ParamError('error_behavior: must be "error" or "truncate"', "error_behavior")
    tok = engine.tokenizer
    if suffix:
        if any(not isinstance(p, str) for p in raw):
            raise ParamError("suffix: only with text prompts", "suffix")
        raw = [fim_prompt(tok, p, suffix) for p in raw]
    out = Prompts([])
    for p in raw:
        if isinstance(p, str) and (req.truncate_prompt_tokens or behavior == "truncate"):
            if tok is None:
                raise ParamError("prompt: this model has no tokenizer; send token ids", "prompt")
            p = {
                "prompt": p,
                "prompt_token_ids": encode_text(tok, p, "prompt", add_special_tokens=True),
            }
        out.items.append(_truncate(engine, p, req, behavior == "truncate", out.warnings))
    return out


def _truncate(
    engine: EngineClient, p: Any, req: proto.OpenAIRequest, to_fit: bool, warnings: list[str]
) -> Any:
    ids = p["prompt_token_ids"] if isinstance(p, dict) else p if isinstance(p, list) else None
    if ids is None:
        return p
    limit = engine.model_info.max_prompt_len
    keep = req.truncate_prompt_tokens
    if keep == -1 or (keep is None and to_fit):
        keep = limit
    if keep is None or len(ids) <= keep:
        return p
    if keep > limit and req.truncate_prompt_tokens is not None:
        raise ParamError(
            f"truncate_prompt_tokens: must be <= {limit}, the longest prompt accepted",
            "truncate_prompt_tokens",
        )
    kept = ids[-keep:] if req.truncation_side == "left" else ids[:keep]
    if req.truncate_prompt_tokens is None:  # error_behavior truncate: say what was dropped
        warnings.append(
            f"prompt: {len(ids)} tokens, more than the {limit} accepted; the first {len(ids) - keep} were dropped"
        )
        logger.info(
            "request prompt truncated from %d to %d tokens (error_behavior truncate)",
            len(ids),
            keep,
        )
    tok = engine.tokenizer
    return {"prompt": tok.decode(kept) if tok is not None else None, "prompt_token_ids": kept}


_TEMPLATE_ARGS = (
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "documents",
    "chat_template",
    "tokenize",
)


def chat_prompt(
    engine: EngineClient, body: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
    req: proto.OpenAIRequest,
) -> Prompts:  # fmt: skip
    """The chat template's prompt (see `chat_text`), tokenized and truncated as asked."""
    tok = engine.tokenizer
    text = chat_text(tok, body, messages, tools)
    ids = encode_text(tok, text, "messages", bool(get_bool(body, "add_special_tokens", False)))
    out = Prompts([])
    out.items.append(
        _truncate(engine, {"prompt": text, "prompt_token_ids": ids}, req, False, out.warnings)
    )
    return out


def chat_text(
    tok: Any,
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> str:
    """The chat template over `messages` with vLLM's template options: `chat_template_kwargs`
    (e.g. `enable_thinking` for Qwen3), `add_generation_prompt`, `continue_final_message`,
    `documents`, `chat_template` (a template string for this request)."""
    kwargs = get_dict(body, "chat_template_kwargs") or {}
    for name in ("messages", "conversation", "tok", "tokenizer"):  # the messages themselves: a TypeError (500) once
        if name in kwargs:
            raise ParamError(f"chat_template_kwargs.{name}: reserved (the request's messages are the template's)", "chat_template_kwargs")
    kwargs = {k: v for k, v in kwargs.items() if k not in _TEMPLATE_ARGS}
    add_gen = bool(get_bool(body, "add_generation_prompt", True))
    cont = bool(get_bool(body, "continue_final_message", False))
    if add_gen and cont and "add_generation_prompt" in body:
        raise ParamError(
            "continue_final_message: cannot be combined with add_generation_prompt",
            "continue_final_message",
        )
    if cont and messages[-1].get("role") != "assistant":
        raise ParamError(
            "continue_final_message: the last message must be an assistant message",
            "continue_final_message",
        )
    docs = get_list(body, "documents")
    if docs is not None and not all(isinstance(d, dict) for d in docs):
        raise ParamError("documents: must be an array of objects", "documents")
    return render_chat(
        tok, messages, add_generation_prompt=add_gen and not cont, tools=tools, chat_template=get_str(body, "chat_template"),
        continue_final_message=cont, documents=docs, **kwargs,
    )  # fmt: skip


def render_chat(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """apply_chat_template; a template that cannot render these messages is a 400, never a 500."""
    import jinja2

    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        return apply_chat_template(tok, messages, **kwargs)
    except ParamError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise ParamError(
            f"messages: the chat template cannot render these messages ({type(e).__name__}: {e})",
            "messages",
        ) from e
