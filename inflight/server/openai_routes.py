"""POST /v1/completions and /v1/chat/completions handlers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from inflight.engine.tokenizer import apply_chat_template, encode_text
from inflight.multimodal.media import MediaOptions
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError
from inflight.server import openai_protocol as proto
from inflight.server.media_fields import MediaRef, load_media
from inflight.server.openai_serving import (
    Runner,
    chat_logprobs,
    completion_logprobs,
    finish_fields,
    now,
    perf_fields,
    prompt_logprobs_json,
    sse,
    usage,
)
from inflight.server.tool_fields import ToolRequest, tool_request
from inflight.server.tool_output import tool_delta, tool_finish, tool_message
from inflight.tools import ToolParser, detect_parser, get_parser
from inflight.tools.constraint import tool_constraint


async def completions(
    engine: AsyncEngine, body: dict[str, Any], model: str, extras: bool = False, lora: str | None = None, queue_limit: int | None = None
) -> Any:
    req = proto.common(body, chat=False)
    prompts = proto.completion_prompts(body)
    echo = bool(proto.get_bool(body, "echo", False))
    if proto.get_str(body, "suffix"):
        raise ParamError("suffix: not supported by this model", "suffix")
    if echo and req.params.logprobs is not None:
        req.params.prompt_logprobs = req.params.logprobs  # echo + logprobs scores the prompt too
    runner = Runner(engine, lora, queue_limit)
    size = sum(len(p) for p in prompts if isinstance(p, str))
    requests = await engine.run_input(lambda: runner.build(prompts, req, "cmpl"), size)
    await runner.prepare(requests)
    n, created, rid = req.params.n, now(), requests[0].request_id.rsplit("-", 1)[0]

    def choice(i: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any]:
        c = out.outputs[j]
        text = c.delta_text if stream else c.text
        tokens, entries = (c.delta_token_ids, c.delta_logprobs) if stream else (c.token_ids, c.logprobs)
        lp = None
        if req.params.logprobs is not None and entries is not None:
            lp = completion_logprobs(list(entries), 0, tokens)
        first = not stream or (c.delta_token_ids and len(c.token_ids) == len(c.delta_token_ids))
        if echo and first:
            text = (out.prompt or "") + text
            if lp is not None and out.prompt_logprobs is not None:
                head = completion_logprobs(out.prompt_logprobs, 0, out.prompt_token_ids)
                lp = {k: head[k] + lp[k] for k in lp}
        out_choice = {"index": i * n + c.index, "text": text, "logprobs": lp, **finish_fields(c)}
        if req.params.prompt_logprobs is not None and (not stream or first):
            out_choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return out_choice

    if req.stream:
        return _stream(runner.merged(requests), req, rid, created, model, "text_completion", choice)
    finals = await _collect(runner.merged(requests), len(requests))
    choices = [choice(i, o, j, False) for i, o in enumerate(finals) for j in range(len(o.outputs))]
    body_out = {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": sorted(choices, key=lambda c: c["index"]), "usage": usage(finals)}  # fmt: skip
    if extras:  # MindIE: per-token batch sizes and queue waits of the first prompt, in usage
        perf = perf_fields(finals[0])
        body_out["usage"] |= {"batch_size": perf["batch_size"], "queue_wait_time": perf["queue_wait_time"]}
    return body_out


async def chat(
    engine: AsyncEngine,
    body: dict[str, Any],
    model: str,
    extras: bool = False,
    tool_parser: str | None = None,
    lora: str | None = None,
    queue_limit: int | None = None,
    media: MediaOptions = MediaOptions(),  # noqa: B008 (frozen)
) -> Any:
    req = proto.common(body, chat=True)
    refs: list[MediaRef] | None = [] if engine.takes_images else None
    messages = proto.chat_messages(body, refs)
    tools = tool_request(body)
    tok = engine.tokenizer
    parser = _tool_parser(tools, req, tool_parser, tok)
    chars, limit = sum(_text_len(m.get("content")) for m in messages), engine.model_info.max_prompt_chars
    if chars > limit:  # refused before the template and the tokenizer spend seconds on it
        raise ParamError(f"messages: {chars} characters can't fit the input token limit (at most {limit})", "messages")
    runner = Runner(engine, lora, queue_limit)
    media_data = await load_media(engine, refs, media) if refs else None  # in a worker thread

    def build() -> list[Any]:  # in the engine's input thread: templates and tokenizers can be slow
        text = apply_chat_template(tok, messages, add_generation_prompt=True, tools=tools.tools or None)
        prompt: dict[str, Any] = {"prompt": text, "prompt_token_ids": encode_text(tok, text, "messages")}
        if media_data:
            prompt["multi_modal_data"] = media_data
        return runner.build([prompt], req, "chatcmpl")

    requests = await engine.run_input(build, chars)
    await runner.prepare(requests)
    created, rid, top_n = now(), requests[0].request_id.rsplit("-", 1)[0], req.params.logprobs or 0
    streamers: dict[int, Any] = {}

    def choice(_: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any] | None:
        c = out.outputs[j]
        tokens, entries = (c.delta_token_ids, c.delta_logprobs) if stream else (c.token_ids, c.logprobs)
        lp = chat_logprobs(list(entries), tokens, top_n) if req.params.logprobs is not None and entries is not None else None
        base = {"index": c.index, "logprobs": lp, **finish_fields(c)}
        if parser is None:
            if stream:
                return base | {"delta": {"content": c.delta_text}}
            return base | {"message": {"role": "assistant", "content": c.text, "refusal": None}}
        if not stream:
            return base | tool_message(parser.extract(c.text), c)
        st = streamers.setdefault(c.index, parser.streamer())
        deltas = st.feed(c.delta_text)
        extracted = None
        if c.finish_reason:
            tail, extracted = st.finish()
            deltas += tail
        delta = tool_delta(deltas)
        if not delta and not c.finish_reason and lp is None:
            return None  # held back (maybe the start of a call): nothing to say yet
        out_choice = base | {"delta": delta}
        if extracted is not None:
            out_choice |= tool_finish(extracted, c)
        return out_choice

    if req.stream:
        return _stream(runner.merged(requests), req, rid, created, model, "chat.completion.chunk", choice, role=True)
    (final,) = await _collect(runner.merged(requests), 1)
    choices = [choice(0, final, j, False) for j in range(len(final.outputs))]
    body_out = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": choices, "usage": usage([final])}  # fmt: skip
    if req.params.prompt_logprobs is not None:
        body_out["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs)
    if extras:
        perf = perf_fields(final)
        body_out |= {"prefill_time": perf["prefill_time"], "decode_time_arr": perf["decode_time_arr"]}
    return body_out


def _text_len(content: Any) -> int:
    """Characters of a message's text (a string, or text parts beside image / video parts)."""
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return len(content or "")


def _tool_parser(tools: ToolRequest, req: proto.OpenAIRequest, configured: str | None, tok: Any) -> ToolParser | None:
    """The tool-call format when calls are to be parsed; the request gets the call grammar."""
    if not tools.active:
        return None
    name = configured or detect_parser(getattr(tok, "chat_template", None))
    if name is None:
        raise ParamError("tools: this model's chat template shows no tool-call format (start the server with --tool-call-parser)", "tools")
    if req.params.structured_outputs is not None:
        raise ParamError('response_format: cannot be combined with tools unless tool_choice is "none"', "response_format")
    if req.params.is_beam_search:
        raise ParamError("tools: not available with beam search", "tools")
    parser = get_parser(name)
    req.params.structured_outputs = tool_constraint(parser, tools.tools, tools.choice, tools.parallel)
    if parser.name == "mistral":
        req.params.skip_special_tokens = False  # [TOOL_CALLS] is a special token
    return parser


async def _collect(stream: AsyncIterator[tuple[int, RequestOutput]], count: int) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    try:
        async for i, out in stream:
            if out.finished:
                finals[i] = out
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # now, not at GC: a client that left aborts at once
    return [finals[i] for i in range(count)]


def _stream(stream, req, rid, created, model, kind, choice, role: bool = False) -> StreamingResponse:  # type: ignore[no-untyped-def]
    async def events() -> AsyncIterator[str]:
        head = {"id": rid, "object": kind, "created": created, "model": model}
        latest: dict[int, RequestOutput] = {}
        n = req.params.n
        if role:
            for j in range(n):
                yield sse(head | {"choices": [{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
        try:
            ended: set[tuple[int, int]] = set()
            async for i, out in stream:
                latest[i] = out
                for j, c in enumerate(out.outputs):
                    if (i, c.index) in ended or not (c.delta_text or c.delta_token_ids or c.finish_reason):
                        continue  # nothing new (a sibling moved), or this choice already finished
                    if c.finish_reason:
                        ended.add((i, c.index))
                    one = choice(i, out, j, True)
                    if one is None:
                        continue
                    chunk = head | {"choices": [one]}
                    if c.finish_reason:  # the final chunk of a choice always carries the MindIE figures
                        chunk |= perf_fields(out)
                    if req.stream_options.continuous_usage_stats:
                        chunk["usage"] = usage(list(latest.values()))
                    yield sse(chunk)
            if req.stream_options.include_usage:
                yield sse(head | {"choices": [], "usage": usage(list(latest.values()))})
        except (
            RequestFailedError,
            EngineDeadError,
        ) as e:  # the engine failed it: say so, end cleanly
            yield sse(
                {"error": {"message": str(e), "type": "server_error", "param": None, "code": 500}}
            )
        finally:
            await stream.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
