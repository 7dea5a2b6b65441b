"""Soak: a bounded mixed attack on a loopback server; exits 1 when an invariant breaks.

    python benchmarks/soak.py --duration 600 --clients 48        # a tiny random model, its own server
    python benchmarks/soak.py --model /path/to/ckpt --duration 60  # a real checkpoint
    python benchmarks/soak.py --url http://127.0.0.1:8000 --pid 1234 --model-name m   # a running server

The mix (weights in MIX): completions / chat / /v2 streams with random priorities, n and
best_of, beam search, structured output, tiny `timeout`s, clients that hang up mid-stream or
give up on a non-streamed request, invalid and hostile input, bodies over the limit (with and
without content-length), path and method tricks, embeddings, raw-socket slow clients, and chats
with images fetched from a loopback media server of its own (soak_media.py: good images, and
hostile sources the server must refuse; the server runs with --allow-remote-media and
--allowed-media-domains 127.0.0.1; --vision serves a tiny Qwen2-VL so the images are used).

Invariants (each broken one is printed; exit status 1):
  - no 5xx answer (a 503 + Retry-After refusing a `timeout` the queue can't meet is expected) and no connection error the harness did not cause itself;
  - nothing stuck: once the load stops, running == waiting == 0 within 30 s, KV usage 0;
  - a fixed greedy request gives the same text before and after;
  - /health answers within --max-health-s (5 s) throughout (nothing blocks the event loop; a
    loaded 2-core machine shares its cores with the harness, so stalls of a second or two happen);
  - server RSS grows less than --max-rss-growth-mb over the second half of the run.
Reported: status histogram per kind, p50/p99 latency of completed requests, generated tokens per
second, RSS over time (at each whole minute, and its least-squares slope over the second half).
Loopback only: --url must point at 127.0.0.1 / localhost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_media import MediaServer  # noqa: E402
from soak_mix import BODY_LIMIT, MIX, Soak  # noqa: E402


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return float("nan")


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points, per unit of t."""
    n = len(points)
    mt, my = sum(t for t, _ in points) / n, sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / var if var else 0.0


def _by_minute(rss: list[tuple[float, float]]) -> list[tuple[int, float]]:
    """RSS at the end of each whole minute of the run (the last sample at or before it)."""
    out = []
    for minute in range(1, int(rss[-1][0] // 60) + 1 if rss else 1):
        out.append((minute, [r for t, r in rss if t <= minute * 60][-1]))
    return out


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Outcome:
    """What one soak run measured, for the invariants and the summary."""

    elapsed: float  # seconds of load
    tokens: float  # generated during the load (the server's counter)
    running: float  # requests still running / waiting once the load stopped and 30 s passed
    waiting: float
    kv: float  # KV cache usage ratio then
    before: str  # the fixed greedy request's text before and after the load
    after: str
    rss: list[tuple[float, float]]  # (seconds since the load started, server RSS in MB)


async def _sample_rss(pid: int | None, stop: asyncio.Event, t_start: float, rss: list[tuple[float, float]]) -> None:
    while pid is not None and not stop.is_set():
        rss.append((time.monotonic() - t_start, _rss_mb(pid)))
        await asyncio.sleep(1.0)


async def _load(soak: Soak, client: httpx.AsyncClient, args: argparse.Namespace, t_start: float) -> float:
    """--clients workers send the mix until --duration or --max-requests; returns the seconds taken."""
    end = t_start + args.duration
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while time.monotonic() < end and sent < args.max_requests:
            sent += 1
            await soak.one(client)

    await asyncio.gather(*(worker() for _ in range(args.clients)))
    return time.monotonic() - t_start


async def _settle(client: httpx.AsyncClient) -> tuple[float, float, float]:
    """Running and waiting requests once they reach 0 (or 30 s pass), and the KV usage then."""
    deadline = time.monotonic() + 30  # everything must settle: aborted work freed, nothing stuck
    while True:
        m = (await client.get("/metrics")).text
        running, waiting = _metric(m, "inflight_requests_running"), _metric(m, "inflight_requests_waiting")
        if (running == 0 and waiting == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    return running, waiting, _metric(m, "inflight_kv_cache_usage_ratio")


async def _soak(soak: Soak, args: argparse.Namespace, url: str, pid: int | None) -> Outcome:
    rss: list[tuple[float, float]] = []
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        before = await soak.greedy(client)
        for kind in MIX:  # warm-up, one of each (loads the embedding model, compiles a grammar): RSS from here
            await soak.one(client, kind)
        tokens_at_start = _metric((await client.get("/metrics")).text, "inflight_generation_tokens_total")
        stop = asyncio.Event()
        health = asyncio.create_task(soak.watch_health(stop))
        t_start = time.monotonic()
        sampler = asyncio.create_task(_sample_rss(pid, stop, t_start, rss))
        elapsed = await _load(soak, client, args, t_start)
        tokens = _metric((await client.get("/metrics")).text, "inflight_generation_tokens_total") - tokens_at_start
        running, waiting, kv = await _settle(client)
        after = await soak.greedy(client)
        stop.set()
        await health
        await sampler
    return Outcome(elapsed, tokens, running, waiting, kv, before, after, rss)


def _check(soak: Soak, args: argparse.Namespace, out: Outcome) -> tuple[float | None, float | None]:
    """Adds each broken invariant to soak.broken; returns the RSS growth (MB) and slope (MB/min)
    over the second half, None with fewer than 4 samples."""
    if out.running or out.waiting:
        soak.broken.append(f"stuck: {out.running:g} running, {out.waiting:g} waiting 30 s after the load stopped")
    if out.kv != 0:
        soak.broken.append(f"KV usage {out.kv:g} with nothing running")
    if out.before != out.after:
        soak.broken.append(f"greedy text changed: {out.before!r} -> {out.after!r}")
    health = sorted(soak.health) or [0.0]
    if health[-1] > args.max_health_s:
        soak.broken.append(f"/health took {health[-1]:.2f} s (limit {args.max_health_s:g} s)")
    growth = slope = None
    rss = out.rss
    if len(rss) >= 4:
        half = [(t, r) for t, r in rss if t >= rss[-1][0] / 2]
        growth = half[-1][1] - min(r for _, r in half)
        slope = _slope(half) * 60
        if growth > args.max_rss_growth_mb:
            soak.broken.append(f"RSS grew {growth:.0f} MB over the second half (limit {args.max_rss_growth_mb} MB)")
    return growth, slope


def _summary(soak: Soak, args: argparse.Namespace, out: Outcome, growth: float | None, slope: float | None) -> dict:
    lat, health, rss, elapsed = sorted(soak.latency), sorted(soak.health) or [0.0], out.rss, out.elapsed
    return {
        "requests": sum(soak.status.values()), "seconds": round(elapsed, 1), "clients": args.clients,
        "status": dict(sorted(Counter(k.split(" ", 1)[1] for k in soak.status.elements()).items())),
        "by_kind": dict(sorted(soak.status.items())),
        "latency_s": {"p50": round(statistics.median(lat), 3), "p99": round(lat[int(0.99 * (len(lat) - 1))], 3)} if lat else None,
        "latency_by_priority_s": {p: {"n": len(v), "p50": round(statistics.median(v), 2), "p99": round(sorted(v)[int(0.99 * (len(v) - 1))], 2)}
                                  for p, v in soak.by_priority.items() if v},
        "ttft_p99_s": round(sorted(soak.ttft)[int(0.99 * (len(soak.ttft) - 1))], 3) if soak.ttft else None,
        "health_s": {"p99": round(health[int(0.99 * (len(health) - 1))], 3), "max": round(health[-1], 3)}, "final_kv_usage": out.kv, "stuck": {"running": out.running, "waiting": out.waiting},
        "generated_tokens_per_s": round(out.tokens / elapsed, 1), "ok_per_s": round(len(lat) / elapsed, 2),
        "rss_mb": [(round(t), round(r)) for t, r in rss[:: max(1, len(rss) // 12)]] + ([(round(rss[-1][0]), round(rss[-1][1]))] if rss else []),
        "rss_mb_by_minute": {m: round(r) for m, r in _by_minute(rss)},
        "rss_growth_second_half_mb": None if growth is None else round(growth),
        "rss_slope_second_half_mb_per_min": None if slope is None else round(slope, 1), "broken": sorted(set(soak.broken)),
    }  # fmt: skip


def _report(soak: Soak, args: argparse.Namespace, summary: dict, elapsed: float) -> None:
    print(json.dumps(summary, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1))
    print(f"soak: {summary['requests']} requests in {elapsed:.0f} s, statuses {summary['status']}, p99 {summary['latency_s']}, "
          f"{summary['generated_tokens_per_s']} generated tok/s, RSS second-half growth {summary['rss_growth_second_half_mb']} MB "
          f"(slope {summary['rss_slope_second_half_mb_per_min']} MB/min): {'OK' if not soak.broken else 'BROKEN'}")  # fmt: skip
    for b in sorted(set(soak.broken)):
        print("  broken:", b)


async def run(args: argparse.Namespace, url: str, model: str, pid: int | None, media_url: str = "") -> int:
    soak = Soak(url, model, args.seed)
    soak.media_url = media_url
    out = await _soak(soak, args, url, pid)
    growth, slope = _check(soak, args, out)
    _report(soak, args, _summary(soak, args, out, growth, slope), out.elapsed)
    return 1 if soak.broken else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen, str, str]:  # type: ignore[type-arg]
    model = args.model
    if model is None and args.vision:
        from inflight.testing import make_tiny_vl_checkpoint

        model = str(make_tiny_vl_checkpoint("qwen2_vl", work / "tiny_vl"))
    elif model is None:
        from inflight.testing import make_tiny_checkpoint

        model = str(make_tiny_checkpoint("qwen2", work / "tiny"))
    port = _free_port()
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", model, "--port", str(port), "--dtype", args.dtype,
           "--max-num-seqs", "8", "--max-queue", "64", "--max-body-bytes", str(BODY_LIMIT), "--timeout-header", "2",
           "--timeout-body", "5", "--log-level", "warning", "--allow-remote-media", "--allowed-media-domains", "127.0.0.1",
           "--media-fetch-timeout", "3", *args.server_args]  # fmt: skip
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit("soak: the server exited:\n" + (work / "server.log").read_text()[-3000:])
        try:
            if httpx.get(url + "/health/ready", timeout=2).status_code == 200:
                return proc, url, Path(model).name
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("soak: the server did not start")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60, help="seconds of load (default 60)")
    p.add_argument("--max-requests", type=int, default=100_000, help="stop after this many requests")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="checkpoint for the server this starts (default: a tiny random qwen2)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--url", help="soak a running server instead (loopback only)")
    p.add_argument("--model-name", default="model", help="with --url: the served model name")
    p.add_argument("--pid", type=int, help="with --url: the server's pid, for RSS")
    p.add_argument("--max-rss-growth-mb", type=float, default=150.0)
    p.add_argument("--max-health-s", type=float, default=5.0, help="slowest /health answer allowed (a blocked event loop)")
    p.add_argument("--json-out", help="also write the summary here")
    p.add_argument("--skip", nargs="*", default=[], choices=list(MIX), help="request kinds left out of the mix")
    p.add_argument("--vision", action="store_true", help="serve a tiny Qwen2-VL: remote_media requests are answered, not refused")
    p.add_argument("server_args", nargs="*", help="after --: more `inflight serve` flags")
    args = p.parse_args(argv)
    for kind in args.skip:
        MIX.pop(kind)
    media = MediaServer()  # the server under test fetches only from here (--allowed-media-domains 127.0.0.1)
    if args.url:
        if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("soak: loopback only (--url 127.0.0.1 / localhost)")
        return asyncio.run(run(args, args.url.rstrip("/"), args.model_name, args.pid, media.base))
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, name = start_server(args, Path(tmp))
        try:
            return asyncio.run(run(args, url, name, proc.pid, media.base))
        finally:
            media.close()
            proc.terminate()
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                print("soak: the server did not exit within 40 s of SIGTERM")
                return 1


if __name__ == "__main__":
    sys.exit(main())
