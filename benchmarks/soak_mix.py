"""The soak's request mix (benchmarks/soak.py drives it): each kind of request in MIX, with its
weight, and `Soak`, which sends one request of a kind, classifies the answer (an HTTP status, or
what went wrong on the connection) and records the statuses, latencies and broken invariants."""

from __future__ import annotations

import asyncio
import contextvars
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_media import remote_media  # noqa: E402

MIX = {
    "complete": 6, "complete_stream": 6, "chat": 4, "chat_stream": 4, "generate_stream": 4,
    "hangup_stream": 4, "give_up": 3, "n_best_of": 2, "beam": 1, "structured": 1, "tiny_timeout": 2,
    "invalid": 4, "oversize": 2, "path_tricks": 2, "embeddings": 1, "slow_client": 1, "remote_media": 2,
}  # fmt: skip
BODY_LIMIT = 1 << 20  # the server under test runs with --max-body-bytes 1 MiB
SELF_INFLICTED = "client_hung_up"
DEADLINE = "deadline_refused"  # 503 + Retry-After at arrival: the request's timeout can't be met
PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("priority", default=5)  # of the worker's current request


# ------------------------------------------------------------------ requests
def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "while", "rain", "fell", "softly"]) for _ in range(rng.randint(1, 40)))


def _invalid(rng: random.Random) -> tuple[str, bytes]:
    """(path, raw body) the server must answer with a 4xx."""
    cases = [
        b"{not json", b"[1, 2]", b'{"prompt": 5}', b'{"prompt": "x", "temperature": -1}',
        b'{"prompt": "x", "max_tokens": "many"}', b'{"prompt": "x", "n": 1000}', b'{"prompt": ""}',
        b'{"prompt": "x", "temperature": 1' + b"0" * 400 + b"}", b'{"prompt": "x", "z": ' + b"9" * 5000 + b"}",
        b'{"prompt": "\\ud800"}', b'{"prompt": "x", "logit_bias": {"\xc2\xb2": 1}}', b"[" * 100_000 + b"]" * 100_000,
        b'{"prompt": "x", "use_beam_search": true, "best_of": 200}', b'{"prompt": "x", "length_penalty": 1e308, "use_beam_search": true, "best_of": 2, "temperature": 0}',
        b'{"prompt": "x", "stop": [""]}', b'{"prompt": [[]]}', b'{"prompt": "x", "top_p": 0}', b'{"prompt": "x", "seed": 18446744073709551616}',
    ]  # fmt: skip
    chat = [b'{"messages": []}', b'{"messages": [{"role": 5, "content": "x"}]}', b'{"messages": [{"role": "user", "content": "\\udfff"}]}']
    if rng.random() < 0.2:
        return "/v1/chat/completions", rng.choice(chat)
    return "/v1/completions", rng.choice(cases)


class Soak:
    def __init__(self, url: str, model: str, seed: int) -> None:
        self.url, self.model = url, model
        self.rng = random.Random(seed)
        self.status: Counter[str] = Counter()  # "kind status"
        self.latency: list[float] = []  # seconds, completed requests
        self.by_priority: dict[int, list[float]] = {p: [] for p in range(1, 6)}  # the same, by request priority
        self.ttft: list[float] = []
        self.broken: list[str] = []
        self.health: list[float] = []  # /health latencies, seconds
        self.media_url = ""  # the loopback media server (soak_media.py)

    def note(self, kind: str, status: int | str) -> None:
        self.status[f"{kind} {status}"] += 1
        if isinstance(status, int) and status >= 500:
            self.broken.append(f"{kind}: HTTP {status}")
        elif isinstance(status, str) and status not in (SELF_INFLICTED, DEADLINE, "client_timeout", "closed"):
            self.broken.append(f"{kind}: {status}")

    async def one(self, client: httpx.AsyncClient, kind: str | None = None) -> None:
        rng = self.rng
        kind = kind or rng.choices(list(MIX), weights=list(MIX.values()))[0]
        t0 = time.monotonic()
        PRIORITY.set(5)  # the default; _sampling draws another
        try:
            status = await getattr(self, "_" + kind)(client, rng)
        except httpx.TimeoutException:
            status = "client_timeout" if kind == "give_up" else "timeout"
        except httpx.TransportError as e:
            status = f"connection error ({type(e).__name__})"
        if status == 200 and kind not in ("hangup_stream", "give_up"):
            self.latency.append(time.monotonic() - t0)
            self.by_priority[PRIORITY.get()].append(time.monotonic() - t0)
        self.note(kind, status)

    # each returns the HTTP status, or a word for what happened instead
    def _sampling(self, rng: random.Random) -> dict[str, Any]:
        PRIORITY.set(rng.randint(1, 5))  # each worker runs in its own task: its own context
        return {"max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.7, 1.0]), "priority": PRIORITY.get()}

    async def _complete(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        return (await c.post("/v1/completions", json={"prompt": _prompt(rng), **self._sampling(rng)})).status_code

    async def _stream(self, c: httpx.AsyncClient, path: str, body: dict[str, Any], hang_up_after: int | None = None) -> int | str:
        t0 = time.monotonic()
        async with c.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code
            events = 0
            async for line in r.aiter_lines():
                if line.startswith("data"):
                    if events == 0:
                        self.ttft.append(time.monotonic() - t0)
                    events += 1
                    if hang_up_after is not None and events >= hang_up_after:
                        return SELF_INFLICTED
            return 200 if events else "empty stream"

    async def _complete_stream(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        return await self._stream(c, "/v1/completions", {"prompt": _prompt(rng), "stream": True, **self._sampling(rng)})

    async def _chat(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        body = {"messages": [{"role": "user", "content": _prompt(rng)}], **self._sampling(rng)}
        return (await c.post("/v1/chat/completions", json=body)).status_code

    async def _chat_stream(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        body = {"messages": [{"role": "user", "content": _prompt(rng)}], "stream": True, "stream_options": {"include_usage": True}, **self._sampling(rng)}
        return await self._stream(c, "/v1/chat/completions", body)

    async def _generate_stream(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        PRIORITY.set(rng.randint(1, 5))
        body = {"text_input": _prompt(rng), "parameters": {"max_new_tokens": rng.randint(1, 24), "priority": PRIORITY.get()}}
        return await self._stream(c, f"/v2/models/{self.model}/generate_stream", body)

    async def _hangup_stream(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        body = {"prompt": _prompt(rng), "stream": True, "max_tokens": 200, "ignore_eos": True}
        return await self._stream(c, "/v1/completions", body, hang_up_after=rng.randint(1, 5))

    async def _give_up(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        body = {"prompt": _prompt(rng), "max_tokens": 300, "ignore_eos": True}
        return (await c.post("/v1/completions", json=body, timeout=rng.uniform(0.1, 1.0))).status_code

    async def _n_best_of(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        extra = rng.choice([{"n": 2}, {"n": 2, "best_of": 3}, {"n": 3, "stream": False}])
        return (await c.post("/v1/completions", json={"prompt": _prompt(rng), "max_tokens": 8, "temperature": 0.8, **extra})).status_code

    async def _beam(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        body = {"prompt": _prompt(rng), "max_tokens": 6, "use_beam_search": True, "best_of": 2, "temperature": 0}
        return (await c.post("/v1/completions", json=body)).status_code

    async def _structured(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        body = {"messages": [{"role": "user", "content": "json please"}], "max_tokens": 12, "response_format": {"type": "json_object"}}
        return (await c.post("/v1/chat/completions", json=body)).status_code

    async def _tiny_timeout(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        body = {"prompt": _prompt(rng), "max_tokens": 64, "ignore_eos": True, "timeout": rng.uniform(0.01, 0.3)}
        r = await c.post("/v1/completions", json=body)
        if r.status_code == 503 and r.json()["error"]["code"] == "deadline" and "retry-after" in r.headers:
            return DEADLINE  # refused at arrival: the queue ahead can't be prefilled in time (as specified)
        return r.status_code

    async def _invalid(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        path, raw = _invalid(rng)
        r = await c.post(path, content=raw, headers={"content-type": "application/json"})
        return r.status_code if r.status_code != 200 else "invalid input accepted"

    async def _oversize(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        if rng.random() < 0.5:  # chunked: no content-length to refuse up front
            async def body():  # type: ignore[no-untyped-def]
                for _ in range(3):
                    yield b"x" * (BODY_LIMIT // 2)

            r = await c.post("/v1/completions", content=body(), headers={"content-type": "application/json"})
        elif rng.random() < 0.5:
            r = await c.post("/v1/completions", content=b"x" * (BODY_LIMIT + 1), headers={"content-type": "application/json"})
        else:  # under the body limit, over the token limit
            r = await c.post("/v1/completions", json={"prompt": "word " * 50_000, "max_tokens": 1})
        return r.status_code if r.status_code in (400, 413, 429) else f"oversize answered {r.status_code}"  # 429: refused before the body

    async def _path_tricks(self, c: httpx.AsyncClient, rng: random.Random) -> int | str:
        method, path = rng.choice([("GET", "/v1/nope"), ("GET", "/v1/completions"), ("POST", "/v1/completions/"), ("DELETE", "/v1/models"),
                                   ("GET", "/v1/models/nope"), ("POST", "/v2/models/nope/generate"), ("GET", "/../../etc/passwd")])  # fmt: skip
        r = await c.request(method, path, json={"prompt": "x"} if method == "POST" else None)
        try:
            shaped = "error" in r.json()
        except ValueError:
            shaped = False
        if r.status_code < 400 or not shaped:
            return f"path trick answered {r.status_code} {r.text[:60]!r}"
        return r.status_code

    async def _remote_media(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        return await remote_media(c, rng, self.media_url, self.model)

    async def _embeddings(self, c: httpx.AsyncClient, rng: random.Random) -> int:
        return (await c.post("/v1/embeddings", json={"input": [_prompt(rng) for _ in range(rng.randint(1, 4))]})).status_code

    async def _slow_client(self, c: httpx.AsyncClient, rng: random.Random) -> str:
        """Trickled headers on a raw socket: the server must cut it off (408 / close)."""
        u = urlparse(self.url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        try:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
            for _ in range(60):  # up to 30 s of trickling, far past --timeout-header
                await asyncio.sleep(0.5)
                if reader.at_eof():
                    break
                writer.write(b"x-slow: 1\r\n")
                try:
                    await writer.drain()
                except ConnectionError:
                    break
            data = await asyncio.wait_for(reader.read(200), 5)
            return "closed" if data == b"" or b" 408 " in data else f"slow client got {data[:40]!r}"
        except (TimeoutError, ConnectionError):
            return "closed"
        finally:
            writer.close()

    # ------------------------------------------------------------ checks
    async def greedy(self, c: httpx.AsyncClient) -> str:
        r = await c.post("/v1/completions", json={"prompt": "The soak test", "max_tokens": 16, "temperature": 0})
        return r.json()["choices"][0]["text"]

    async def watch_health(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                r = await c.get("/health")
                self.health.append(time.monotonic() - t0)
                if r.status_code != 200:
                    self.broken.append(f"/health answered {r.status_code}")
                await asyncio.sleep(0.5)
