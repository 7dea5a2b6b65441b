"""OpenAI request bodies -> validated engine inputs (SPEC §2, §4).

Field names follow the OpenAI API plus vLLM's extensions; every violation is a
ParamError naming the field (HTTP 400). Unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inflight.sampling_params import ParamError, SamplingParams
from inflight.server.fields import (
    get_bad_words,
    get_bool,
    get_dict,
    get_float,
    get_int,
    get_int_list,
    get_list,
    get_logit_bias,
    get_stop,
    get_str,
)
from inflight.server.structured_fields import structured_outputs

MAX_TEXT_CHARS = 4 << 20  # SPEC §4: text inputs at most 4 MiB of characters
_UINT64_MAX = 2**64 - 1


@dataclass
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@dataclass
class OpenAIRequest:
    """What both endpoints share once validated."""

    model: str | None
    params: SamplingParams
    stream: bool
    stream_options: StreamOptions
    priority: int
    timeout: float | None
    extra: dict[str, Any] = field(default_factory=dict)


def sampling_params(body: dict[str, Any], chat: bool) -> SamplingParams:
    """The sampling fields of §1 as OpenAI / vLLM name them."""
    max_tokens = get_int(body, "max_completion_tokens", None, lo=1) if chat else None
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", None if chat else 16, lo=1)
    n = get_int(body, "n", 1, lo=1, hi=128)
    best_of = get_int(body, "best_of", None, lo=1, hi=128)
    if best_of is not None and best_of < n:  # type: ignore[operator]
        raise ParamError("best_of: must be >= n", "best_of")
    temperature = get_float(body, "temperature", 1.0, lo=0.0, hi=2.0)
    use_beam = bool(get_bool(body, "use_beam_search", False))
    if (n > 1 or (best_of or 1) > 1) and temperature == 0.0 and not use_beam:  # type: ignore[operator]
        raise ParamError("n: sampling several sequences needs temperature > 0", "n")
    seed = get_int(body, "seed", None, lo=0, hi=_UINT64_MAX)
    top_k = get_int(body, "top_k", 0, lo=-1, hi=2**31 - 1)
    return SamplingParams(
        n=n,  # type: ignore[arg-type]
        best_of=best_of,
        max_tokens=max_tokens,
        temperature=temperature,  # type: ignore[arg-type]
        top_p=get_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),  # type: ignore[arg-type]
        top_k=top_k,  # type: ignore[arg-type]
        min_p=get_float(body, "min_p", 0.0, lo=0.0, hi=1.0),  # type: ignore[arg-type]
        typical_p=get_float(body, "typical_p", 1.0, lo=0.0, hi=1.0, lo_open=True),  # type: ignore[arg-type]
        seed=seed,
        stop=get_stop(body),
        stop_token_ids=get_int_list(body, "stop_token_ids") or [],
        ignore_eos=bool(get_bool(body, "ignore_eos", False)),
        include_stop_str_in_output=bool(get_bool(body, "include_stop_str_in_output", False)),
        skip_special_tokens=bool(get_bool(body, "skip_special_tokens", True)),
        spaces_between_special_tokens=bool(get_bool(body, "spaces_between_special_tokens", True)),
        min_tokens=get_int(body, "min_tokens", 0, lo=0),  # type: ignore[arg-type]
        repetition_penalty=get_float(body, "repetition_penalty", 1.0, lo=0.0, hi=2.0, lo_open=True),  # type: ignore[arg-type]
        presence_penalty=get_float(body, "presence_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        frequency_penalty=get_float(body, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        logit_bias=get_logit_bias(body),
        bad_words=get_bad_words(body),
        no_repeat_ngram_size=get_int(body, "no_repeat_ngram_size", 0, lo=0),  # type: ignore[arg-type]
        use_beam_search=use_beam,
        length_penalty=get_float(body, "length_penalty", 1.0),  # type: ignore[arg-type]
        early_stopping=_early_stopping(body),
        prompt_logprobs=get_int(body, "prompt_logprobs", None, lo=0, hi=20),
        logprobs=_logprobs(body, chat),
        structured_outputs=structured_outputs(body),
    )


def _early_stopping(body: dict[str, Any]) -> bool | str:
    v = body.get("early_stopping", False)
    if v is None:
        return False
    if not (isinstance(v, bool) or v == "never"):
        raise ParamError('early_stopping: must be true, false or "never"', "early_stopping")
    return v


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if not chat:  # completions: logprobs is an integer 0..5
        return get_int(body, "logprobs", None, lo=0, hi=5)
    want = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", None, lo=0, hi=20)
    if top is not None and not want:
        raise ParamError("top_logprobs: needs logprobs set to true", "top_logprobs")
    return (top or 0) if want else None


def common(body: dict[str, Any], chat: bool) -> OpenAIRequest:
    opts = get_dict(body, "stream_options") or {}
    stream = bool(get_bool(body, "stream", False))
    if opts and not stream:
        raise ParamError("stream_options: only allowed with stream set to true", "stream_options")
    return OpenAIRequest(
        model=get_str(body, "model"),
        params=sampling_params(body, chat),
        stream=stream,
        stream_options=StreamOptions(
            include_usage=bool(get_bool(opts, "include_usage", False)),
            continuous_usage_stats=bool(get_bool(opts, "continuous_usage_stats", False)),
        ),
        priority=get_int(body, "priority", 5, lo=1, hi=5),  # type: ignore[arg-type]
        timeout=get_float(body, "timeout", None, lo=0.0, hi=3600.0, lo_open=True),
    )


def completion_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """`prompt`: a string, an array of strings, token ids, or an array of token-id arrays."""
    v = body.get("prompt")
    if v is None:
        raise ParamError("prompt: required", "prompt")
    if isinstance(v, str):
        prompts: list[Any] = [v]
    elif isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        prompts = [v]
    elif isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
        prompts = v
    else:
        raise ParamError("prompt: must be a string, an array of strings, token ids, or arrays of token ids", "prompt")
    for p in prompts:
        _check_prompt(p)
    return prompts


def _check_prompt(p: Any) -> None:
    if isinstance(p, str):
        if not p:
            raise ParamError("prompt: must not be empty", "prompt")
        if len(p) > MAX_TEXT_CHARS:
            raise ParamError(f"prompt: longer than {MAX_TEXT_CHARS} characters", "prompt")
    elif not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        raise ParamError("prompt: token-id prompts must be non-empty arrays of integers", "prompt")


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def chat_messages(body: dict[str, Any], media: list[Any] | None = None) -> list[dict[str, Any]]:
    """`messages` checked for shape; content parts are flattened to text for the template. With
    `media` (a vision-language model), image / video parts stay as template parts and their
    references are appended to `media` in prompt order (server/media_fields.py)."""
    messages = get_list(body, "messages")
    if not messages:
        raise ParamError("messages: must be a non-empty array", "messages")
    out, total = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise ParamError(f"messages[{i}].role: must be one of {sorted(_ROLES)}", "messages")
        msg = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            msg["content"] = _join_parts(content, i, media)
        elif content is not None and not isinstance(content, str):
            raise ParamError(f"messages[{i}].content: must be a string or an array of parts", "messages")
        elif content is None and not m.get("tool_calls"):
            msg["content"] = ""
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = _template_tool_calls(m["tool_calls"], i)
        c = msg.get("content") or ""
        total += len(c) if isinstance(c, str) else sum(len(p.get("text", "")) for p in c)
        out.append(msg)
    if total > MAX_TEXT_CHARS:
        raise ParamError(f"messages: more than {MAX_TEXT_CHARS} characters in all", "messages")
    return out


def _template_tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """Assistant tool_calls as chat templates expect them: arguments as an object, not JSON text."""
    import json

    if not isinstance(calls, list):
        raise ParamError(f"messages[{i}].tool_calls: must be an array", "messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ParamError(f"messages[{i}].tool_calls: each needs function.name", "messages")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                raise ParamError(f"messages[{i}].tool_calls: arguments are not valid JSON ({e})", "messages") from e
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def _join_parts(parts: list[Any], i: int, media: list[Any] | None = None) -> str | list[dict[str, Any]]:
    """Text parts joined by newlines; with image / video parts (vision-language models only) the
    parts themselves, for the chat template to place the placeholders."""
    from inflight.server.media_fields import media_part

    texts: list[str] = []
    kept: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or "type" not in part:
            raise ParamError(f"messages[{i}].content: parts must be objects with a type", "messages")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise ParamError(f"messages[{i}].content: a text part needs a string text", "messages")
            texts.append(part["text"])
            kept.append({"type": "text", "text": part["text"]})
            continue
        found = media_part(part, f"messages[{i}].content[{j}]")  # audio: a 400 here
        if found is None or media is None:  # a text model, or an unknown part type
            raise ParamError(f"messages[{i}].content: part type {part['type']!r} is not supported by this model", "messages")
        kept.append(found[0])
        media.append(found[1])
    if len(kept) == len(texts):
        return "\n".join(texts)
    return kept
