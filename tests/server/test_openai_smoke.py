"""The real server on a loopback port, driven by the official openai client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import uvicorn

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir) -> Iterator[tuple[str, AsyncEngine]]:  # type: ignore[no-untyped-def]
    path: Path = tiny_model_dir("qwen2")
    engine = AsyncEngine(LLMEngine.from_args(str(path), dtype="float32", device="cpu", progress=False))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", engine
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def _client(server) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server[0], api_key="unused")


def test_completion_and_stream_agree(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    full = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason in ("length", "stop")
    assert full.usage.completion_tokens >= 1
    pieces = client.completions.create(
        model="tiny", prompt="the quick brown fox", max_tokens=12, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in pieces)
    assert text == full.choices[0].text


def test_chat_stream_role_first_and_finish_last(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    messages = [{"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content


def test_bad_field_is_400_naming_it(server) -> None:  # type: ignore[no-untyped-def]
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=-1)
    assert e.value.body["param"] == "temperature"
    # the engine still serves afterwards, and nothing leaked
    ok = client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1
    deadline = time.time() + 5
    while server[1].engine.has_unfinished_requests() and time.time() < deadline:
        time.sleep(0.02)
    server[1].engine.kv.pool.check_idle()
