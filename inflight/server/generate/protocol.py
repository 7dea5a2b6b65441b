"""/v2 generate bodies -> a validated engine request (MindIE names and Triton / TensorRT-LLM names).

Two body forms, and any mix of them:
  MindIE:  {"id": "a1", "text_input": "...", "parameters": {"max_new_tokens": 20, ...}}
  Triton:  {"text_input": "..." | ["..."], "max_tokens": 20, "bad_words": "", "stop_words": "", ...}
           (the tensorrt_llm ensemble / BLS input names, or the tensorrt_llm model's own:
           `input_ids`, `request_output_len`, `runtime_top_k`, `stop_words_list`, ...)
Top-level fields and `parameters` merge; the same field given twice with different values (in both
places, or under two names: `max_tokens` and `request_output_len`) is a 400 naming both.
Triton clients send tensors: a one-element list is read as the scalar (`"end_id": [2]`), and
`"bad_words": ""` / `[""]` mean no words. A request that uses any Triton name is answered with the
Triton outputs too (`output_ids`, `sequence_length`, ...; see routes.py; the tensor-shaped inputs are tensors.py's).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from inflight.sampling_params import ParamError, SamplingParams
from inflight.server import fields as F
from inflight.server.generate import tensors as T
from inflight.server.openai.protocol import MAX_TEXT_CHARS

_ID = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_I32 = 2**31 - 1

# MindIE's documented /v2 parameters (reference/mindie-generate-stream.txt) plus our MindIE-side
# extensions; a body using only these gets MindIE's exact response format.
MINDIE_NAMES = {
    "details", "do_sample", "max_new_tokens", "repetition_penalty", "seed", "temperature", "top_k", "top_p",
    "batch_size", "typical_p", "watermark", "perf_stat", "priority", "timeout", "ignore_eos", "min_p",
    "include_stop_str_in_output", "skip_special_tokens", "no_repeat_ngram_size",
}  # fmt: skip
# several names, one engine field: the first is ours, the others TensorRT-LLM's / Triton's
ALIASES = {
    "max_new_tokens": ("max_new_tokens", "max_tokens", "request_output_len"),
    "top_k": ("top_k", "runtime_top_k"),
    "top_p": ("top_p", "runtime_top_p"),
    "length_penalty": ("length_penalty", "len_penalty"),
    "seed": ("seed", "random_seed"),
    "stream": ("stream", "streaming"),
    "min_length": ("min_length", "min_tokens"),
}
# fields that are one value (Triton sends them as one-element tensors)
SCALARS = {
    *ALIASES, *(n for names in ALIASES.values() for n in names), "details", "do_sample", "repetition_penalty",
    "temperature", "typical_p", "min_p", "watermark", "priority", "timeout", "ignore_eos", "include_stop_str_in_output",
    "skip_special_tokens", "no_repeat_ngram_size", "presence_penalty", "frequency_penalty", "end_id", "pad_id",
    "beam_width", "early_stopping", "return_log_probs", "return_context_logits", "return_generation_logits",
    "prompt_vocab_size", "input_lengths", "id", "lora_task_id",
}  # fmt: skip


@dataclass
class GenerateRequest:
    """A validated /v2 body."""

    request_id: str | None
    prompt: (
        Any  # text, or {"prompt_token_ids": [...], ...} for input_ids / drafts / a p-tuning table
    )
    params: SamplingParams
    details: bool = False
    priority: int = 5
    timeout: float | None = None
    stream: bool = False
    triton: bool = False  # a Triton / TensorRT-LLM name was used: add Triton's outputs
    beam_width: int = 1
    pad_id: int | None = None
    # TensorRT-LLM LoRA: a cached task id, or the id with its weights + config (lora/registry.py)
    lora: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- body shape
def _unwrap(v: Any) -> Any:
    """A one-element tensor as its value: [2] -> 2, [[2]] -> 2."""
    while isinstance(v, list) and len(v) == 1:
        v = v[0]
    return v


def _known() -> set[str]:
    """The fields this endpoint reads (a name no API defines is ignored, in either place)."""
    return MINDIE_NAMES | SCALARS | {name for name, _, _ in T.TRITON_INPUTS}


def _merge(body: dict[str, Any]) -> dict[str, Any]:
    """Top-level fields and `parameters` as one dict; the same field with two values is a 400."""
    params = F.get_dict(body, "parameters") or {}
    merged = {k: v for k, v in body.items() if k != "parameters" and v is not None}
    for k, v in params.items():
        if v is None:
            continue
        if k in merged and k in _known() and _norm(k, merged[k]) != _norm(k, v):
            raise ParamError(
                f"{k}: given at the top level and in parameters with different values", k
            )
        merged[k] = v
    for k in [k for k in merged if k in SCALARS]:
        merged[k] = _unwrap(merged[k])
    for canonical, names in ALIASES.items():
        given = [n for n in names if n in merged]
        if len(given) > 1 and len({repr(merged[n]) for n in given}) > 1:
            raise ParamError(
                f"{given[0]}: conflicts with {given[1]} (the same field, two values)", given[1]
            )
        if given:
            merged[canonical] = merged[given[0]]
            merged.setdefault("_names", {})[canonical] = given[0]
    return merged


def _norm(name: str, v: Any) -> Any:
    return repr(_unwrap(v) if name in SCALARS else v)


def is_triton(body: dict[str, Any]) -> bool:
    """Whether the body is in Triton's form (a top-level field besides id / text_input /
    parameters) or uses a name outside MindIE's: Triton's output tensors are added."""
    params = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
    return bool(set(body) - {"id", "text_input", "parameters"}) or bool(set(params) - MINDIE_NAMES)


def _param(p: dict[str, Any], canonical: str) -> str:
    """The name the client used for a field (so errors name what was sent)."""
    return p.get("_names", {}).get(canonical, canonical)


def _get(p: dict[str, Any], canonical: str, reader: Any, *args: Any, **kw: Any) -> Any:
    name = _param(p, canonical)
    return reader({name: p.get(canonical)}, name, *args, **kw)


# ---------------------------------------------------------------- prompt
# Qwen2-VL's image placeholder: what its chat template writes for an image part (the engine
# repeats the pad once per encoder output row)
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _text_input(v: Any, refs: list[Any] | None = None) -> str:
    """The prompt text. A list of parts (MindIE's multimodal form) is joined in order; with `refs`
    (a vision-language model) each image part becomes the model's placeholder and its reference
    (server/media_fields.MediaRef) is appended to `refs`."""
    if isinstance(v, list) and len(v) == 1 and isinstance(_unwrap(v), str):
        v = _unwrap(v)  # Triton clients send a one-item batch
    elif isinstance(v, list) and v and all(isinstance(p, dict) for p in v):
        from inflight.server.media_fields import media_part

        texts = []
        for j, part in enumerate(v):
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise ParamError(f"text_input[{j}].text: must be a string", "text_input")
                texts.append(part["text"])
                continue
            found = media_part(part, f"text_input[{j}]")  # audio: a 400 here
            if found is None or refs is None:
                kind = part.get("type")
                raise ParamError(
                    f"text_input[{j}]: part type {kind!r} is not supported by this model",
                    "text_input",
                )
            refs.append(found[1])
            texts.append(PLACEHOLDER)
        v = "".join(texts)
    if not isinstance(v, str) or not v:
        raise ParamError("text_input: must be a non-empty string", "text_input")
    if len(v) > MAX_TEXT_CHARS:
        raise ParamError(f"text_input: longer than {MAX_TEXT_CHARS} characters", "text_input")
    return v


def _token_ids(p: dict[str, Any], name: str) -> list[int] | None:
    """A token-id tensor: [ids] or [[ids]] (a batch of one)."""
    v = T.ints(p.get(name))
    if v is None:
        return None
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):
        v = v[0]
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
    ):
        raise ParamError(f"{name}: must be a non-empty array of token ids", name)
    return v


def _prompt(p: dict[str, Any], refs: list[Any] | None = None) -> tuple[Any, list[int] | None]:
    """(prompt for make_request, the token ids when the client sent ids)."""
    ids = _token_ids(p, "input_ids")
    if ids is not None and p.get("text_input") is not None:
        raise ParamError("input_ids: send text_input or input_ids, not both", "input_ids")
    if ids is None:
        if p.get("input_lengths") is not None:
            raise ParamError("input_lengths: only with input_ids", "input_lengths")
        if p.get("text_input") is None:
            raise ParamError("text_input: required (or input_ids)", "text_input")
        return _text_input(p["text_input"], refs), None
    lengths = F.get_int(p, "input_lengths", None, lo=1)
    if lengths is not None and lengths != len(ids):
        raise ParamError(
            f"input_lengths: {lengths} but input_ids has {len(ids)} tokens", "input_lengths"
        )
    return {"prompt_token_ids": ids}, ids


# ---------------------------------------------------------------- words
def _words(p: dict[str, Any], name: str) -> tuple[list[str], list[list[int]]]:
    """stop_words / bad_words: a string, or strings and token-id lists; "" means none."""
    v = p.get(name)
    if v is None or v == "":
        return [], []
    if isinstance(v, str):
        v = [v]
    if (
        isinstance(v, list)
        and len(v) == 1
        and isinstance(v[0], list)
        and all(isinstance(w, str) for w in v[0])
    ):
        v = v[0]  # Triton's batch dimension around the word list
    if not isinstance(v, list):
        raise ParamError(f"{name}: must be a string or an array of strings / token-id arrays", name)
    strings = [w for w in v if isinstance(w, str) and w]
    ids = [T.ints(w) for w in v if isinstance(w, list)]
    if len(strings) + len(ids) != len([w for w in v if w != ""]):
        raise ParamError(f"{name}: must be strings or arrays of token ids", name)
    if any(
        not w or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in w)
        for w in ids
    ):
        raise ParamError(f"{name}: token-id words must be non-empty arrays of token ids", name)
    return strings, ids


def _all_words(p: dict[str, Any], kind: str, vocab: int) -> tuple[list[str], list[list[int]]]:
    """A word of ids past the vocabulary can never match (stop) or be banned (bad): a 400 naming
    the field it came in, not a silently dead word."""
    strings, ids = _words(p, f"{kind}_words")
    fields = [(f"{kind}_words", ids)]
    if p.get(f"{kind}_words_list") is not None:
        fields.append((f"{kind}_words_list", T.trt_word_list(p[f"{kind}_words_list"], f"{kind}_words_list")))
    for name, words in fields:
        if any(t >= vocab for w in words for t in w):
            raise ParamError(f"{name}: token ids must be < the vocabulary size {vocab}", name)
    return strings, [w for _, words in fields for w in words]


def _drafts(p: dict[str, Any], prompt: Any, text: str | None, tokenizer: Any) -> Any:
    drafts = _token_ids(p, "draft_input_ids")
    if drafts is None:
        if p.get("draft_logits") is not None:
            raise ParamError("draft_logits: only with draft_input_ids", "draft_logits")
        return prompt
    if not isinstance(prompt, dict):
        if tokenizer is None:
            raise ParamError("text_input: this model has no tokenizer; send input_ids", "text_input")
        prompt = {"prompt": text, "prompt_token_ids": list(tokenizer.encode(text))}
    prompt["draft_input_ids"] = drafts
    if p.get("draft_logits") is not None:
        prompt["draft_logits"] = T.float_rows(p["draft_logits"], "draft_logits", 2)
    return prompt


# ---------------------------------------------------------------- the request
def _early_stopping(p: dict[str, Any]) -> bool | str:
    """HF's True / False / "never"; TensorRT-LLM's integer form: 1 = true, 0 = false."""
    v = p.get("early_stopping")
    if v is None:
        return False
    if isinstance(v, bool) or v == "never":
        return v
    if v in (0, 1) and isinstance(v, int):
        return bool(v)
    raise ParamError('early_stopping: must be true, false, "never", 0 or 1', "early_stopping")


def _samples(p: dict[str, Any]) -> bool:
    """Sampling unless told otherwise: any sampling control given (top_p 0 is TensorRT-LLM's "off")."""
    return any(p.get(k) is not None for k in ("top_k", "typical_p", "seed", "min_p")) or p.get("top_p") not in (None, 0)


def parse(
    body: dict[str, Any], tokenizer: Any, vocab: int, refs: list[Any] | None = None
) -> GenerateRequest:
    """A validated body; with `refs` (a vision-language model), MindIE image parts' references
    are appended to it (their placeholders are in the prompt text)."""
    rid = _unwrap(body.get("id"))
    if rid is not None and (not isinstance(rid, str) or not _ID.match(rid)):
        raise ParamError("id: 1-256 characters of letters, digits, '_' or '-'", "id")
    p = _merge(body)
    prompt, _ = _prompt(p, refs)
    temperature = F.get_float(p, "temperature", None, lo=0.0)
    do_sample = F.get_bool(p, "do_sample")
    if do_sample is False or (do_sample is None and temperature is None and not _samples(p)):
        temperature = 0.0
    if _param(p, "top_p") == "runtime_top_p" and p.get("top_p") == 0:
        p["top_p"] = None  # TensorRT-LLM: top_p 0 = no nucleus filter
    stop, stop_ids = _all_words(p, "stop", vocab)
    bad, bad_ids = _all_words(p, "bad", vocab)
    beam_width = _get(p, "beam_width", F.get_int, 1, lo=1, hi=128)
    # MindIE's batch_size: a cap on the running batch while this request runs (core/admission.py)
    batch_size = F.get_int(p, "batch_size", None, lo=1, hi=_I32)
    if batch_size is not None and batch_size < beam_width:
        raise ParamError(
            f"batch_size: {batch_size} is below beam_width {beam_width}; the beams run side by side",
            "batch_size",
        )
    want_logprobs = bool(F.get_bool(p, "return_log_probs", False))
    details = bool(F.get_bool(p, "details", False))
    with _v2_names(p):
        params = _sampling_params(p, tokenizer, vocab, temperature, stop, stop_ids, bad, bad_ids, beam_width, batch_size, want_logprobs, details)
    text = prompt if isinstance(prompt, str) else None
    T.ptuning(p, prompt)
    prompt = _drafts(p, prompt, text, tokenizer)
    return GenerateRequest(
        request_id=rid,
        prompt=prompt,
        params=params,
        details=details,
        priority=F.get_int(p, "priority", 5, lo=1, hi=5),  # type: ignore[arg-type]
        timeout=F.get_float(p, "timeout", None, lo=0.0, hi=3600.0, lo_open=True),
        stream=bool(_get(p, "stream", F.get_bool, False)),
        triton=is_triton(body),
        beam_width=beam_width,
        pad_id=F.get_int(p, "pad_id", None, lo=0),
        lora={
            k: v
            for k in ("lora_task_id", "lora_weights", "lora_config")
            if (v := T.lora_field(p, k)) is not None
        },
        extra={
            "return_log_probs": want_logprobs,
            "perf_stat": bool(F.get_bool(p, "perf_stat", False)),
        },
    )


@contextmanager
def _v2_names(p: dict[str, Any]) -> Iterator[None]:
    """SamplingParams names its fields as the Python API does; the error names what the body sent."""
    try:
        yield
    except ParamError as e:
        names = {"stop": "stop_words", "n": "beam_width", "max_batch_size": "batch_size", "min_tokens": "min_length",
                 "max_tokens": "max_new_tokens", "embedding_bias": "embedding_bias"}  # fmt: skip
        canonical = names.get(e.param or "", e.param or "")
        name = _param(p, canonical) if canonical in ALIASES else canonical
        if name == e.param:
            raise
        message = str(e.args[0] if e.args else e)
        raise ParamError(name + message[len(e.param or "") :] if message.startswith(f"{e.param}:") else message, name) from e


def _sampling_params(
    p: dict[str, Any], tokenizer: Any, vocab: int, temperature: float | None, stop: list[str], stop_ids: list[list[int]],
    bad: list[str], bad_ids: list[list[int]], beam_width: int, batch_size: int | None, want_logprobs: bool, details: bool,
) -> SamplingParams:  # fmt: skip
    return SamplingParams(
        n=beam_width,  # every beam comes back, as TensorRT-LLM returns them
        max_tokens=_get(p, "max_new_tokens", F.get_int, None, lo=1, hi=_I32) or 20,
        temperature=1.0 if temperature is None else temperature,
        top_k=_get(p, "top_k", F.get_int, 0, lo=-1, hi=_I32),
        top_p=_get(p, "top_p", F.get_float, 1.0, lo=0.0, hi=1.0, lo_open=True),
        typical_p=F.get_float(p, "typical_p", 1.0, lo=0.0, hi=1.0, lo_open=True),  # type: ignore[arg-type]
        min_p=F.get_float(p, "min_p", 0.0, lo=0.0, hi=1.0),  # type: ignore[arg-type]
        # MindIE: > 0, values above 2 allowed (documented as not recommended)
        repetition_penalty=F.get_float(p, "repetition_penalty", 1.0, lo=0.0, lo_open=True),  # type: ignore[arg-type]
        presence_penalty=F.get_float(p, "presence_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        frequency_penalty=F.get_float(p, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        seed=_get(p, "seed", F.get_int, None, lo=0, hi=T.U64),
        watermark=bool(F.get_bool(p, "watermark", False)),
        stop=stop,
        stop_token_sequences=stop_ids or None,
        bad_words=bad or None,
        bad_words_ids=bad_ids or None,
        embedding_bias=T.embedding_bias(p, tokenizer, vocab),
        min_tokens=_get(p, "min_length", F.get_int, 0, lo=0, hi=_I32),
        no_repeat_ngram_size=F.get_int(p, "no_repeat_ngram_size", 0, lo=0, hi=_I32),  # type: ignore[arg-type]
        beam_width=beam_width,
        length_penalty=_get(p, "length_penalty", F.get_float, 1.0),
        early_stopping=_early_stopping(p),
        end_id=F.get_int(p, "end_id", None, lo=0),
        ignore_eos=bool(F.get_bool(p, "ignore_eos", False)),
        include_stop_str_in_output=bool(F.get_bool(p, "include_stop_str_in_output", False)),
        skip_special_tokens=bool(F.get_bool(p, "skip_special_tokens", True)),
        # beams carry their chosen tokens' logprobs without asking (engine/beam.py)
        logprobs=0 if (want_logprobs or details) and beam_width == 1 else None,
        return_context_logits=bool(F.get_bool(p, "return_context_logits", False)),
        return_generation_logits=bool(F.get_bool(p, "return_generation_logits", False)),
        max_batch_size=batch_size,
    )
