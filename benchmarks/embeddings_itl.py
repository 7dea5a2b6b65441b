"""Inter-token latency of running streams while a maximal /v1/embeddings request runs (issue 28:
"one client must not stall the others"; target: p99 rises by at most 2x).

One server on loopback (the engine in-process, as `inflight serve` runs it): --streams streamed
completions (ignore_eos, greedy) run throughout. Phase "alone": the gaps between their tokens over
--window s. Phase "with embeddings": the same streams while one embeddings request of --inputs
max-length texts (256 tokens each for all-MiniLM-L6-v2; 1,024 x 256 = 262K tokens, under the
300K per-request limit) runs; the gaps counted are those inside the request's time. Prints one
JSON line: p50 / p99 / max gap per phase, the ratio of the p99s, the request's time, the CPU.

    python benchmarks/embeddings_itl.py                      # Qwen2.5-0.5B-shaped random decoder
    python benchmarks/embeddings_itl.py --model inflight/demo_model --inputs 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight import platform  # noqa: E402
from inflight.engine.async_engine import AsyncEngine  # noqa: E402
from inflight.engine.llm_engine import LLMEngine  # noqa: E402
from inflight.server.app import build_app  # noqa: E402
from inflight.server.config import ServerConfig  # noqa: E402


def _model(path: str | None) -> str:
    if path:
        return path
    from inflight.testing import QWEN25_05B_CONFIG, make_random_checkpoint

    out = Path(tempfile.mkdtemp()) / "qwen25_05b_random"
    make_random_checkpoint(out, config={**QWEN25_05B_CONFIG, "vocab_size": 32000})
    return str(out)


def _serve(engine: AsyncEngine) -> tuple[uvicorn.Server, str]:
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, ServerConfig(served_model_names=("m",))),
                                        host="127.0.0.1", port=0, log_level="warning"))  # fmt: skip
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"


async def _stream(client: httpx.AsyncClient, url: str, arrivals: list[float], stop: asyncio.Event) -> None:
    """One stream after another (a short context ends one) until stopped; gaps across two streams
    are not counted (a stream's first token is a prefill, not an inter-token gap)."""
    body = {"model": "m", "prompt": [11, 12, 13, 14], "max_tokens": 100_000, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    while not stop.is_set():
        arrivals.append(float("nan"))  # a new stream starts
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    arrivals.append(time.monotonic())
                if stop.is_set():
                    return


def _gaps(arrivals: list[list[float]], start: float, end: float) -> list[float]:
    out = []
    for times in arrivals:
        inside = [t for t in times if t != t or start <= t <= end]  # NaN: a stream boundary
        out += [b - a for a, b in zip(inside, inside[1:]) if a == a and b == b]
    return out


def _summary(gaps: list[float]) -> dict[str, float]:
    gaps = sorted(gaps)
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    return {"n": len(gaps), "p50_ms": round(statistics.median(gaps) * 1e3, 1), "p99_ms": round(p99 * 1e3, 1),
            "max_ms": round(gaps[-1] * 1e3, 1)}  # fmt: skip


async def run(url: str, streams: int, window: float, inputs: int) -> dict[str, Any]:
    arrivals: list[list[float]] = [[] for _ in range(streams)]
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=3600) as client:
        # the encoder loads on first use: not part of either phase
        await client.post(url + "/v1/embeddings", json={"input": "warm up"})
        tasks = [asyncio.create_task(_stream(client, url, a, stop)) for a in arrivals]
        while min(len(a) for a in arrivals) < 6:
            await asyncio.sleep(0.05)
        start = time.monotonic()
        await asyncio.sleep(window)
        alone = _gaps(arrivals, start, time.monotonic())
        e_start = time.monotonic()
        r = await client.post(url + "/v1/embeddings", json={"input": ["word " * 250] * inputs})
        e_end = time.monotonic()
        assert r.status_code == 200, r.text
        with_embed = _gaps(arrivals, e_start, e_end)
        stop.set()
        for t in tasks:
            t.cancel()
    a, w = _summary(alone), _summary(with_embed)
    return {"alone": a, "with_embeddings": w, "p99_ratio": round(w["p99_ms"] / a["p99_ms"], 2),
            "embeddings_s": round(e_end - e_start, 1), "embedding_tokens": r.json()["usage"]["total_tokens"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="decoder checkpoint (default: a Qwen2.5-0.5B-shaped random one)")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--window", type=float, default=10.0, help="seconds of the streams alone")
    ap.add_argument("--inputs", type=int, default=1024, help="texts of 256 tokens in the embeddings request")
    args = ap.parse_args()
    engine = AsyncEngine.launch(lambda: LLMEngine.from_args(_model(args.model), dtype="float32", device="cpu", progress=False))
    srv, url = _serve(engine)
    try:
        result = asyncio.run(run(url, args.streams, args.window, args.inputs))
    finally:
        srv.should_exit = True
        engine.shutdown()
    cpu = platform.current().cpu
    result |= {"cpu": f"{cpu.model_name or cpu.name} ({cpu.num_cores} cores)", "streams": args.streams,
               "model": args.model or "qwen2.5-0.5b-shaped random"}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
