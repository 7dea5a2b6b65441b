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
    integers,
)
from inflight.server.structured_fields import structured_outputs

MAX_TEXT_CHARS = 4 << 20  # SPEC §4: text inputs at most 4 MiB of characters
_UINT64_MAX = 2**64 - 1
_INT64_MIN = -(2**63)  # vLLM accepts signed 64-bit seeds; a negative seed is used modulo 2**64


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
    return_token_ids: bool = False  # vLLM: token ids of prompt and output beside the text
    tokens_as_ids: bool = False  # vLLM return_tokens_as_token_ids: logprob tokens as "token_id:42"
    truncate_prompt_tokens: int | None = None  # vLLM: keep the last N prompt tokens (-1: the model's limit)
    truncation_side: str = "left"  # which end truncate_prompt_tokens cuts
    request_id: str | None = None  # vLLM: the caller's id, used as the response id
    max_tokens_zero: bool = False  # completions max_tokens 0 (echo scoring): no tokens are returned
    cache_salt: str | None = None  # vLLM: prefix-cache hits only between requests with the same salt
    extra: dict[str, Any] = field(default_factory=dict)


def sampling_params(body: dict[str, Any], chat: bool, default_max_tokens: int | None = 16) -> SamplingParams:
    """The sampling fields of §1 as OpenAI / vLLM name them. `max_tokens: 0` (completions, the
    legacy scoring call) reaches here as None: the caller checked echo and runs one token."""
    max_tokens = get_int(body, "max_completion_tokens", None, lo=1) if chat else None
    legacy = get_int(body, "max_tokens", None if chat else default_max_tokens, lo=1)  # checked even when overridden
    if max_tokens is None:
        max_tokens = legacy
    n = get_int(body, "n", 1, lo=1, hi=128)
    best_of = get_int(body, "best_of", None, lo=1, hi=128)
    if best_of is not None and best_of < n:  # type: ignore[operator]
        raise ParamError("best_of: must be >= n", "best_of")
    # >= 0 with no upper bound: MindIE documents values above 2 as allowed, vLLM accepts them
    temperature = get_float(body, "temperature", 1.0, lo=0.0)
    use_beam = bool(get_bool(body, "use_beam_search", False))
    if (best_of or 1) > 1 and temperature == 0.0 and not use_beam:  # type: ignore[operator]
        raise ParamError("best_of: sampling several sequences needs temperature > 0 (or use_beam_search)", "best_of")
    if n > 1 and temperature == 0.0 and not use_beam:  # type: ignore[operator]
        raise ParamError("n: sampling several sequences needs temperature > 0", "n")
    seed = get_int(body, "seed", None, lo=_INT64_MIN, hi=_UINT64_MAX)
    if seed is not None:
        seed %= 2**64  # torch's manual_seed reads a negative seed the same way
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
        allowed_token_ids=_allowed_token_ids(body),
        no_repeat_ngram_size=get_int(body, "no_repeat_ngram_size", 0, lo=0, hi=2**31 - 1),  # type: ignore[arg-type]
        use_beam_search=use_beam,
        length_penalty=get_float(body, "length_penalty", 1.0),  # type: ignore[arg-type]
        early_stopping=_early_stopping(body),
        prompt_logprobs=get_int(body, "prompt_logprobs", None, lo=-1, hi=20),
        logprobs=_logprobs(body, chat),
        logprob_token_ids=get_int_list(body, "logprob_token_ids"),
        structured_outputs=structured_outputs(body),
    )


def _early_stopping(body: dict[str, Any]) -> bool | str:
    v = body.get("early_stopping", False)
    if v is None:
        return False
    if not (isinstance(v, bool) or v == "never"):
        raise ParamError('early_stopping: must be true, false or "never"', "early_stopping")
    return v


def _allowed_token_ids(body: dict[str, Any]) -> list[int] | None:
    ids = get_int_list(body, "allowed_token_ids")
    if ids is not None and not ids:
        raise ParamError("allowed_token_ids: must not be empty", "allowed_token_ids")
    return ids


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """-1 (vLLM) asks for every token of the vocabulary."""
    if not chat:  # completions: logprobs is an integer 0..5
        return get_int(body, "logprobs", None, lo=-1, hi=5)
    want = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", None, lo=-1, hi=20)
    if top is not None and not want:
        raise ParamError("top_logprobs: needs logprobs set to true", "top_logprobs")
    return (top or 0) if want else None


def common(body: dict[str, Any], chat: bool, default_max_tokens: int | None = 16) -> OpenAIRequest:
    opts = get_dict(body, "stream_options") or {}
    stream = bool(get_bool(body, "stream", False))
    if opts and not stream:
        raise ParamError("stream_options: only allowed with stream set to true", "stream_options")
    zero = not chat and body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if zero:
        if not get_bool(body, "echo", False):
            raise ParamError("max_tokens: 0 is only allowed with echo (prompt scoring)", "max_tokens")
        body = {**body, "max_tokens": 1}  # one token runs; the response returns none
    truncate = get_int(body, "truncate_prompt_tokens", None, lo=-1)
    if truncate == 0:
        raise ParamError("truncate_prompt_tokens: must be >= 1, or -1 for the model's limit", "truncate_prompt_tokens")
    side = get_str(body, "truncation_side", "left")
    if side not in ("left", "right"):
        raise ParamError('truncation_side: must be "left" or "right"', "truncation_side")
    refuse_unsupported(body)
    get_str(body, "user")  # OpenAI's end-user id (abuse monitoring there): type-checked, nothing to do here
    cache_salt = get_str(body, "cache_salt")
    if cache_salt == "":
        raise ParamError("cache_salt: must not be empty", "cache_salt")
    request_id = get_str(body, "request_id")
    if request_id is not None and not 0 < len(request_id) <= 256:
        raise ParamError("request_id: must be 1-256 characters", "request_id")
    return OpenAIRequest(
        model=get_str(body, "model"),
        params=sampling_params(body, chat, default_max_tokens),
        stream=stream,
        stream_options=StreamOptions(
            include_usage=bool(get_bool(opts, "include_usage", False)),
            continuous_usage_stats=bool(get_bool(opts, "continuous_usage_stats", False)),
        ),
        priority=get_int(body, "priority", 5, lo=1, hi=5),  # type: ignore[arg-type]
        timeout=get_float(body, "timeout", None, lo=0.0, hi=3600.0, lo_open=True),
        return_token_ids=bool(get_bool(body, "return_token_ids", False)),
        tokens_as_ids=bool(get_bool(body, "return_tokens_as_token_ids", False)),
        truncate_prompt_tokens=truncate,
        truncation_side=side,  # type: ignore[arg-type]
        request_id=request_id,
        max_tokens_zero=zero,
        cache_salt=cache_salt,
    )


# Fields of the OpenAI / vLLM APIs this server does not implement, with the values that ask for
# nothing (accepted): anything else is a 400 naming the field, never silently dropped.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (), "function_call": ("none",),  # OpenAI's legacy tools: send tools / tool_choice
    "audio": (), "modalities": (["text"],), "prediction": (), "web_search_options": (),
    "store": (False,), "metadata": ({},),  # stored completions (OpenAI's platform)
    "service_tier": ("auto", "default"),
    "guided_decoding_backend": ("xgrammar", "auto"), "guided_whitespace_pattern": (),  # vLLM
    "logits_processors": ([],), "mm_processor_kwargs": ({},), "kv_transfer_params": (), "vllm_xargs": ({},),
    "prompt_embeds": (),
}  # fmt: skip


# Every top-level field /v1/chat/completions reads (OpenAI's names and vLLM's), the refused ones
# above included: /v1/responses and /v1/messages pass these on as this server's extensions and
# refuse any name outside their own and these (tests/server/test_api_field_table.py)
CHAT_FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "user", "n", "best_of", "use_beam_search", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "stop", "stop_token_ids",
    "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "min_tokens",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "bad_words", "allowed_token_ids",
    "no_repeat_ngram_size", "length_penalty", "early_stopping", "prompt_logprobs", "logprobs", "top_logprobs",
    "logprob_token_ids", "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "tools", "tool_choice", "parallel_tool_calls", "reasoning_effort", "include_reasoning",
    "thinking_token_budget", "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
    "documents", "add_special_tokens", "echo", "request_id", "return_token_ids", "return_tokens_as_token_ids",
    "truncate_prompt_tokens", "truncation_side", "cache_salt", "priority", "timeout", *UNSUPPORTED,
})  # fmt: skip


def refuse_unsupported(body: dict[str, Any]) -> None:
    for name, accepted in UNSUPPORTED.items():
        v = body.get(name)
        if v is not None and v not in accepted:
            raise ParamError(f"{name}: not supported by this server", name)


def completion_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """`prompt`: a string, an array of strings, token ids, or an array of token-id arrays."""
    v = body.get("prompt")
    if v is None:
        raise ParamError("prompt: required", "prompt")
    if isinstance(v, str):
        prompts: list[Any] = [v]
    elif v and (ids := integers(v)) is not None:
        prompts = [ids]
    elif isinstance(v, list) and v and all(isinstance(p, (str, list)) for p in v):
        prompts = [p if isinstance(p, str) else integers(p) or p for p in v]
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


def chat_messages(body: dict[str, Any], media: list[Any] | None = None) -> list[dict[str, Any]]:
    """`messages` checked for shape; content parts are flattened to text for the template. With
    `media` (a vision-language model), image / video parts stay as template parts and their
    references are appended to `media` in prompt order (server/media_fields.py).

    Roles beyond system / developer / user / assistant / tool are passed to the chat template
    (vLLM does; a template that cannot render one is a 400), and so is a `system` message after
    the first (OpenAI and vLLM accept it; Databricks documents system-first only, and a template
    that refuses it, as many do with raise_exception, is a 400 naming `messages` with its error).
    As MindIE documents: a `tool` message needs `tool_call_id`."""
    messages = get_list(body, "messages")
    if not messages:
        raise ParamError("messages: must be a non-empty array", "messages")
    out, total = [], 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise ParamError(f"messages[{i}].role: must be a non-empty string (system, user, assistant, tool, ...)", "messages")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise ParamError(f"messages[{i}].{key}: must be a string", "messages")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise ParamError(f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers", "messages")
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
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):  # {"type": {}} was a TypeError (500)
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
