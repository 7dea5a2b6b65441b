"""The server reaches the engine only through AsyncEngine's client interface: no engine or
scheduler imports, /metrics and /health read the snapshot the engine thread publishes, and a
dead engine makes the server unhealthy and fails requests at once."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

import inflight.server
from inflight import SamplingParams
from inflight.engine.async_engine import AsyncEngine, EngineDeadError, StatsSnapshot
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app

SERVER_DIR = Path(inflight.server.__file__).parent
# what the server may not import: engine internals live behind AsyncEngine
FORBIDDEN = ("inflight.engine.llm_engine", "inflight.core", "inflight.worker", "inflight.request", "inflight.models", "inflight.sample")


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(SERVER_DIR.rglob("*.py"))]


def test_server_imports_no_engine_internals() -> None:
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


def _server_imports(path: Path, tree: ast.Module) -> set[str]:
    """The inflight.server modules a module imports when it loads (function-level imports excluded),
    each with the packages above it (importing `a.b.c` runs `a/b/__init__.py`)."""
    found: set[str] = set()
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(3, len(parts) + 1)}
    root = SERVER_DIR.parent.parent
    return {m for m in found if m.startswith("inflight.server")
            and ((root / (m.replace(".", "/") + ".py")).exists() or (root / m.replace(".", "/") / "__init__.py").exists())}  # fmt: skip


def _module_name(path: Path) -> str:
    rel = path.relative_to(SERVER_DIR.parent.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_server_has_no_import_cycle() -> None:
    """Each server module imports alone, whatever was imported before it (an API package's
    `__init__` that imported its router would close a circle through `context`)."""
    graph = {_module_name(p): _server_imports(p, t) - {_module_name(p)} for p, t in _modules()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 2:
            return
        assert state.get(m) != 1, "import cycle: " + " -> ".join(path[path.index(m):] + [m])
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            visit(dep, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert "inflight.server.openai.api" in graph["inflight.server.app"]  # the check sees the imports


def test_server_never_reaches_through_the_client() -> None:
    """No `engine.engine` (the AsyncEngine's LLMEngine) anywhere in the server."""
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "engine":
                inner = node.value
                name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", None)
                assert name != "engine", f"{path.name}:{node.lineno} reaches engine.engine"


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _hold_engine_thread(engine: AsyncEngine) -> tuple[threading.Event, threading.Event]:
    """Park the engine thread inside a call until `release` is set."""
    inside, release = threading.Event(), threading.Event()

    def park() -> None:
        inside.set()
        release.wait(30)

    threading.Thread(target=lambda: asyncio.run(engine.call(park)), daemon=True).start()
    assert inside.wait(30)
    return inside, release


def test_metrics_and_health_read_the_published_snapshot(server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "snapshot", "max_tokens": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    server.wait_idle()
    snap = server.engine.stats
    assert isinstance(snap, StatsSnapshot) and snap.num_steps >= 4 and snap.dead is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.num_running = 1  # type: ignore[misc]
    _, release = _hold_engine_thread(server.engine)
    try:  # the engine thread is busy elsewhere: scrapes are answered from the snapshot, at once
        t0 = time.monotonic()
        text = httpx.get(server.url + "/metrics", timeout=10).text
        assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
    snap = server.engine.stats
    assert _metric(text, "inflight_engine_steps_total") == snap.num_steps
    assert _metric(text, "inflight_requests_running") == snap.num_running == 0
    assert _metric(text, "inflight_requests_waiting") == snap.num_waiting == 0
    assert _metric(text, "inflight_kv_cache_usage_ratio") == pytest.approx(snap.kv_cache_usage)
    assert _metric(text, "inflight_preemptions_total") == snap.num_preemptions


def test_model_facts_and_abort_through_the_client(server) -> None:  # type: ignore[no-untyped-def]
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert cards[0]["max_model_len"] == server.engine.model_info.max_model_len > 0
    assert server.engine.model_info.vocab_size > 0 and server.engine.tokenizer is not None

    async def main() -> str | None:
        engine = server.engine
        outs = engine.generate([5, 6, 7], SamplingParams(max_tokens=300, ignore_eos=True, temperature=0), request_id="to-abort")
        first = await anext(outs)
        assert not first.finished
        await engine.abort("to-abort")
        last = first
        async for last in outs:  # noqa: B007 (the stream ends with the aborted output)
            pass
        return last.outputs[0].finish_reason

    assert asyncio.run(main()) == "abort"
    server.wait_idle()


def _serve(engine: AsyncEngine) -> tuple[uvicorn.Server, threading.Thread, str]:
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    return srv, thread, f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"


class _Fatal(BaseException):
    """Not an Exception: what the step loop cannot recover from."""


def test_a_dead_engine_is_unhealthy_and_fails_requests_at_once(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    engine = AsyncEngine.launch(lambda: LLMEngine.from_args(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False))
    srv, thread, url = _serve(engine)
    try:
        assert httpx.get(url + "/health", timeout=10).status_code == 200

        async def stream_then_kill() -> BaseException | None:
            outs = engine.generate([5, 6, 7], SamplingParams(max_tokens=500, ignore_eos=True, temperature=0))
            await anext(outs)  # a request is running when the engine dies

            def kill() -> None:
                raise _Fatal("worker gone")

            with pytest.raises(EngineDeadError):
                await engine.call(kill)
            try:
                async for _ in outs:
                    pass
            except EngineDeadError as e:
                return e
            return None

        assert isinstance(asyncio.run(stream_then_kill()), EngineDeadError)  # the open stream ended, not hung
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and "worker gone" in health.json()["error"]
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503 and "not running" in r.json()["error"]["message"]
        assert engine.stats.dead is not None and not engine.is_running
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()
