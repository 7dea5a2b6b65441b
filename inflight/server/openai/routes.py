"""POST /v1/completions and /v1/chat/completions handlers.

Streams follow OpenAI: usage only when `stream_options.include_usage` is true (a last chunk with
`choices: []`), on every chunk too when `continuous_usage_stats` is also true (vLLM's rule, the
role chunk included). With `mindie_defaults` each choice's final chunk also carries `usage`, as
MindIE always sends it; with `perf_extras` the final chunk carries MindIE's performance figures.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import AsyncEngine, EngineDeadError, RequestFailedError
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError
from inflight.server.config import ServerConfig
from inflight.server.media_fields import MediaRef, load_media
from inflight.server.openai import protocol as proto
from inflight.server.openai.prompts import chat_prompt, completion_prompts
from inflight.server.openai.reasoning_output import ChatReasoning, prompt_tail
from inflight.server.openai.serving import (
    Runner,
    TokenNames,
    chat_logprobs,
    completion_logprobs,
    finish_fields,
    logprobs_chars,
    now,
    perf_fields,
    prompt_logprobs_json,
    sse,
    usage,
)
from inflight.server.openai.tool_fields import ToolRequest, tool_request
from inflight.server.openai.tool_output import tool_delta, tool_finish, tool_message
from inflight.tools import ToolParser, detect_parser, get_parser
from inflight.tools.constraint import tool_constraint

logger = logging.getLogger(__name__)


@dataclass
class Reply:
    """One response's shape, shared by its choices and the stream loop."""

    req: proto.OpenAIRequest
    rid: str
    model: str
    cfg: ServerConfig
    names: TokenNames
    warnings: list[str] = field(default_factory=list)
    num_prompt_tokens: int = 0  # chat: what the role chunk's usage reports
    reasoning: ChatReasoning | None = None  # chat with a reasoning parser
    created: int = field(default_factory=now)

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.rid, "object": kind, "created": self.created, "model": self.model}

    def usage(self, outs: list[RequestOutput], kind: str) -> dict[str, Any]:
        u = usage(outs, self.req.max_tokens_zero)
        if (
            self.cfg.perf_extras and kind == "text_completion" and outs
        ):  # MindIE: per-token arrays of the first prompt
            perf = perf_fields(outs[0])
            u |= {"batch_size": perf["batch_size"], "queue_wait_time": perf["queue_wait_time"]}
        if self.reasoning is not None:
            u["completion_tokens_details"] = {"reasoning_tokens": self.reasoning.num_tokens(outs)}
        return u


def _check_stream_best_of(req: proto.OpenAIRequest) -> None:
    p = req.params
    if req.stream and not p.use_beam_search and p.best_of is not None and p.best_of != p.n:
        raise ParamError(
            "best_of: must equal n when streaming (the best sequences are known only at the end)",
            "best_of",
        )


async def completions(
    engine: AsyncEngine, body: dict[str, Any], cfg: ServerConfig, lora: str | None = None
) -> Any:
    """`lora`: the LoRA adapter the body's `model` names (it is also the reported model)."""
    req = proto.common(body, chat=False, default_max_tokens=None if cfg.mindie_defaults else 16)
    _check_stream_best_of(req)
    echo = bool(proto.get_bool(body, "echo", False))
    if echo and req.params.logprobs is not None and req.params.prompt_logprobs is None:
        req.params.prompt_logprobs = req.params.logprobs  # echo + logprobs scores the prompt too
    runner = Runner(engine, lora, cfg.max_queue)
    raw = body.get("prompt")
    size = (
        len(raw)
        if isinstance(raw, str)
        else sum(len(p) for p in raw if isinstance(p, str))
        if isinstance(raw, list)
        else 0
    )

    def build() -> tuple[Any, list[Any]]:  # in the engine's input thread: tokenizing can be slow
        prompts = completion_prompts(engine, body, req)
        return prompts, runner.build(prompts.items, req, "cmpl")

    prompts, requests = await engine.run_input(build, size)
    await runner.prepare(requests)
    reply = Reply(req, requests[0].request_id.rsplit("-", 1)[0], lora or cfg.model_name, cfg,
                  TokenNames(engine.tokenizer, req.tokens_as_ids), prompts.warnings)  # fmt: skip
    n, zero = req.params.n, req.max_tokens_zero
    offsets: dict[tuple[int, int], int] = {}  # characters each choice has returned so far

    def choice(i: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any]:
        c = out.outputs[j]
        first = (i, c.index) not in offsets
        text = "" if zero else c.delta_text if stream else c.text
        tokens, entries = (
            ([], [])
            if zero
            else (c.delta_token_ids, c.delta_logprobs)
            if stream
            else (c.token_ids, c.logprobs)
        )
        offset = offsets.get((i, c.index), 0)
        if echo and first:
            text = _prompt_text(engine, out) + text
        lp = None
        if req.params.logprobs is not None:
            lp = completion_logprobs([], [], offset, reply.names)
            if echo and first and out.prompt_logprobs is not None:
                lp = completion_logprobs(
                    out.prompt_logprobs, out.prompt_token_ids, offset, reply.names
                )
            tail = completion_logprobs(
                list(entries or []), tokens, offset + logprobs_chars(lp), reply.names
            )
            lp = {k: lp[k] + tail[k] for k in lp}
        offsets[(i, c.index)] = offset + (logprobs_chars(lp) if lp is not None else len(text))
        reason = (
            {"finish_reason": "length" if c.finish_reason else None} if zero else finish_fields(c)
        )
        out_choice = {"index": i * n + c.index, "text": text, "logprobs": lp, **reason,
                      "stop_reason": None if zero else c.stop_reason}  # fmt: skip
        if req.params.prompt_logprobs is not None and first:
            out_choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        if req.return_token_ids:
            if first:
                out_choice["prompt_token_ids"] = out.prompt_token_ids
            out_choice["token_ids"] = list(tokens)
        return out_choice

    if req.stream:
        return _stream(runner.merged(requests), reply, "text_completion", choice)
    finals = await _collect(runner.merged(requests), len(requests))
    choices = [choice(i, o, j, False) for i, o in enumerate(finals) for j in range(len(o.outputs))]
    body_out = reply.head("text_completion") | {
        "choices": sorted(choices, key=lambda c: c["index"]),
        "usage": reply.usage(finals, "text_completion"),
    }
    return _with_warnings(body_out, reply)


def _prompt_text(engine: AsyncEngine, out: RequestOutput) -> str:
    if out.prompt is not None:
        return out.prompt
    tok = engine.tokenizer
    return str(tok.decode(out.prompt_token_ids)) if tok is not None else ""


def _with_warnings(body_out: dict[str, Any], reply: Reply) -> dict[str, Any]:
    if reply.warnings:
        body_out["warnings"] = reply.warnings
    return body_out


async def chat(
    engine: AsyncEngine, body: dict[str, Any], cfg: ServerConfig, lora: str | None = None
) -> Any:
    req = proto.common(body, chat=True)
    _check_stream_best_of(req)
    refs: list[MediaRef] | None = [] if engine.takes_images else None
    messages = proto.chat_messages(body, refs)
    tools = tool_request(body)
    tok = engine.tokenizer
    relaxed: list[str] = []  # what non-strict tool schemas lost from their constraint
    parser = _tool_parser(tools, req, cfg.tool_call_parser, tok, relaxed)
    echo = bool(
        proto.get_bool(body, "echo", False)
    )  # vLLM: the reply repeats the last message's content
    last = messages[-1].get("content")
    echo_text = _text(last) if echo and messages[-1].get("role") == "assistant" else ""
    chars, limit = (
        sum(len(_text(m.get("content"))) for m in messages),
        engine.model_info.max_prompt_chars,
    )
    if (
        chars > limit and req.truncate_prompt_tokens is None
    ):  # refused before the template and the tokenizer spend seconds on it
        raise ParamError(
            f"messages: {chars} characters can't fit the input token limit (at most {limit})",
            "messages",
        )
    runner = Runner(engine, lora, cfg.max_queue)
    media_data = await load_media(engine, refs, cfg.media) if refs else None  # in a worker thread
    if media_data and req.truncate_prompt_tokens is not None:
        raise ParamError(
            "truncate_prompt_tokens: not with image or video inputs", "truncate_prompt_tokens"
        )

    def build() -> tuple[
        Any, list[Any]
    ]:  # in the engine's input thread: templates and tokenizers can be slow
        prompts = chat_prompt(engine, body, messages, tools.tools or None, req)
        if media_data:
            prompts.items[0]["multi_modal_data"] = media_data
        return prompts, runner.build(prompts.items, req, "chatcmpl")

    think = cfg.reasoning
    include_reasoning = proto.get_bool(body, "include_reasoning", True)
    if think is not None and think.special:
        req.params.skip_special_tokens = False  # the tags must reach the splitter
    prompts, requests = await engine.run_input(build, chars)
    await runner.prepare(requests)
    reply = Reply(req, requests[0].request_id.rsplit("-", 1)[0], lora or cfg.model_name, cfg,
                  TokenNames(tok, req.tokens_as_ids), relaxed + prompts.warnings, len(requests[0].prompt_token_ids))  # fmt: skip
    if think is not None:
        opened = prompt_tail(tok, requests[0].prompt_token_ids)
        reply.reasoning = ChatReasoning(think, opened, bool(include_reasoning))
    for warning in relaxed:
        logger.info("%s: %s", reply.rid, warning)
    top_n = req.params.logprobs or 0
    full_text = cfg.full_text_enabled and parser is None
    streamers: dict[int, Any] = {}
    answers: dict[int, str] = {}  # fullTextEnabled: each choice's answer so far

    def choice(_: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any] | None:
        c = out.outputs[j]
        tokens, entries = (
            (c.delta_token_ids, c.delta_logprobs) if stream else (c.token_ids, c.logprobs)
        )
        lp = (
            chat_logprobs(list(entries), tokens, top_n, reply.names)
            if req.params.logprobs is not None and entries is not None
            else None
        )
        base: dict[str, Any] = {"index": c.index, "logprobs": lp, **finish_fields(c)}
        if req.return_token_ids:
            base["token_ids"] = list(tokens)
        thinking: dict[str, Any] = {}
        text: str | None = c.delta_text if stream else c.text
        if reply.reasoning is not None:  # thinking apart; tool calls are read from the answer
            if stream:
                thinking, text = reply.reasoning.delta(c.index, c.delta_text, bool(c.finish_reason))
            else:
                thinking, text = reply.reasoning.whole(c.text)
        quiet = not c.finish_reason and lp is None and not req.return_token_ids
        if parser is None:
            if stream:  # MindIE fullTextEnabled: each delta carries the whole text so far
                answers[c.index] = answers.get(c.index, "") + (text or "")
                if reply.reasoning is not None and not text and not thinking and quiet:
                    return None  # a tag or whitespace held back: nothing to say yet
                content = echo_text + answers[c.index] if full_text else text
                delta = thinking | ({"content": content} if reply.reasoning is None or content else {})
                return base | {"delta": delta}
            if reply.reasoning is not None and text is None:
                content = echo_text or None
            else:
                content = echo_text + (text or "")
            return base | {"message": {"role": "assistant", "content": content, "refusal": None} | thinking}
        if not stream:
            msg = tool_message(parser.extract(text or "", c.finish_reason == "length"), c)
            if echo_text:
                msg["message"]["content"] = echo_text + (msg["message"]["content"] or "")
            msg["message"] |= thinking
            return base | msg
        st = streamers.setdefault(c.index, parser.streamer())
        deltas = st.feed(text or "")
        extracted = None
        if c.finish_reason:
            tail, extracted = st.finish(c.finish_reason == "length")
            deltas += tail
        delta = thinking | tool_delta(deltas)
        if not delta and quiet:
            return None  # held back (maybe the start of a call): nothing to say yet
        out_choice = base | {"delta": delta}
        if extracted is not None:
            out_choice |= tool_finish(extracted, c)
        return out_choice

    def first_chunk(j: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": echo_text}
        return {"index": j, "delta": delta, "logprobs": None, "finish_reason": None}

    def final_extra(out: RequestOutput, j: int) -> dict[str, Any]:
        whole = answers.get(j, "") if reply.reasoning is not None else out.outputs[j].text
        return {"full_text": echo_text + whole} if full_text else {}

    if req.stream:
        return _stream(
            runner.merged(requests),
            reply,
            "chat.completion.chunk",
            choice,
            first_chunk,
            final_extra,
        )
    (final,) = await _collect(runner.merged(requests), 1)
    choices = [choice(0, final, j, False) for j in range(len(final.outputs))]
    body_out = reply.head("chat.completion") | {
        "choices": choices,
        "usage": reply.usage([final], "chat.completion"),
    }
    if req.params.prompt_logprobs is not None:
        body_out["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs)
    if req.return_token_ids:
        body_out["prompt_token_ids"] = final.prompt_token_ids
    if cfg.perf_extras:
        perf = perf_fields(final)
        body_out |= {
            "prefill_time": perf["prefill_time"],
            "decode_time_arr": perf["decode_time_arr"],
        }
    return _with_warnings(body_out, reply)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts beside image / video parts."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def _tool_parser(
    tools: ToolRequest,
    req: proto.OpenAIRequest,
    configured: str | None,
    tok: Any,
    relaxed: list[str],
) -> ToolParser | None:
    """The tool-call format when calls are to be parsed; the request gets the call grammar."""
    if not tools.active:
        return None
    name = configured or detect_parser(getattr(tok, "chat_template", None))
    if name is None:
        raise ParamError(
            "tools: this model's chat template shows no tool-call format (start the server with --tool-call-parser)",
            "tools",
        )
    if req.params.structured_outputs is not None:
        raise ParamError(
            'response_format: cannot be combined with tools unless tool_choice is "none"',
            "response_format",
        )
    if req.params.is_beam_search:
        raise ParamError("tools: not available with beam search", "tools")
    parser = get_parser(name)
    req.params.structured_outputs = tool_constraint(
        parser, tools.tools, tools.choice, tools.parallel, relaxed
    )
    if parser.name == "mistral":
        req.params.skip_special_tokens = False  # [TOOL_CALLS] is a special token
    return parser


async def _collect(
    stream: AsyncIterator[tuple[int, RequestOutput]], count: int
) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    try:
        async for i, out in stream:
            if out.finished:
                finals[i] = out
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # now, not at GC: a client that left aborts at once
    return [finals[i] for i in range(count)]


Choice = Callable[[int, RequestOutput, int, bool], "dict[str, Any] | None"]


def _stream(
    stream: AsyncIterator[tuple[int, RequestOutput]], reply: Reply, kind: str, choice: Choice,
    first_chunk: Callable[[int], dict[str, Any]] | None = None,
    final_extra: Callable[[RequestOutput, int], dict[str, Any]] | None = None,
) -> StreamingResponse:  # fmt: skip
    req, cfg = reply.req, reply.cfg
    opts = req.stream_options
    continuous = opts.include_usage and opts.continuous_usage_stats

    async def events() -> AsyncIterator[str]:
        head = reply.head(kind)
        latest: dict[int, RequestOutput] = {}
        extras: dict[str, Any] = {"warnings": reply.warnings} if reply.warnings else {}
        try:
            if first_chunk is not None:  # chat: the role chunk of every choice
                for j in range(req.params.n):
                    chunk = head | {"choices": [first_chunk(j)]} | extras
                    if continuous:
                        chunk["usage"] = {"prompt_tokens": reply.num_prompt_tokens, "completion_tokens": 0,
                                          "total_tokens": reply.num_prompt_tokens}  # fmt: skip
                    extras = {}
                    yield sse(chunk)
            ended: set[tuple[int, int]] = set()
            async for i, out in stream:
                latest[i] = out
                ready: list[tuple[dict[str, Any], int]] = []
                for j, c in enumerate(out.outputs):
                    if (i, c.index) in ended or not (
                        c.delta_text or c.delta_token_ids or c.finish_reason
                    ):
                        continue  # nothing new (a sibling moved), or this choice already finished
                    if c.finish_reason:
                        ended.add((i, c.index))
                    one = choice(i, out, j, True)
                    if one is not None:
                        ready.append((one, j))
                # beam search ends all its choices at once: one chunk carries them all (MindIE)
                groups = [ready] if req.params.is_beam_search and ready else [[r] for r in ready]
                for group in groups:
                    chunk = head | {"choices": [one for one, _ in group]} | extras
                    extras = {}
                    finals = [j for one, j in group if one.get("finish_reason")]
                    if finals:
                        if final_extra is not None:
                            chunk |= final_extra(out, finals[-1])
                        if cfg.perf_extras:
                            perf = perf_fields(out)
                            chunk |= {
                                "prefill_time": perf["prefill_time"],
                                "decode_time_arr": perf["decode_time_arr"],
                            }
                        if cfg.mindie_defaults:  # MindIE: usage always in the final chunk
                            chunk["usage"] = reply.usage(list(latest.values()), kind)
                    if continuous:
                        chunk["usage"] = reply.usage(list(latest.values()), kind)
                    yield sse(chunk)
            if opts.include_usage:
                yield sse(head | {"choices": [], "usage": reply.usage(list(latest.values()), kind)})
        except (
            RequestFailedError,
            EngineDeadError,
        ) as e:  # the engine failed it: say so, end cleanly
            yield sse(
                {"error": {"message": str(e), "type": "server_error", "param": None, "code": 500}}
            )
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
