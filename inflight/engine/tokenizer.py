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
    if path.suffix == ".gguf":  # rebuilt from tokenizer.ggml.* (split files: the first shard has it)
        from transformers import AutoTokenizer

        from inflight.quant.gguf import GGUFCheckpoint, shard_paths

        first = shard_paths(path)[0]
        if GGUFCheckpoint(first).get("tokenizer.ggml.model", "no_vocab") == "no_vocab":
            logger.info("no tokenizer in %s: serving token-id prompts only", path.name)
            return None
        tok = AutoTokenizer.from_pretrained(str(first.parent), gguf_file=first.name)
        _gguf_specials(tok, first)
        return tok
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        logger.info("no tokenizer files in %s: serving token-id prompts only", path)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _gguf_specials(tok: Any, path: Path) -> None:
    """transformers 5.24 reads a GGUF's chat template and bos / eos / pad tokens but drops them
    from the tokenizer it builds: set them from the metadata where it left them unset."""
    from inflight.quant.gguf import GGUFCheckpoint

    meta = GGUFCheckpoint(path)
    if getattr(tok, "chat_template", None) is None:
        tok.chat_template = meta.get("tokenizer.chat_template", None)
    tokens = meta.get("tokenizer.ggml.tokens", [])
    for attr, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id"),
                      ("unk_token", "unknown_token_id")):  # fmt: skip
        i = meta.get(f"tokenizer.ggml.{key}", None)
        if getattr(tok, attr, None) is None and i is not None and 0 <= int(i) < len(tokens):
            setattr(tok, attr, tokens[int(i)])


PromptInput = str | list[int] | dict[str, Any]


def encode_prompt(
    tokenizer: Any | None, prompt: PromptInput, max_chars: int | None = None
) -> tuple[str | None, list[int]]:
    """(text, token ids) of one prompt: a string, a token-id list or {"prompt_token_ids": [...]}.

    A text longer than `max_chars` is refused before it is tokenized (see `max_prompt_chars`)."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), _check_ids(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return encode_prompt(tokenizer, prompt["prompt"], max_chars)
        raise ParamError("prompt: a dict prompt needs 'prompt' or 'prompt_token_ids'", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise ParamError("prompt: must not be empty", "prompt")
        if tokenizer is None:
            raise ParamError("prompt: this model has no tokenizer; send token ids", "prompt")
        if max_chars is not None and len(prompt) > max_chars:
            raise ParamError(
                f"prompt: {len(prompt)} characters can't fit the input token limit (at most {max_chars})",
                "prompt",
            )
        return prompt, encode_text(tokenizer, prompt, "prompt", add_special_tokens=True)
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
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            tools=tools,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - the template runs on user data: whatever it raises is a 400
        # jinja2's UndefinedError / TemplateError (raise_exception), or a TypeError on an odd message shape
        raise ParamError(
            f"messages: the chat template failed on these messages ({type(e).__name__}: {e})",
            "messages",
        ) from e
    if not isinstance(text, str):
        raise ParamError("messages: the chat template did not produce text", "messages")
    return text


def encode_text(
    tokenizer: Any, text: str, param: str, add_special_tokens: bool = False
) -> list[int]:
    """Token ids of user text; text the tokenizer can't take (a lone surrogate) is a 400 naming `param`."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except Exception as e:  # noqa: BLE001 - TypeError / UnicodeEncodeError from the tokenizer on invalid text
        raise ParamError(f"{param}: cannot be tokenized ({type(e).__name__}: {e})", param) from e


def max_chars_per_token(tokenizer: Any) -> int:
    """The most characters of input one token can stand for: the longest vocabulary entry (its byte-level
    or sentencepiece spelling, never shorter than the text it decodes to), times 2 for normalizers that
    shorten text (NFC composes "e" + U+0301 into one character). Text longer than this times a token
    limit can't fit that limit, so it is refused before tokenizing."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    longest = max((len(t) for t in vocab), default=16)
    return 2 * max(longest, 1)
