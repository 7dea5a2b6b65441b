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

from inflight.engine.async_engine import EngineRequest, RequestStream
from inflight.engine.client import EngineClient
from inflight.outputs import CompletionOutput, Logprob, RequestOutput
from inflight.server.openai.protocol import OpenAIRequest

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


def usage(outs: list[RequestOutput], zero_output: bool = False) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: prompt tokens whose KV came
    from the prefix cache (vLLM / OpenAI). `zero_output`: max_tokens 0 scoring returned none."""
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = 0 if zero_output else sum(len(c.token_ids) for o in outs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


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


def request_metrics(out: RequestOutput) -> dict[str, float]:
    """vLLM's per-request `metrics` (--enable-per-request-metrics), in ms: queue (arrival ->
    first scheduled), time to first token (scheduled -> first token), generation (first -> last
    token), mean inter-token latency; tokens per second over scheduled -> last token."""
    m = out.metrics
    n = sum(len(c.token_ids) for c in out.outputs)
    sched = m.first_scheduled_time if m.first_scheduled_time is not None else m.arrival_time
    first = m.first_token_time if m.first_token_time is not None else sched
    last = m.token_times[-1] if m.token_times else first
    generation = max(last - first, 0.0) * 1e3
    return {
        "time_to_first_token_ms": round(max(first - sched, 0.0) * 1e3, 3),
        "generation_time_ms": round(generation, 3),
        "queue_time_ms": round(max(sched - m.arrival_time, 0.0) * 1e3, 3),
        "mean_itl_ms": round(generation / (n - 1), 3) if n > 1 else 0.0,
        "tokens_per_second": round(n / (last - sched), 3) if last > sched else 0.0,
    }


class TokenNames:
    """How logprob entries name tokens: the decoded text, or "token_id:42" with vLLM's
    `return_tokens_as_token_ids` (for tokens whose text is not valid on its own)."""

    def __init__(self, tokenizer: Any, as_ids: bool) -> None:
        self.tokenizer, self.as_ids = tokenizer, as_ids

    def __call__(self, tid: int, lp: Logprob | None = None) -> str:
        if self.as_ids:
            return f"token_id:{tid}"
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        if self.tokenizer is not None:
            return str(self.tokenizer.decode([tid]))
        return f"token_id:{tid}"


def completion_logprobs(
    entries: list[dict[int, Logprob] | None], tokens: list[int], offset: int, names: TokenNames
) -> dict[str, Any]:
    """The completions `logprobs` object. `text_offset` is each token's character offset in the
    returned text, cumulative from `offset` (the characters of this choice already returned:
    echoed prompt and earlier chunks), as OpenAI and vLLM give it. A None entry (the first
    prompt token, which has no context) is named but unscored."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, entry in zip(tokens, entries):
        if entry is None:
            out["tokens"].append(names(tid))
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            chosen = entry[tid]
            out["tokens"].append(names(tid, chosen))
            out["token_logprobs"].append(chosen.logprob)
            out["top_logprobs"].append({names(t, lp): lp.logprob for t, lp in entry.items()})
        out["text_offset"].append(offset)
        offset += len(out["tokens"][-1])
    return out


def logprobs_chars(lp: dict[str, Any] | None) -> int:
    """Characters a completions logprobs object covers (where the next one's offsets start)."""
    if not lp or not lp["tokens"]:
        return 0
    return int(lp["text_offset"][-1]) + len(lp["tokens"][-1]) - int(lp["text_offset"][0])


def chat_logprobs(entries: list[dict[int, Logprob]], tokens: list[int], top_n: int, names: TokenNames) -> dict[str, Any]:
    """top_n -1: every token of the entry (vLLM's top_logprobs -1)."""
    content = []
    for tid, entry in zip(tokens, entries):
        chosen = entry[tid]
        text = names(tid, chosen)
        tops = sorted(entry.items(), key=lambda kv: -kv[1].logprob)
        if top_n >= 0:
            tops = tops[:top_n]
        content.append({
            "token": text, "logprob": chosen.logprob, "bytes": list(text.encode()),
            "top_logprobs": [{"token": names(t, lp), "logprob": lp.logprob, "bytes": list(names(t, lp).encode())} for t, lp in tops],
        })  # fmt: skip
    return {"content": content}


class Runner:
    """Submits validated requests and merges their output streams."""

    def __init__(self, engine: EngineClient, lora_name: str | None = None, queue_limit: int | None = None) -> None:
        self.engine = engine
        self.lora_name = lora_name  # the LoRA adapter the request's `model` names
        self.queue_limit = queue_limit
        self.streams: list[RequestStream] = []
        self._merged: asyncio.Queue[Any] | None = None  # several prompts: the queue `merged` reads

    def build(self, prompts: list[Any], req: OpenAIRequest, prefix: str, final_only: bool = False) -> list[EngineRequest]:
        """Tokenize and validate (in the engine's input thread: call it through `engine.run_input`).
        `final_only`: a response built from the final outputs alone (not streamed): the engine
        makes no output before a request finishes (RequestInputs.final_only)."""
        base = f"{prefix}-{req.request_id or uuid.uuid4().hex}"
        return [
            self.engine.make_request(
                p, req.params, request_id=f"{base}-{i}", priority=req.priority, timeout=req.timeout,
                lora_name=self.lora_name, cache_salt=req.cache_salt,
                cumulative_logprob=False,  # the OpenAI APIs never show it (best_of's ranking computes it)
                final_only=final_only,
            )  # fmt: skip
            for i, p in enumerate(prompts)
        ]

    async def prepare(self, requests: list[EngineRequest]) -> None:
        """Compile the requests' grammar off the step loop, then queue them all or none (a bad
        grammar is a 400, a full queue a 429, here, before any response starts)."""
        await self.engine.compile_grammars(requests)
        self.streams = self.engine.submit_all(requests, queue_limit=self.queue_limit)

    def ready(self) -> bool:
        """`merged` has an output at hand (the stream can send what it has in one write when not)."""
        if self._merged is not None:
            return not self._merged.empty()
        return any(s.ready() for s in self.streams)

    async def merged(self, requests: list[EngineRequest]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) as they arrive from all requests; closing it aborts them all."""
        if len(self.streams) == 1:  # one prompt (the usual request): no pump task and second queue per token
            stream = self.streams[0]
            try:
                async for out in stream:
                    yield 0, out
            finally:
                await stream.aclose()
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()
        self._merged = queue

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


# json.dumps(obj, ensure_ascii=False) builds a JSONEncoder per call; a stream sends one chunk per token
_encode = json.JSONEncoder(ensure_ascii=False).encode


def sse(obj: dict[str, Any]) -> str:
    return f"data: {_encode(obj)}\n\n"


def now() -> int:
    return int(time.time())
