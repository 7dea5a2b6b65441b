"""One chat-shaped generation, for the APIs that format it their own way (Responses, Messages).

`ChatRun.start` takes a chat-completions body (the API's own fields already translated), so every
control, LoRA by model name, priority and deadline reach the engine exactly as on
/v1/chat/completions; `pieces()` then yields what each engine output adds, already apart:
thinking, answer text, tool-call fragments (the reasoning split first, tool calls parsed from the
answer only), then the finish. Always one sequence (n = 1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from inflight.engine.client import EngineClient
from inflight.outputs import RequestOutput
from inflight.sampling_params import ParamError
from inflight.server.config import ServerConfig
from inflight.server.media_fields import MediaRef, load_media
from inflight.server.openai import protocol as proto
from inflight.server.openai.prompts import chat_prompt
from inflight.server.openai.reasoning_output import ChatReasoning, prompt_tail, set_thinking
from inflight.server.openai.serving import Runner
from inflight.server.openai.tool_fields import tool_parser, tool_request
from inflight.tools import ExtractedToolCalls, ToolDelta, ToolParser

# chat fields whose answer has no place in these APIs' responses (or that they name their own way)
NOT_CARRIED = ("echo", "stream_options", "prompt_logprobs", "return_token_ids", "return_tokens_as_token_ids", "logprobs",
               "top_logprobs", "best_of", "use_beam_search", "include_reasoning", "thinking_token_budget", "reasoning_effort")  # fmt: skip


@dataclass
class Piece:
    """What one engine output adds to the generation."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolDelta] = field(default_factory=list)  # fragments: the first of a call has id + name
    finish_reason: str | None = None  # the engine's: stop | length | abort | timeout
    stop_reason: int | str | None = None  # the stop string or token id that ended it


def _chars(messages: list[dict[str, Any]]) -> int:
    total = 0
    for m in messages:
        c = m.get("content")
        total += sum(len(p.get("text", "")) for p in c if isinstance(p, dict)) if isinstance(c, list) else len(str(c or ""))
    return total


class ChatRun:
    def __init__(self, req: proto.OpenAIRequest, runner: Runner, requests: list[Any], parser: ToolParser | None,
                 reasoning: ChatReasoning | None) -> None:  # fmt: skip
        self.req, self.runner, self.requests = req, runner, requests
        self.parser, self.reasoning = parser, reasoning
        self.request_id = requests[0].request_id
        self.num_prompt_tokens = len(requests[0].prompt_token_ids)
        self.final: RequestOutput | None = None
        self.extracted: ExtractedToolCalls | None = None  # the tool calls, once finished

    @classmethod
    async def start(cls, engine: EngineClient, body: dict[str, Any], cfg: ServerConfig, lora: str | None,
                    budget: int | None, prefix: str, final_only: bool = False) -> ChatRun:  # fmt: skip
        """Validate, build and queue (a 400 / 429 / 503 here, before any response starts).
        `final_only` (a response not streamed): the engine makes one output, when the request ends,
        and `pieces` yields one piece with the whole text (its delta is all of it)."""
        for name in NOT_CARRIED:
            if body.get(name) not in (None, False):
                raise ParamError(f"{name}: not available on this API", name)
        req = proto.common(body, chat=True)
        if req.params.num_sequences != 1 or req.params.is_beam_search:
            raise ParamError("n: one sequence per response on this API", "n")
        refs: list[MediaRef] | None = [] if engine.takes_images else None
        messages = proto.chat_messages(body, refs)
        tools = tool_request(body)
        parser = tool_parser(tools, req, cfg.tool_call_parser, engine.tokenizer, [])
        chars, limit = _chars(messages), engine.model_info.max_prompt_chars
        if chars > limit and req.truncate_prompt_tokens is None:  # refused before the template runs
            raise ParamError(f"messages: {chars} characters can't fit the input token limit (at most {limit})", "messages")
        media = await load_media(engine, refs, cfg.media) if refs else None
        think = cfg.reasoning
        if think is not None and think.special:
            req.params.skip_special_tokens = False
        runner, opened = Runner(engine, lora, cfg.max_queue), []

        def build() -> tuple[Any, list[Any]]:  # in the engine's input thread
            prompts = chat_prompt(engine, body, messages, tools.tools or None, req)
            if think is not None:
                opened.append(prompt_tail(engine.tokenizer, prompts.items[0]["prompt_token_ids"]))
                set_thinking(req.params, think, opened[0], budget)
            if media:
                prompts.items[0]["multi_modal_data"] = media
            return prompts, runner.build(prompts.items, req, prefix, final_only=final_only)

        _, requests = await engine.run_input(build, chars)
        await runner.prepare(requests)
        reasoning = ChatReasoning(think, opened[0]) if think is not None else None
        return cls(req, runner, requests, parser, reasoning)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Each engine output, split; closing this aborts the request."""
        calls = self.parser.streamer() if self.parser is not None else None
        stream = self.runner.merged(self.requests)
        try:
            async for _, out in stream:
                self.final = out
                c = out.outputs[0]
                done = c.finish_reason is not None
                piece = Piece(finish_reason=c.finish_reason, stop_reason=c.stop_reason)
                text = c.delta_text
                if self.reasoning is not None:
                    fields, text = self.reasoning.delta(0, c.delta_text, done)
                    piece.reasoning = fields.get("reasoning_content", "")
                if calls is None:
                    piece.content = text
                else:
                    deltas = calls.feed(text)
                    if done:
                        tail, self.extracted = calls.finish(c.finish_reason == "length")
                        deltas += tail
                    piece.content = "".join(d.content for d in deltas if d.content)
                    piece.calls = [d for d in deltas if d.index is not None]
                yield piece
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def usage(self) -> tuple[int, int, int, int]:
        """(prompt tokens, generated tokens, of them thinking, prompt tokens from the prefix cache)."""
        out = self.final
        if out is None:
            return self.num_prompt_tokens, 0, 0, 0
        generated = len(out.outputs[0].token_ids)
        thinking = self.reasoning.num_tokens([out]) if self.reasoning is not None else 0
        return len(out.prompt_token_ids), generated, thinking, out.num_cached_tokens
