"""The shape every OpenAI response shares (`Reply`), the non-streamed collector and the SSE stream.

Streams follow OpenAI: usage only when `stream_options.include_usage` is true (a last chunk with
`choices: []`), on every chunk too when `continuous_usage_stats` is also true (vLLM's rule, the
role chunk included). With `mindie_defaults` each choice's final chunk also carries `usage`, as
MindIE always sends it; with `perf_extras` the final chunk carries MindIE's performance figures.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

from inflight.engine.async_engine import EngineDeadError, RequestFailedError
from inflight.outputs import RequestOutput
from inflight.server.config import ServerConfig
from inflight.server.openai import protocol as proto
from inflight.server.openai.reasoning_output import ChatReasoning
from inflight.server.openai.serving import TokenNames, now, perf_fields, request_metrics, sse, usage

Choice = Callable[[int, RequestOutput, int, bool], "dict[str, Any] | None"]
Outputs = AsyncIterator[tuple[int, RequestOutput]]


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
        if self.cfg.perf_extras and kind == "text_completion" and outs:  # MindIE: per-token arrays of the first prompt
            perf = perf_fields(outs[0])
            u |= {"batch_size": perf["batch_size"], "queue_wait_time": perf["queue_wait_time"]}
        if self.cfg.perf_extras:  # speculative decoding, every prompt's sequences together
            u |= {k: sum(getattr(o.metrics, k) for o in outs) for k in ("num_draft_tokens", "num_accepted_draft_tokens")}
        if self.reasoning is not None:
            u["completion_tokens_details"] = {"reasoning_tokens": self.reasoning.num_tokens(outs)}
        return u

    def finish(self, body_out: dict[str, Any], outs: list[RequestOutput] | None = None) -> dict[str, Any]:
        """A non-streamed body with the request's warnings, if any, and its metrics when the
        server returns them."""
        if self.warnings:
            body_out["warnings"] = self.warnings
        return body_out | self.metrics(outs or [])

    def metrics(self, outs: list[RequestOutput]) -> dict[str, Any]:
        """vLLM's `metrics` object (--enable-per-request-metrics), for a response of one prompt."""
        if not self.cfg.per_request_metrics or len(outs) != 1:
            return {}
        return {"metrics": request_metrics(outs[0])}


async def collect(stream: Outputs, count: int) -> list[RequestOutput]:
    """The final output of each of `count` prompts."""
    finals: dict[int, RequestOutput] = {}
    try:
        async for i, out in stream:
            if out.finished:
                finals[i] = out
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # now, not at GC: a client that left aborts at once
    return [finals[i] for i in range(count)]


def stream_response(
    stream: Outputs, reply: Reply, kind: str, choice: Choice,
    first_chunk: Callable[[int], dict[str, Any]] | None = None,
    final_extra: Callable[[RequestOutput, int], dict[str, Any]] | None = None,
    ready: Callable[[], bool] = lambda: False,
) -> StreamingResponse:  # fmt: skip
    """SSE: `first_chunk` (chat's role chunks), one chunk per choice's news, usage, [DONE].
    `ready`: another output is at hand (`Runner.ready`): the chunks of outputs that arrived
    together go out in one write, not one each through the middleware stack and the socket (a
    reader that fell a step or more behind catches up in one write)."""
    chunks = _Chunks(reply, kind, final_extra)

    async def events() -> AsyncIterator[str]:
        held: list[str] = []
        try:
            if first_chunk is not None:  # chat: the role chunk of every choice
                for j in range(reply.req.params.n):
                    yield sse(chunks.role(first_chunk(j)))
            ended: set[tuple[int, int]] = set()
            async for i, out in stream:
                chunks.latest[i] = out
                held += [sse(chunk) for chunk in chunks.news(i, out, _ready(i, out, ended, choice))]
                if held and not ready():
                    yield "".join(held)
                    held = []
            if held:
                yield "".join(held)
                held = []
            if reply.req.stream_options.include_usage:  # with the metrics, as vLLM sends them
                yield sse(reply.head(kind) | {"choices": [], "usage": chunks.usage()} | reply.metrics(list(chunks.latest.values())))
        except (RequestFailedError, EngineDeadError) as e:  # the engine failed it: say so, end cleanly
            yield "".join(held) + sse({"error": {"message": str(e), "type": "server_error", "param": None, "code": 500}})
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _ready(i: int, out: RequestOutput, ended: set[tuple[int, int]], choice: Choice) -> list[tuple[dict[str, Any], int]]:
    """The choices of prompt `i` with something new to say, each with its output index."""
    ready: list[tuple[dict[str, Any], int]] = []
    for j, c in enumerate(out.outputs):
        if (i, c.index) in ended or not (c.delta_text or c.delta_token_ids or c.finish_reason):
            continue  # nothing new (a sibling moved), or this choice already finished
        if c.finish_reason:
            ended.add((i, c.index))
        one = choice(i, out, j, True)
        if one is not None:
            ready.append((one, j))
    return ready


class _Chunks:
    """Builds one stream's chunks: head, warnings on the first, usage and MindIE extras on finals."""

    def __init__(self, reply: Reply, kind: str, final_extra: Callable[[RequestOutput, int], dict[str, Any]] | None) -> None:
        self.reply, self.kind, self.final_extra = reply, kind, final_extra
        self.head = reply.head(kind)
        self.latest: dict[int, RequestOutput] = {}
        self.extras: dict[str, Any] = {"warnings": reply.warnings} if reply.warnings else {}
        opts = reply.req.stream_options
        self.continuous = opts.include_usage and opts.continuous_usage_stats

    def usage(self) -> dict[str, Any]:
        return self.reply.usage(list(self.latest.values()), self.kind)

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = self.head | {"choices": choices} | self.extras
        self.extras = {}  # warnings ride on the first chunk only
        return chunk

    def role(self, first: dict[str, Any]) -> dict[str, Any]:
        chunk = self._chunk([first])
        if self.continuous:
            n = self.reply.num_prompt_tokens
            chunk["usage"] = {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}
        return chunk

    def news(self, i: int, out: RequestOutput, ready: list[tuple[dict[str, Any], int]]) -> list[dict[str, Any]]:
        cfg = self.reply.cfg
        # beam search ends all its choices at once: one chunk carries them all (MindIE)
        groups = [ready] if self.reply.req.params.is_beam_search and ready else [[r] for r in ready]
        chunks = []
        for group in groups:
            chunk = self._chunk([one for one, _ in group])
            finals = [j for one, j in group if one.get("finish_reason")]
            if finals:
                if self.final_extra is not None:
                    chunk |= self.final_extra(out, finals[-1])
                if cfg.perf_extras:
                    perf = perf_fields(out)
                    chunk |= {"prefill_time": perf["prefill_time"], "decode_time_arr": perf["decode_time_arr"]}
                if cfg.mindie_defaults:  # MindIE: usage always in the final chunk
                    chunk["usage"] = self.usage()
            if self.continuous:
                chunk["usage"] = self.usage()
            chunks.append(chunk)
        return chunks
