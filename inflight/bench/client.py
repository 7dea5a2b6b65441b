"""Load generation over HTTP: Poisson arrivals, an optional concurrency cap, streamed requests.

A request that fails (connection refused, an HTTP error status, a stream cut short, a
finish_reason of abort / timeout) becomes a failed RequestResult with the reason; it never
stops the run.

The client is aiohttp (C-accelerated HTTP parsing, as `vllm bench serve`): on a small machine
the load generator shares the cores with the server, and a client that spends a core-second
per thousand events (httpx's pure-Python HTTP/1.1) takes that time from the server it
measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from tqdm import tqdm

from inflight.bench.backends import Backend, Chunk, RequestConfig
from inflight.bench.dataset import SampleRequest
from inflight.bench.metrics import RequestResult

logger = logging.getLogger(__name__)
_FAILED_FINISH = ("abort", "timeout")


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    request_rate: float  # requests/s of a Poisson process; inf = all at once
    max_concurrency: int | None
    seed: int
    timeout_s: float  # longest wait for one stream event
    api_key: str | None = None
    progress: bool = True


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Send times (s since start): the first at 0, then exponential gaps of mean 1 / rate."""
    if num == 0 or rate == float("inf"):
        return [0.0] * num
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=num - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def make_client(load: LoadConfig) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {load.api_key}"} if load.api_key else {}
    timeout = aiohttp.ClientTimeout(
        total=None, sock_read=load.timeout_s, sock_connect=min(load.timeout_s, 30.0)
    )
    return aiohttp.ClientSession(
        headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    )


async def send(
    client: aiohttp.ClientSession,
    url: str,
    backend: Backend,
    req: SampleRequest,
    cfg: RequestConfig,
    t0: float,
) -> RequestResult:
    """One streamed request to `url` + the backend's path, timed from just before it is sent."""
    result = RequestResult(prompt_len=req.prompt_len, output_len=req.output_len)
    start = time.perf_counter()
    result.start_s = start - t0
    try:
        async with client.post(url + backend.path(cfg.model), json=backend.body(req, cfg)) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                result.error = f"HTTP {resp.status}: {text[:300]}"
            else:
                await _consume(resp, backend, result, start)
    except aiohttp.ClientConnectorError as e:
        result.error = f"ConnectError: {e}"
    except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, AttributeError) as e:
        result.error = f"{type(e).__name__}: {e}"  # or a malformed event
    result.latency_s = time.perf_counter() - start
    return result


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, bytes]]:
    """(arrival time, line) for every line of the body; lines that arrive together share a time."""
    pending, now = b"", time.perf_counter()
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            yield now, line
    if pending:  # a last line without its newline
        yield now, pending


async def _consume(
    resp: aiohttp.ClientResponse, backend: Backend, result: RequestResult, start: float
) -> None:
    last, done = start, False
    async for now, raw in _lines(resp):
        if not raw.startswith(b"data:"):
            continue
        chunk = backend.parse(raw[5:].decode().strip())
        if chunk.error is not None:
            result.error = f"error event: {chunk.error[:300]}"
            return
        if chunk.is_token:
            if result.ttft_s is None:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last)
            last = now
            result.generated_text += chunk.text
        _take_counts(result, chunk)
        done = done or chunk.done
    _judge(result, done)


def _take_counts(result: RequestResult, chunk: Chunk) -> None:
    if chunk.output_tokens is not None:
        result.output_tokens, result.output_tokens_source = chunk.output_tokens, "server"
    if chunk.prompt_tokens is not None:
        result.server_prompt_tokens = chunk.prompt_tokens
    if chunk.finish_reason is not None:
        result.finish_reason = chunk.finish_reason


def _judge(result: RequestResult, done: bool) -> None:
    if not done:
        result.error = "the stream ended before its last event"
    elif result.finish_reason in _FAILED_FINISH:
        result.error = f"finished with finish_reason={result.finish_reason}"
    elif result.ttft_s is None:
        result.error = "no output was streamed"
    else:
        result.success = True


def count_missing_tokens(results: list[RequestResult], tokenizer: Any | None) -> None:
    """Output token counts the server did not report: by the tokenizer, else one per chunk."""
    for r in results:
        if r.output_tokens_source:
            continue
        if tokenizer is not None:
            r.output_tokens = len(tokenizer.encode(r.generated_text, add_special_tokens=False))
            r.output_tokens_source = "tokenizer"
        else:
            r.output_tokens, r.output_tokens_source = r.num_chunks, "chunks"


async def _warm_up(
    client: aiohttp.ClientSession,
    url: str,
    backend: Backend,
    warmups: list[SampleRequest],
    cfg: RequestConfig,
) -> None:
    for w in warmups:
        r = await send(client, url, backend, w, cfg, time.perf_counter())
        if not r.success:
            logger.warning("warmup request failed: %s", r.error)


async def run_load(
    backend: Backend,
    requests: list[SampleRequest],
    warmups: list[SampleRequest],
    cfg: RequestConfig,
    load: LoadConfig,
) -> tuple[list[RequestResult], float]:
    """(results in request order, benchmark duration in s); warmups run one by one first."""
    limit: contextlib.AbstractAsyncContextManager[Any]
    limit = (
        asyncio.Semaphore(load.max_concurrency)
        if load.max_concurrency
        else contextlib.nullcontext()
    )
    bar = tqdm(total=len(requests), desc="Benchmarking", disable=not load.progress)
    async with make_client(load) as client:
        url = load.base_url.rstrip("/")
        await _warm_up(client, url, backend, warmups, cfg)

        async def one(req: SampleRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
            async with limit:
                result = await send(client, url, backend, req, cfg, t0)
            bar.update(1)
            return result

        offsets = arrival_offsets(len(requests), load.request_rate, load.seed)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets)))
        duration = time.perf_counter() - t0
    bar.close()
    return list(results), duration
