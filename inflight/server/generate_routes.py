"""POST /v2/models/{model}/generate and /generate_stream (MindIE / Triton / TensorRT-LLM style).

Two body forms:
  MindIE:  {"id": "a1", "text_input": "...", "parameters": {"max_new_tokens": 20, ...}}
  flat:    {"text_input": "..." | ["..."], "max_tokens": 20, "stop_words": [...], "stream": true, ...}
Events are `data:{json}` lines (no space, as MindIE sends them), one per new text piece;
the last adds details.finish_reason: eos_token | stop_sequence | length | timeout | abort.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import AsyncEngine
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError, SamplingParams
from inflight.server import fields as F
from inflight.server.openai_protocol import MAX_TEXT_CHARS

_ID = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_U64 = 2**64 - 1


def _text_input(body: dict[str, Any]) -> str:
    v = body.get("text_input")
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        v = v[0]  # Triton clients send a one-item batch
    elif isinstance(v, list) and v and all(isinstance(p, dict) for p in v):
        if any(p.get("type") != "text" for p in v):
            raise ParamError("text_input: only text parts are supported by this model", "text_input")
        v = "".join(str(p.get("text", "")) for p in v)
    if not isinstance(v, str) or not v:
        raise ParamError("text_input: must be a non-empty string", "text_input")
    if len(v) > MAX_TEXT_CHARS:
        raise ParamError(f"text_input: longer than {MAX_TEXT_CHARS} characters", "text_input")
    return v


def _words(p: dict[str, Any], name: str) -> tuple[list[str], list[list[int]]]:
    """stop_words / bad_words: strings, token-id lists, or a mix."""
    v = F.get_list(p, name) or []
    strings = [w for w in v if isinstance(w, str)]
    ids = [w for w in v if isinstance(w, list)]
    if len(strings) + len(ids) != len(v) or any(s == "" for s in strings):
        raise ParamError(f"{name}: must be non-empty strings or arrays of token ids", name)
    if any(not w or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in w) for w in ids):
        raise ParamError(f"{name}: token-id words must be non-empty arrays of token ids", name)
    return strings, ids


def parse(body: dict[str, Any]) -> tuple[str | None, str, SamplingParams, dict[str, Any]]:
    """(id, text, params, options) from either body form."""
    rid = body.get("id")
    if rid is not None and (not isinstance(rid, str) or not _ID.match(rid)):
        raise ParamError("id: 1-256 characters of letters, digits, '_' or '-'", "id")
    text = _text_input(body)
    p = F.get_dict(body, "parameters")
    p = body if p is None else p
    temperature = F.get_float(p, "temperature", None, lo=0.0)
    do_sample = F.get_bool(p, "do_sample")
    if do_sample is False or (do_sample is None and temperature is None and not _samples(p)):
        temperature = 0.0
    stop, stop_ids = _words(p, "stop_words")
    bad, bad_ids = _words(p, "bad_words")
    max_new = F.get_int(p, "max_new_tokens", None, lo=1, hi=2**31 - 1)
    for alias in ("max_tokens", "request_output_len"):
        max_new = max_new if max_new is not None else F.get_int(p, alias, None, lo=1, hi=2**31 - 1)
    params = SamplingParams(
        max_tokens=max_new or 20,
        temperature=1.0 if temperature is None else temperature,
        top_k=F.get_int(p, "top_k", 0, lo=-1, hi=2**31 - 1),  # type: ignore[arg-type]
        top_p=F.get_float(p, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),  # type: ignore[arg-type]
        typical_p=F.get_float(p, "typical_p", 1.0, lo=0.0, hi=1.0, lo_open=True),  # type: ignore[arg-type]
        min_p=F.get_float(p, "min_p", 0.0, lo=0.0, hi=1.0),  # type: ignore[arg-type]
        repetition_penalty=F.get_float(p, "repetition_penalty", 1.0, lo=0.0, hi=2.0, lo_open=True),  # type: ignore[arg-type]
        presence_penalty=F.get_float(p, "presence_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        frequency_penalty=F.get_float(p, "frequency_penalty", 0.0, lo=-2.0, hi=2.0),  # type: ignore[arg-type]
        seed=F.get_int(p, "seed", None, lo=0, hi=_U64),
        watermark=bool(F.get_bool(p, "watermark", False)),
        stop=stop,
        stop_token_sequences=stop_ids or None,
        bad_words=bad or None,
        bad_words_ids=bad_ids or None,
        min_tokens=F.get_int(p, "min_length", 0, lo=0),  # type: ignore[arg-type]
        no_repeat_ngram_size=F.get_int(p, "no_repeat_ngram_size", 0, lo=0),  # type: ignore[arg-type]
        beam_width=F.get_int(p, "beam_width", 1, lo=1, hi=128),  # type: ignore[arg-type]
        length_penalty=F.get_float(p, "length_penalty", 1.0),  # type: ignore[arg-type]
        end_id=F.get_int(p, "end_id", None, lo=0),
        pad_id=F.get_int(p, "pad_id", None, lo=0),
        ignore_eos=bool(F.get_bool(p, "ignore_eos", False)),
        include_stop_str_in_output=bool(F.get_bool(p, "include_stop_str_in_output", False)),
        skip_special_tokens=bool(F.get_bool(p, "skip_special_tokens", True)),
        logprobs=0 if F.get_bool(p, "return_log_probs") or F.get_bool(p, "details") else None,
        return_context_logits=bool(F.get_bool(p, "return_context_logits", False)),
        return_generation_logits=bool(F.get_bool(p, "return_generation_logits", False)),
    )
    options = {
        "details": bool(F.get_bool(p, "details", False)),
        "priority": F.get_int(p, "priority", 5, lo=1, hi=5),
        "timeout": F.get_float(p, "timeout", None, lo=0.0, hi=3600.0, lo_open=True),
        "stream": bool(F.get_bool(body, "stream", False)),
        "draft_input_ids": F.get_int_list(p, "draft_input_ids"),
        # TensorRT-LLM LoRA: a cached task id, or the id with its weights + config (lora/registry.py)
        "lora": {k: v for k in ("lora_task_id", "lora_weights", "lora_config") if (v := _lora_field(p, k)) is not None},
    }
    return rid, text, params, options


def _lora_field(p: dict[str, Any], name: str) -> Any:
    if name == "lora_task_id":
        return F.get_int(p, name, None, lo=0, hi=_U64)
    v = F.get_list(p, name)  # [rows, values] or [1, rows, values]; checked against the model later
    if v is not None and not v:
        raise ParamError(f"{name}: must not be empty", name)
    return v


def _samples(p: dict[str, Any]) -> bool:
    return any(p.get(k) is not None for k in ("top_k", "top_p", "typical_p", "seed"))


def finish_reason(out: RequestOutput) -> str | None:
    c = out.outputs[0]
    if c.finish_reason == "stop":
        return "eos_token" if c.stop_reason is None else "stop_sequence"
    return c.finish_reason


def event(out: RequestOutput, model: str, full_text: bool, rid: str) -> dict[str, Any]:
    c, m = out.outputs[0], out.metrics
    n = len(c.token_ids)
    first = n == len(c.delta_token_ids)
    details: dict[str, Any] = {
        "generated_tokens": n, "first_token_cost": None, "decode_cost": None,
        "batch_size": m.batch_sizes[-1] if m.batch_sizes else 1,
        "queue_wait_time": round(m.queue_wait_us or 0) if first else 0,
    }  # fmt: skip
    if out.finished:
        details = {"finish_reason": finish_reason(out), **details}
    decode = m.decode_times_ms
    return {
        "id": rid, "model_name": model, "model_version": None,
        "text_output": c.text if full_text else c.delta_text, "details": details,
        "prefill_time": m.time_to_first_token_ms if first else None,
        "decode_time": (decode[-1] if decode else None) if not first else None,
    }  # fmt: skip


async def generate(
    engine: AsyncEngine, body: dict[str, Any], model: str, full_text: bool, stream: bool, lora_name: str | None = None
) -> Any:
    """`lora_name`: the LoRA adapter the URL's model names (None: the base model)."""
    rid, text, params, opts = parse(body)
    prompt: Any = text
    if opts["draft_input_ids"]:
        tok = engine.tokenizer
        ids = tok.encode(text) if tok is not None else []
        prompt = {"prompt": text, "prompt_token_ids": ids, "draft_input_ids": opts["draft_input_ids"]}
    if opts["lora"]:
        if lora_name is not None:
            raise ParamError(f"lora_task_id: the URL already selects adapter {lora_name!r}", "lora_task_id")
        prompt = (prompt if isinstance(prompt, dict) else {"prompt": text}) | opts["lora"]
    rid = rid or f"gen-{uuid.uuid4().hex}"
    request = engine.make_request(
        prompt, params, request_id=rid, priority=opts["priority"], timeout=opts["timeout"], lora_name=lora_name
    )
    outputs = engine.submit(request)
    if stream or opts["stream"]:
        return StreamingResponse(_events(outputs, model, full_text, rid), media_type="text/event-stream")
    final = None
    async for final in outputs:  # noqa: B007 (drain to the final output)
        pass
    assert final is not None
    body_out = event(final, model, True, rid)
    body_out["text_output"] = final.outputs[0].text
    if opts["details"]:
        body_out["details"]["tokens"] = _token_details(final)
    return body_out


def _token_details(out: RequestOutput) -> list[dict[str, Any]]:
    c = out.outputs[0]
    entries = c.logprobs or [{} for _ in c.token_ids]
    return [
        {"id": t, "text": (e[t].decoded_token if t in e else None), "logprob": (e[t].logprob if t in e else None)}
        for t, e in zip(c.token_ids, entries)
    ]


async def _events(outputs: AsyncIterator[RequestOutput], model: str, full_text: bool, rid: str) -> AsyncIterator[str]:
    try:
        async for out in outputs:
            c = out.outputs[0]
            if c.delta_text or c.delta_token_ids or out.finished:
                yield "data:" + json.dumps(event(out, model, full_text, rid), ensure_ascii=False) + "\n\n"
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
