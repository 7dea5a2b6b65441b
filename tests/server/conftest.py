"""The real server on a loopback port (uvicorn in a thread, our connection protocol), shared per test module."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app
from inflight.server.config import ServerConfig
from inflight.server.serve import uvicorn_config


@dataclass
class Server:
    url: str
    engine: AsyncEngine

    def wait_idle(self, timeout: float = 5.0) -> None:
        deadline = time.time() + timeout
        while self.engine.engine.has_unfinished_requests() and time.time() < deadline:
            time.sleep(0.01)
        assert not self.engine.engine.has_unfinished_requests()
        self.engine.engine.kv.pool.check_idle()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    engine = AsyncEngine(LLMEngine.from_args(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", progress=False))
    port = _free_port()
    srv = uvicorn.Server(uvicorn_config(build_app(engine, "tiny"), ServerConfig(), port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield Server(f"http://127.0.0.1:{port}", engine)
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


@pytest.fixture()
def app_with(server):  # type: ignore[no-untyped-def]
    """Start another app over the same engine with a given ServerConfig."""
    started: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(config: ServerConfig) -> str:
        srv = uvicorn.Server(uvicorn_config(build_app(server.engine, config), config, log_level="warning"))
        t = threading.Thread(target=srv.run, daemon=True)
        t.start()
        while not srv.started:
            time.sleep(0.05)
        started.append((srv, t))
        return f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"

    yield start
    for srv, t in started:
        srv.should_exit = True
        t.join(timeout=10)


@pytest.fixture(scope="session")
def reasoning_server(tmp_path_factory) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    """The scripted reasoning model (inflight/testing/reasoning.py: greedy output is
    `<think>THINKING</think>ANSWER`) behind two API keys, "key-a" and "key-b"; the qwen3 parser is
    detected from its template. Shared by the reasoning, Responses and Messages API tests."""
    from inflight.testing.reasoning import make_scripted_reasoning_checkpoint

    path = make_scripted_reasoning_checkpoint(tmp_path_factory.mktemp("reasoning_model"))
    engine = AsyncEngine(LLMEngine.from_args(str(path), dtype="float32", device="cpu", progress=False))
    config = ServerConfig(served_model_names=("tiny",), api_keys=("key-a", "key-b"))
    srv = uvicorn.Server(uvicorn_config(build_app(engine, config), config, port=_free_port(), log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    yield Server(f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}", engine)
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()
