"""POST /v2/models/{model}/generate and /generate_stream (MindIE / Triton / TensorRT-LLM style).

Bodies are read by protocol.py. Events are compact JSON (`,` / `:` separators), one per new text
piece, framed per request (`sse_prefix`): a MindIE body's as MindIE sends them, `data:{json}`; a body with
a Triton / TensorRT-LLM name Triton's, `data: {json}` (genai-perf splits the stream on `data: `);
`--v2-stream-dialect mindie | triton` forces one; the last adds details.finish_reason: eos_token | stop_sequence |
length | timeout | abort. A request that used a Triton / TensorRT-LLM name also gets Triton's output
tensors: `output_ids` and `sequence_length` (per event: the new tokens), `cum_log_probs` and
`output_log_probs` with `return_log_probs`, `context_logits` / `generation_logits` (nested lists,
in the last event) when asked. With `beam_width` > 1 every beam comes back: `text_output`,
`output_ids`, `sequence_length`, `cum_log_probs` and `output_log_probs` have one entry per beam.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import EngineDeadError, RequestFailedError
from inflight.engine.client import EngineClient
from inflight.multimodal.media import MediaOptions
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError
from inflight.server.generate.protocol import GenerateRequest, parse
from inflight.server.media_fields import load_media, text_input_media


def finish_reason(out: RequestOutput) -> str | None:
    c = out.outputs[0]
    if c.finish_reason == "stop":
        return "eos_token" if c.stop_reason is None else "stop_sequence"
    return c.finish_reason


def _token_wait(m: Any, n: int) -> int:
    waits = m.queue_wait_times_us
    return round(waits[min(n, len(waits)) - 1]) if waits and n else 0


def perf_stat(out: RequestOutput) -> dict[str, Any]:
    """MindIE `perf_stat: true`: the whole request's per-token figures, in the final response / event."""
    m = out.metrics
    return {
        "prefill_time": m.time_to_first_token_ms, "decode_time_arr": [round(d, 3) for d in m.decode_times_ms],
        "batch_size": list(m.batch_sizes), "queue_wait_time": [round(w) for w in m.queue_wait_times_us],
        "num_draft_tokens": m.num_draft_tokens, "num_accepted_draft_tokens": m.num_accepted_draft_tokens,
    }  # fmt: skip


def event(out: RequestOutput, model: str, full_text: bool, rid: str, first: bool | None = None) -> dict[str, Any]:
    """One response body / event. `first`: whether `out` holds the first tokens the request made
    (prefill_time is set, decode_time not); default: all of its tokens are new in it."""
    c, m = out.outputs[0], out.metrics
    n = len(c.token_ids)
    first = n == len(c.delta_token_ids) if first is None else first
    details: dict[str, Any] = {
        "generated_tokens": n, "first_token_cost": None, "decode_cost": None,
        "batch_size": m.batch_sizes[-1] if m.batch_sizes else 1,
        # this token's wait to be scheduled (the first: since arrival), as MindIE reports it per event
        "queue_wait_time": _token_wait(m, n),
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
    engine: EngineClient,
    body: dict[str, Any],
    model: str,
    full_text: bool,
    stream: bool,
    lora_name: str | None = None,
    queue_limit: int | None = None,
    media: MediaOptions = MediaOptions(),  # noqa: B008 (frozen)
    dialect: str = "auto",
) -> Any:
    """`lora_name`: the LoRA adapter the URL's model names (None: the base model)."""
    text_input = body.get("text_input")
    size = len(text_input) if isinstance(text_input, str) else 0
    # MindIE's image parts: fetched, decoded and preprocessed in a worker thread first
    media_data = await load_media(engine, text_input_media(body, engine.takes_images), media)
    req, request = await engine.run_input(lambda: _build(engine, body, media_data, lora_name, stream), size)
    rid = request.request_id
    try:
        outputs = engine.submit(request, queue_limit=queue_limit)  # a duplicate id: 400 before any stream starts
    except ParamError as e:
        if e.param != "request_id":
            raise
        raise ParamError(f"id: {rid!r} is in use by a request still running", "id") from e
    if stream or req.stream:
        prefix = sse_prefix(dialect, req.triton)
        return StreamingResponse(_events(outputs, model, full_text, rid, req, prefix), media_type="text/event-stream")
    final = None
    try:
        async for final in outputs:  # noqa: B007 (drain to the final output)
            pass
    finally:
        await outputs.aclose()  # a client that left (until_disconnected cancels us) aborts it now
    assert final is not None
    return _whole(final, model, rid, req)


def _build(engine: EngineClient, body: dict[str, Any], media_data: Any, lora_name: str | None, stream: bool) -> tuple[GenerateRequest, Any]:
    """The validated body and its engine request (in the engine's input thread: tokenizing can take a
    while). Not streamed: a final-only request (the engine makes one output, when it finishes)."""
    req = parse(body, engine.tokenizer, engine.model_info.vocab_size, [] if engine.takes_images else None)
    prompt = req.prompt
    if media_data:
        prompt = (prompt if isinstance(prompt, dict) else {"prompt": prompt}) | {"multi_modal_data": media_data}
    if req.lora:
        if lora_name is not None:
            raise ParamError(f"lora_task_id: the URL already selects adapter {lora_name!r}", "lora_task_id")
        prompt = (prompt if isinstance(prompt, dict) else {"prompt": prompt}) | req.lora
    rid = req.request_id or f"gen-{uuid.uuid4().hex}"
    try:
        return req, engine.make_request(
            prompt, req.params, request_id=rid, priority=req.priority, timeout=req.timeout, lora_name=lora_name,
            final_only=not (stream or req.stream), cumulative_logprob=False,  # cum_log_probs only with return_log_probs, which asks for logprobs
        )
    except ParamError as e:  # the engine names the prompt as the Python API calls it
        if e.param != "prompt":
            raise
        field = "input_ids" if "input_ids" in body or "input_ids" in (body.get("parameters") or {}) else "text_input"
        raise ParamError(field + str(e)[len("prompt") :] if str(e).startswith("prompt") else str(e), field) from e


def _whole(final: RequestOutput, model: str, rid: str, req: GenerateRequest) -> dict[str, Any]:
    """The non-streamed body: the last event with the whole text (and details, perf, Triton outputs)."""
    # the streamed path's last event: "first" only when every token came in the first output (one
    # step: its tokens share one time), which a final-only request's single output cannot say itself
    body_out = event(final, model, True, rid, first=len(set(final.metrics.token_times)) <= 1)
    body_out["text_output"] = final.outputs[0].text
    if req.details:
        body_out["details"]["tokens"] = _token_details(final)
    if req.extra.get("perf_stat"):
        body_out["perf_stat"] = perf_stat(final)
    if req.triton:
        body_out |= triton_outputs(final, req, whole=True)
    return body_out


def triton_outputs(out: RequestOutput, req: GenerateRequest, whole: bool) -> dict[str, Any]:
    """TensorRT-LLM's output tensors as JSON: the whole output (`whole`) or what is new in this event.
    One beam: scalars and flat lists; beam_width > 1: one entry per beam."""
    if req.beam_width > 1:
        return _beam_outputs(out, req)
    c = out.outputs[0]
    ids = c.token_ids if whole else c.delta_token_ids
    res: dict[str, Any] = {"output_ids": list(ids), "sequence_length": len(ids)}
    if req.extra.get("return_log_probs"):
        entries = (c.logprobs if whole else c.delta_logprobs) or []
        res["cum_log_probs"] = c.cumulative_logprob
        res["output_log_probs"] = [e[t].logprob for t, e in zip(ids, entries)]
    if out.finished:
        res |= _logits(out)
    return res


def _beam_outputs(out: RequestOutput, req: GenerateRequest) -> dict[str, Any]:
    """All beams, best first; `pad_id` pads their output_ids to one length (sequence_length keeps
    the real ones), as TensorRT-LLM's [beam_width, num_output_tokens] tensor is padded."""
    if not out.finished:
        return {}
    beams = out.outputs
    width = max(len(c.token_ids) for c in beams)
    pad = [] if req.pad_id is None else [req.pad_id]
    res: dict[str, Any] = {
        "text_output": [c.text for c in beams],
        "output_ids": [list(c.token_ids) + pad * (width - len(c.token_ids)) for c in beams],
        "sequence_length": [len(c.token_ids) for c in beams],
    }
    if req.extra.get("return_log_probs"):
        res["cum_log_probs"] = [c.cumulative_logprob for c in beams]
        res["output_log_probs"] = [[e[t].logprob for t, e in zip(c.token_ids, c.logprobs or [])] for c in beams]
    if any(c.generation_logits is not None for c in beams):  # [beam][new_tokens][vocab]
        res["generation_logits"] = [c.generation_logits.tolist() if c.generation_logits is not None else [] for c in beams]
    return res | {k: v for k, v in _logits(out).items() if k != "generation_logits"}


def _logits(out: RequestOutput) -> dict[str, Any]:
    res = {}
    if out.context_logits is not None:
        res["context_logits"] = out.context_logits.tolist()  # (prompt_len, vocab)
    gen = out.outputs[0].generation_logits
    if gen is not None:
        res["generation_logits"] = gen.tolist()  # (generated, vocab)
    return res


def _token_details(out: RequestOutput) -> list[dict[str, Any]]:
    c = out.outputs[0]
    entries = c.logprobs or [{} for _ in c.token_ids]
    return [
        {"id": t, "text": (e[t].decoded_token if t in e else None), "logprob": (e[t].logprob if t in e else None)}
        for t, e in zip(c.token_ids, entries)
    ]


def sse_prefix(dialect: str, triton: bool) -> str:
    """Triton's server writes `data: ` before each event, MindIE `data:` (its samples, byte for byte)."""
    return "data: " if dialect == "triton" or (dialect == "auto" and triton) else "data:"


def _sse(prefix: str, event: dict[str, Any]) -> str:
    return prefix + json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def _events(
    outputs: AsyncIterator[RequestOutput], model: str, full_text: bool, rid: str, req: GenerateRequest, prefix: str
) -> AsyncIterator[str]:
    try:
        async for out in outputs:
            c = out.outputs[0]
            if c.delta_text or c.delta_token_ids or out.finished:
                e = event(out, model, full_text, rid)
                if out.finished and req.extra.get("perf_stat"):
                    e["perf_stat"] = perf_stat(out)
                if req.triton:
                    e |= triton_outputs(out, req, whole=False)
                yield _sse(prefix, e)
    except (RequestFailedError, EngineDeadError) as e:  # the engine failed it: a last event says why
        yield _sse(prefix, {"id": rid, "error": str(e)})
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
