"""A new user's first ten minutes, on whatever CPU runs the suite: `inflight serve` with no
arguments serves the bundled demo model with every feature on: chat, tool calls (the hermes
parser picked from its chat template), decoder embeddings, structured output. One server process
for the module; only the port is given, so parallel runs never collide on 8000.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


class DemoServer:
    def __init__(self, port: int, log: Path, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
        self.port, self.log, self.proc = port, log, proc
        self.url = f"http://127.0.0.1:{port}"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    port, log = _port(), tmp_path_factory.mktemp("quickstart") / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "inflight", "serve", "--port", str(port)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)  # fmt: skip
    server = DemoServer(port, log, proc)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "no /health within 180 s:\n" + log.read_text()[-3000:]
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _client(demo: DemoServer):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{demo.url}/v1", api_key="none", timeout=300)


def test_chat_and_a_start_up_log_said_once(demo: DemoServer) -> None:
    body = {"model": "demo_model", "messages": [{"role": "user", "content": "Hello! What is your name?"}],
            "max_tokens": 40, "temperature": 0}  # fmt: skip
    r = httpx.post(f"{demo.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"].strip() and choice["finish_reason"] in ("stop", "length")
    text = demo.log.read_text()
    line = next((ln for ln in text.splitlines() if "| kernel: " in ln), "")
    assert "cpu: " in line and "| bf16: " in line and "| dtype: " in line, text[-3000:]
    assert "tool calls: hermes (picked from the chat template" in text, text[-3000:]
    said = [re.sub(r"^[\d-]+ [\d:,]+ ", "", ln) for ln in text.splitlines() if " INFO " in ln or " WARNING " in ln]
    assert len(said) == len(set(said)), f"a start-up line printed twice: {said}"


def test_demo_calls_tools(demo: DemoServer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}}, "required": ["city"]}}}]
    r = _client(demo).chat.completions.create(
        model="demo_model", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools, tool_choice="required")  # fmt: skip
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert call.function.arguments in ('{"city": "Paris"}', '{"city": "Tokyo"}')


def test_demo_embeds_with_the_decoder(demo: DemoServer) -> None:
    out = _client(demo).embeddings.create(model="demo_model", input=["a cat", "a dog"])
    vectors = [d.embedding for d in out.data]
    assert len(vectors) == 2 and len(vectors[0]) == 256  # the demo model's hidden size
    assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-3 and vectors[0] != vectors[1]


def test_demo_parses_into_a_pydantic_model(demo: DemoServer) -> None:
    from pydantic import BaseModel, Field

    class Pet(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=30)

    r = _client(demo).chat.completions.parse(
        model="demo_model", messages=[{"role": "user", "content": "Tell me about a pet."}], response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and len(pet.name) <= 12 and 0 <= pet.age <= 30
