"""The served path with `num_scheduler_steps` 4 (docs/MULTISTEP.md), through the official
`openai` client: a streamed completion gets each step's tokens as one chunk and the same text
and usage as one pass a step (the module's `server`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest
import uvicorn

from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app
from inflight.server.config import ServerConfig
from inflight.server.serve import uvicorn_config


@pytest.fixture(scope="module")
def multistep_url(tiny_model_dir) -> Iterator[tuple[str, AsyncEngine]]:  # type: ignore[no-untyped-def]
    engine = AsyncEngine(LLMEngine.from_args(str(tiny_model_dir("qwen2")), dtype="float32", device="cpu", num_scheduler_steps=4,
                                             progress=False))  # fmt: skip
    srv = uvicorn.Server(uvicorn_config(build_app(engine, "tiny"), ServerConfig(), port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}", engine
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def test_streamed_steps_carry_several_tokens(multistep_url, server) -> None:  # type: ignore[no-untyped-def]
    url, engine = multistep_url
    multi = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    single = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    kw = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 14, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    ref = single.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(multi.completions.create(stream=True, stream_options={"include_usage": True}, **kw))  # type: ignore[call-overload]
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == ref.choices[0].text
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens == 14
    assert len([t for t in texts if t]) <= 1 + 14 // 4 + 1  # the prompt's token, then a chunk per 4-token step
    assert engine.engine.scheduler.num_preemptions == 0
    engine.engine.kv.pool.check_idle()
