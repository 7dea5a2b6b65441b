"""POST /v1/completions and /v1/chat/completions handlers: validate, build the engine requests,
then shape each choice (the stream and the collector are stream.py's)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from inflight.engine.client import EngineClient
from inflight.outputs import CompletionOutput, RequestOutput
from inflight.sampling_params import ParamError
from inflight.server.config import ServerConfig
from inflight.server.media_fields import MediaRef, load_media
from inflight.server.openai import protocol as proto
from inflight.server.openai.prompts import chat_prompt, completion_prompts
from inflight.server.openai.reasoning_output import (
    ChatReasoning,
    prompt_tail,
    set_thinking,
    thinking_budget,
)
from inflight.server.openai.serving import (
    Runner,
    TokenNames,
    chat_logprobs,
    completion_logprobs,
    finish_fields,
    logprobs_chars,
    perf_fields,
    prompt_logprobs_json,
)
from inflight.server.openai.stream import Reply, collect, stream_response
from inflight.server.openai.tool_fields import (
    ToolRequest,
    documented_limits,
    tool_parser,
    tool_request,
)
from inflight.server.openai.tool_output import named_cut_off, tool_delta, tool_finish, tool_message
from inflight.tools import ToolParser

logger = logging.getLogger(__name__)


def check_max_logprobs(req: proto.OpenAIRequest, cfg: ServerConfig, chat: bool) -> None:
    """vLLM's --max-logprobs (default 20): -1 (the whole vocabulary) is refused unless it is -1 too."""
    fields = (("top_logprobs" if chat else "logprobs", req.params.logprobs), ("prompt_logprobs", req.params.prompt_logprobs))
    for name, n in fields:
        if n is not None and cfg.max_logprobs != -1 and (n == -1 or n > cfg.max_logprobs):
            raise ParamError(f"{name}: {n} asks for more than --max-logprobs {cfg.max_logprobs} (-1: the whole vocabulary)", name)


def _check_stream_best_of(req: proto.OpenAIRequest) -> None:
    p = req.params
    if req.stream and not p.use_beam_search and p.best_of is not None and p.best_of != p.n:
        raise ParamError("best_of: must equal n when streaming (the best sequences are known only at the end)", "best_of")


async def completions(engine: EngineClient, body: dict[str, Any], cfg: ServerConfig, lora: str | None = None) -> Any:
    """`lora`: the LoRA adapter the body's `model` names (it is also the reported model)."""
    req = proto.common(body, chat=False, default_max_tokens=None if cfg.mindie_defaults else 16)
    _check_stream_best_of(req)
    check_max_logprobs(req, cfg, chat=False)
    echo = bool(proto.get_bool(body, "echo", False))
    if echo and req.params.logprobs is not None and req.params.prompt_logprobs is None:
        req.params.prompt_logprobs = req.params.logprobs  # echo + logprobs scores the prompt too
    runner = Runner(engine, lora, cfg.max_queue)
    raw = body.get("prompt")
    size = len(raw) if isinstance(raw, str) else sum(len(p) for p in raw if isinstance(p, str)) if isinstance(raw, list) else 0

    def build() -> tuple[Any, list[Any]]:  # in the engine's input thread: tokenizing can be slow
        prompts = completion_prompts(engine, body, req)
        return prompts, runner.build(prompts.items, req, "cmpl", final_only=not req.stream)

    prompts, requests = await engine.run_input(build, size)
    await runner.prepare(requests)
    reply = Reply(req, requests[0].request_id.rsplit("-", 1)[0], lora or cfg.model_name, cfg,
                  TokenNames(engine.tokenizer, req.tokens_as_ids), prompts.warnings)  # fmt: skip
    choice = _CompletionChoices(engine, reply, echo)
    if req.stream:
        return stream_response(runner.merged(requests), reply, "text_completion", choice, ready=runner.ready)
    finals = await collect(runner.merged(requests), len(requests))
    choices = [choice(i, o, j, False) for i, o in enumerate(finals) for j in range(len(o.outputs))]
    return reply.finish(reply.head("text_completion") | {
        "choices": sorted(choices, key=lambda c: c["index"]),
        "usage": reply.usage(finals, "text_completion"),
    }, finals)  # fmt: skip


class _CompletionChoices:
    """One completion choice (or its stream delta); echo prepends the prompt to a choice's first."""

    def __init__(self, engine: EngineClient, reply: Reply, echo: bool) -> None:
        self.engine, self.reply, self.req, self.echo = engine, reply, reply.req, echo
        self.offsets: dict[tuple[int, int], int] = {}  # characters each choice has returned so far

    def __call__(self, i: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any]:
        req, c, zero = self.req, out.outputs[j], self.req.max_tokens_zero
        first = (i, c.index) not in self.offsets
        text = "" if zero else c.delta_text if stream else c.text
        tokens, entries = ([], []) if zero else (c.delta_token_ids, c.delta_logprobs) if stream else (c.token_ids, c.logprobs)
        offset = self.offsets.get((i, c.index), 0)
        if self.echo and first:
            text = _prompt_text(self.engine, out) + text
        lp = self._logprobs(out, list(entries or []), tokens, offset, first) if req.params.logprobs is not None else None
        self.offsets[(i, c.index)] = offset + (logprobs_chars(lp) if lp is not None else len(text))
        reason = {"finish_reason": "length" if c.finish_reason else None} if zero else finish_fields(c)
        out_choice = {"index": i * req.params.n + c.index, "text": text, "logprobs": lp, **reason,
                      "stop_reason": None if zero else c.stop_reason}  # fmt: skip
        if first and not stream:  # vLLM's choices carry the key, null when not asked
            out_choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs) if req.params.prompt_logprobs is not None else None
        elif req.params.prompt_logprobs is not None and first:
            out_choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        if req.return_token_ids:
            if first:
                out_choice["prompt_token_ids"] = out.prompt_token_ids
            out_choice["token_ids"] = list(tokens)
        return out_choice

    def _logprobs(self, out: RequestOutput, entries: list[Any], tokens: list[int], offset: int, first: bool) -> dict[str, Any]:
        names = self.reply.names
        lp = completion_logprobs([], [], offset, names)
        if self.echo and first and out.prompt_logprobs is not None:
            lp = completion_logprobs(out.prompt_logprobs, out.prompt_token_ids, offset, names)
        tail = completion_logprobs(entries, tokens, offset + logprobs_chars(lp), names)
        return {k: lp[k] + tail[k] for k in lp}


def _prompt_text(engine: EngineClient, out: RequestOutput) -> str:
    if out.prompt is not None:
        return out.prompt
    tok = engine.tokenizer
    return str(tok.decode(out.prompt_token_ids)) if tok is not None else ""


@dataclass
class ChatTurn:
    """A chat request's inputs, validated (and its media loaded) before any template runs."""

    messages: list[dict[str, Any]]
    tools: ToolRequest
    parser: ToolParser | None  # None: no calls are parsed from the output
    relaxed: list[str]  # what non-strict tool schemas lost from their constraint
    echo_text: str  # vLLM's echo: the last (assistant) message's content, repeated in the reply
    chars: int
    media: Any


async def chat(engine: EngineClient, body: dict[str, Any], cfg: ServerConfig, lora: str | None = None) -> Any:
    req = proto.common(body, chat=True)
    _check_stream_best_of(req)
    check_max_logprobs(req, cfg, chat=True)
    turn = await _chat_turn(engine, body, cfg, req)
    runner = Runner(engine, lora, cfg.max_queue)

    think = cfg.reasoning
    include_reasoning = bool(proto.get_bool(body, "include_reasoning", True))
    budget = thinking_budget(body, think)
    opened: list[str] = []  # the prompt's tail: where the output begins (thinking or not)

    def build() -> tuple[Any, list[Any]]:  # in the engine's input thread: templates and tokenizers can be slow
        prompts = chat_prompt(engine, body, turn.messages, turn.tools.tools or None, req)
        if think is not None:
            opened.append(prompt_tail(engine.tokenizer, prompts.items[0]["prompt_token_ids"]))
            set_thinking(req.params, think, opened[0], budget)
        if turn.media:
            prompts.items[0]["multi_modal_data"] = turn.media
        return prompts, runner.build(prompts.items, req, "chatcmpl", final_only=not req.stream)

    if think is not None and think.special:
        req.params.skip_special_tokens = False  # the tags must reach the splitter
    prompts, requests = await engine.run_input(build, turn.chars)
    await runner.prepare(requests)
    reply = Reply(req, requests[0].request_id.rsplit("-", 1)[0], lora or cfg.model_name, cfg,
                  TokenNames(engine.tokenizer, req.tokens_as_ids), turn.relaxed + prompts.warnings,
                  len(requests[0].prompt_token_ids))  # fmt: skip
    if think is not None:
        reply.reasoning = ChatReasoning(think, opened[0], include_reasoning)
    for warning in turn.relaxed:
        logger.info("%s: %s", reply.rid, warning)
    choice = _ChatChoices(reply, turn.parser, turn.echo_text, cfg.full_text_enabled and turn.parser is None)
    if isinstance(turn.tools.choice, dict):
        choice.named = turn.tools.choice["function"]["name"]
    if req.stream:
        return stream_response(runner.merged(requests), reply, "chat.completion.chunk", choice,
                               choice.first_chunk, choice.final_extra, runner.ready)  # fmt: skip
    (final,) = await collect(runner.merged(requests), 1)
    return _chat_body(final, choice, reply)


async def _chat_turn(engine: EngineClient, body: dict[str, Any], cfg: ServerConfig, req: proto.OpenAIRequest) -> ChatTurn:
    refs: list[MediaRef] | None = [] if engine.takes_images else None
    messages = proto.chat_messages(body, refs)
    tools = tool_request(body)
    if cfg.mindie_defaults:
        documented_limits(body, tools)
    relaxed: list[str] = []
    parser = tool_parser(tools, req, cfg.tool_call_parser, engine.tokenizer, relaxed)
    echo = bool(proto.get_bool(body, "echo", False))
    last = messages[-1]
    echo_text = _text(last.get("content")) if echo and last.get("role") == "assistant" else ""
    chars, limit = sum(len(_text(m.get("content"))) for m in messages), engine.model_info.max_prompt_chars
    if chars > limit and req.truncate_prompt_tokens is None:  # refused before the template and the tokenizer spend seconds on it
        raise ParamError(f"messages: {chars} characters can't fit the input token limit (at most {limit})", "messages")
    media = await load_media(engine, refs, cfg.media) if refs else None  # in a worker thread
    if media and req.truncate_prompt_tokens is not None:
        raise ParamError("truncate_prompt_tokens: not with image or video inputs", "truncate_prompt_tokens")
    return ChatTurn(messages, tools, parser, relaxed, echo_text, chars, media)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts beside image / video parts."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


class _ChatChoices:
    """One chat choice (a message) or its stream delta: plain text, or tool calls parsed from it;
    with a reasoning parser the thinking goes apart first (calls are read from the answer only)."""

    def __init__(self, reply: Reply, parser: ToolParser | None, echo_text: str, full_text: bool) -> None:
        self.reply, self.req, self.parser, self.echo_text = reply, reply.req, parser, echo_text
        self.full_text = full_text  # MindIE fullTextEnabled: each delta carries the whole text so far
        self.streamers: dict[int, Any] = {}
        self.answers: dict[int, str] = {}  # fullTextEnabled: each choice's answer so far
        self.named: str | None = None  # a named tool_choice: its function (a cut-off call still names it)
        self.raw: dict[int, str] = {}  # named: each streamed choice's text so far
        self.called: set[int] = set()  # named: choices that streamed a call

    def __call__(self, _: int, out: RequestOutput, j: int, stream: bool) -> dict[str, Any] | None:
        req, c, reasoning = self.req, out.outputs[j], self.reply.reasoning
        tokens, entries = (c.delta_token_ids, c.delta_logprobs) if stream else (c.token_ids, c.logprobs)
        lp = None
        if req.params.logprobs is not None and entries is not None:
            # logprob_token_ids: every entry (the chosen token and the asked ids), as vLLM returns them
            top_n = -1 if req.params.logprob_token_ids else req.params.logprobs or 0
            lp = chat_logprobs(list(entries), tokens, top_n, self.reply.names)
        base: dict[str, Any] = {"index": c.index, "logprobs": lp, **finish_fields(c)}
        if req.return_token_ids:
            base["token_ids"] = list(tokens)
        thinking: dict[str, Any] = {}
        text: str | None = c.delta_text if stream else c.text
        if reasoning is not None:  # thinking apart; tool calls are read from the answer
            if stream:
                thinking, text = reasoning.delta(c.index, c.delta_text, bool(c.finish_reason))
            else:
                thinking, text = reasoning.whole(c.text)
        quiet = not c.finish_reason and lp is None and not req.return_token_ids
        if self.parser is None:
            return self._text(c, base, thinking, text, stream, quiet)
        if not stream:
            extracted = self.parser.extract(text or "", c.finish_reason == "length")
            if self.named and c.finish_reason == "length" and not extracted.calls and not extracted.error:
                extracted = named_cut_off(self.named, text or "")
            msg = tool_message(extracted, c)
            if self.echo_text:
                msg["message"]["content"] = self.echo_text + (msg["message"]["content"] or "")
            msg["message"] |= thinking
            return base | msg
        return self._tool_delta(c, base, thinking, text or "", quiet)

    def _text(self, c: CompletionOutput, base: dict[str, Any], thinking: dict[str, Any], text: str | None,
              stream: bool, quiet: bool) -> dict[str, Any] | None:  # fmt: skip
        reasoning = self.reply.reasoning
        if stream:
            self.answers[c.index] = self.answers.get(c.index, "") + (text or "")
            if reasoning is not None and not text and not thinking and quiet:
                return None  # a tag or whitespace held back: nothing to say yet
            content = self.echo_text + self.answers[c.index] if self.full_text else text
            return base | {"delta": thinking | ({"content": content} if reasoning is None or content else {})}
        content = (self.echo_text or None) if reasoning is not None and text is None else self.echo_text + (text or "")
        return base | {"message": {"role": "assistant", "content": content, "refusal": None} | thinking}

    def _tool_delta(self, c: CompletionOutput, base: dict[str, Any], thinking: dict[str, Any], text: str,
                    quiet: bool) -> dict[str, Any] | None:  # fmt: skip
        assert self.parser is not None
        st = self.streamers.setdefault(c.index, self.parser.streamer())
        deltas = st.feed(text)
        extracted = None
        if c.finish_reason:
            tail, extracted = st.finish(c.finish_reason == "length")
            deltas += tail
        delta = thinking | tool_delta(deltas)
        if self.named:
            self.raw[c.index] = self.raw.get(c.index, "") + text
            self.called.update([c.index] if "tool_calls" in delta else [])
            if c.finish_reason == "length" and c.index not in self.called and extracted is not None and not extracted.error:
                delta["tool_calls"] = tool_message(named_cut_off(self.named, self.raw[c.index]), c)["message"]["tool_calls"]
                delta["tool_calls"][0]["index"] = 0
        if not delta and quiet:
            return None  # held back (maybe the start of a call): nothing to say yet
        out_choice = base | {"delta": delta}
        if extracted is not None:
            out_choice |= tool_finish(extracted, c)
        return out_choice

    def first_chunk(self, j: int) -> dict[str, Any]:
        return {"index": j, "delta": {"role": "assistant", "content": self.echo_text}, "logprobs": None, "finish_reason": None}

    def final_extra(self, out: RequestOutput, j: int) -> dict[str, Any]:
        whole = self.answers.get(j, "") if self.reply.reasoning is not None else out.outputs[j].text
        return {"full_text": self.echo_text + whole} if self.full_text else {}


def _chat_body(final: RequestOutput, choice: _ChatChoices, reply: Reply) -> dict[str, Any]:
    req, cfg = reply.req, reply.cfg
    body_out = reply.head("chat.completion") | {
        "choices": [choice(0, final, j, False) for j in range(len(final.outputs))],
        "usage": reply.usage([final], "chat.completion"),
    }
    # vLLM's chat body carries the key, null when not asked
    body_out["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs) if req.params.prompt_logprobs is not None else None
    if req.return_token_ids:
        body_out["prompt_token_ids"] = final.prompt_token_ids
    if cfg.perf_extras:
        perf = perf_fields(final)
        body_out |= {"prefill_time": perf["prefill_time"], "decode_time_arr": perf["decode_time_arr"]}
    return reply.finish(body_out, [final])
