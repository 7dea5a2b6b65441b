"""OpenAI completions and chat: engine outputs -> response objects and SSE chunks.

Every engine request is built (tokenized, validated) before any is submitted, so a bad
prompt in a batch is a 400 with nothing left running. Choice indices follow OpenAI:
prompt i, sequence j -> index i * n + j.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from inflight.engine.async_engine import AsyncEngine, EngineRequest, RequestStream
from inflight.outputs import CompletionOutput, Logprob, RequestOutput
from inflight.server.openai_protocol import OpenAIRequest

# OpenAI's finish_reason has no value for a request ended early (its timeout passed, or it was
# aborted: shutdown drain, client gone). Such a choice reports "length" (its output was cut short,
# as by max_tokens) and says why in `finish_detail`.
_ENDED_EARLY = ("timeout", "abort")


def finish_reason(c: CompletionOutput) -> str | None:
    return "length" if c.finish_reason in _ENDED_EARLY else c.finish_reason


def finish_fields(c: CompletionOutput) -> dict[str, Any]:
    """`finish_reason` in OpenAI's values, plus `finish_detail` ("timeout" | "abort") when mapped."""
    if c.finish_reason in _ENDED_EARLY:
        return {"finish_reason": "length", "finish_detail": c.finish_reason}
    return {"finish_reason": c.finish_reason}


def usage(outs: list[RequestOutput]) -> dict[str, int]:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def prompt_logprobs_json(entries: list[dict[int, Logprob] | None] | None) -> list[Any] | None:
    """vLLM's shape: [null, {token_id: {logprob, rank, decoded_token}}, ...]."""
    if entries is None:
        return None
    return [
        None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in e.items()}
        for e in entries
    ]


def perf_fields(out: RequestOutput) -> dict[str, Any]:
    """MindIE per-request performance figures (ms / us), from the engine's request metrics."""
    m = out.metrics
    return {
        "prefill_time": round(m.time_to_first_token_ms or 0.0, 3),
        "decode_time_arr": [round(d, 3) for d in m.decode_times_ms],
        "batch_size": list(m.batch_sizes),
        "queue_wait_time": [round(w) for w in m.queue_wait_times_us],
    }


def _token_text(lp: Logprob, tid: int) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{tid}"


def completion_logprobs(entries: list[dict[int, Logprob] | None], offset: int, tokens: list[int]) -> dict[str, Any]:
    """The completions `logprobs` object over tokens with their entries (None for an unscored first token)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, entry in zip(tokens, entries):
        if entry is None:
            out["tokens"].append("")
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            chosen = entry[tid]
            text = _token_text(chosen, tid)
            out["tokens"].append(text)
            out["token_logprobs"].append(chosen.logprob)
            out["top_logprobs"].append({_token_text(lp, t): lp.logprob for t, lp in entry.items()})
        out["text_offset"].append(offset)
        offset += len(out["tokens"][-1])
    return out


def chat_logprobs(entries: list[dict[int, Logprob]], tokens: list[int], top_n: int) -> dict[str, Any]:
    content = []
    for tid, entry in zip(tokens, entries):
        chosen = entry[tid]
        text = _token_text(chosen, tid)
        tops = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:top_n]
        content.append({
            "token": text, "logprob": chosen.logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": _token_text(lp, t), "logprob": lp.logprob, "bytes": list(_token_text(lp, t).encode())} for t, lp in tops],
        })  # fmt: skip
    return {"content": content}


class Runner:
    """Submits validated requests and merges their output streams."""

    def __init__(self, engine: AsyncEngine, lora_name: str | None = None, queue_limit: int | None = None) -> None:
        self.engine = engine
        self.lora_name = lora_name  # the LoRA adapter the request's `model` names
        self.queue_limit = queue_limit
        self.streams: list[RequestStream] = []

    def build(self, prompts: list[Any], req: OpenAIRequest, prefix: str) -> list[EngineRequest]:
        """Tokenize and validate (in the engine's input thread: call it through `engine.run_input`)."""
        base = f"{prefix}-{uuid.uuid4().hex}"
        return [
            self.engine.make_request(
                p, req.params, request_id=f"{base}-{i}", priority=req.priority, timeout=req.timeout, lora_name=self.lora_name
            )
            for i, p in enumerate(prompts)
        ]

    async def prepare(self, requests: list[EngineRequest]) -> None:
        """Compile the requests' grammar off the step loop, then queue them all or none (a bad
        grammar is a 400, a full queue a 429, here, before any response starts)."""
        await self.engine.compile_grammars(requests)
        self.streams = self.engine.submit_all(requests, queue_limit=self.queue_limit)

    async def merged(self, requests: list[EngineRequest]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) as they arrive from all requests; closing it aborts them all."""
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, stream: RequestStream) -> None:
            try:
                async for out in stream:
                    await queue.put((i, out))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                await queue.put((i, e))
            finally:
                await stream.aclose()
                await queue.put((i, None))

        tasks = [asyncio.create_task(pump(i, st)) for i, st in enumerate(self.streams)]
        live = len(tasks)
        try:
            while live:
                i, item = await queue.get()
                if item is None:
                    live -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()  # cancelling a pump closes its stream, which aborts the request
            for st in self.streams:
                await st.aclose()  # a pump cancelled before it started never closed its stream


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def now() -> int:
    return int(time.time())
