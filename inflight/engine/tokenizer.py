"""Tokenizer loading and prompt encoding (transformers is used for tokenizers only)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from inflight.sampling_params import ParamError

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | Path) -> Any | None:
    """The checkpoint's tokenizer, or None when it ships none (token-id prompts only)."""
    path = Path(path)
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        logger.info("no tokenizer files in %s: serving token-id prompts only", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


PromptInput = str | list[int] | dict[str, Any]


def encode_prompt(tokenizer: Any | None, prompt: PromptInput) -> tuple[str | None, list[int]]:
    """(text, token ids) of one prompt: a string, a token-id list or {"prompt_token_ids": [...]}."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), _check_ids(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return encode_prompt(tokenizer, prompt["prompt"])
        raise ParamError("prompt: a dict prompt needs 'prompt' or 'prompt_token_ids'", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise ParamError("prompt: must not be empty", "prompt")
        if tokenizer is None:
            raise ParamError("prompt: this model has no tokenizer; send token ids", "prompt")
        return prompt, list(tokenizer.encode(prompt, add_special_tokens=True))
    if isinstance(prompt, (list, tuple)):
        return None, _check_ids(list(prompt))
    raise ParamError(f"prompt: unsupported prompt type {type(prompt).__name__}", "prompt")


def _check_ids(ids: Any) -> list[int]:
    if not isinstance(ids, list) or not ids:
        raise ParamError("prompt: token ids must be a non-empty list", "prompt")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ParamError("prompt: token ids must be integers", "prompt")
    return ids


def apply_chat_template(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    if tokenizer is None:
        raise ParamError("messages: this model has no tokenizer, chat is unavailable", "messages")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ParamError("messages: the model has no chat template", "messages")
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        tools=tools,
        **kwargs,
    )
