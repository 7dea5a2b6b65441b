"""`inflight serve` with the model in a worker process (`--distributed-executor-backend mp`, what
`auto` picks on CUDA: EngineArgs.serving_backend): the real CLI server on loopback, the official
`openai` client. Streams match the offline engine token for token (the offline path is anchored
to HF elsewhere), a stream closed early frees its KV blocks, adapters load and unload at run time
(anchored to the same adapter served offline), /metrics and /health answer."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inflight import LLM, SamplingParams
from inflight.engine.args import EngineArgs
from inflight.testing import make_peft_lora
from inflight.testing.servers import wait_healthy

openai = pytest.importorskip("openai")
pytest.importorskip("peft")

PROMPTS = ["Hello there", "The capital of", "1 2 3"]


def test_auto_is_mp_when_serving_on_cuda_and_uni_otherwise(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    auto = EngineArgs()
    assert auto.distributed_executor_backend == "auto"
    assert (auto.serving_backend("cuda"), auto.serving_backend("cpu")) == ("mp", "uni")
    assert EngineArgs(distributed_executor_backend="uni").serving_backend("cuda") == "uni"  # a given value wins
    assert EngineArgs(distributed_executor_backend="mp").serving_backend("cpu") == "mp"
    assert EngineArgs(tensor_parallel_size=2).serving_backend("cuda") == "uni"  # one worker per rank anyway
    offline = EngineArgs(model=str(tiny_model_dir("qwen2")), device="cpu").create_engine_config()
    assert offline.distributed_executor_backend == "uni"  # LLM(...): the model in its own thread


@contextlib.contextmanager
def serve_cli(base: Path, log: Path, *flags: str) -> Iterator[tuple[str, subprocess.Popen]]:  # type: ignore[type-arg]
    """`inflight serve` (float32 on CPU, 64 KV blocks, model name "tiny") on a free loopback port
    with `flags`: (its URL, its process) once /health answers."""
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", str(base), "--device", "cpu", "--dtype", "float32",
           "--port", str(port), "--num-kv-blocks", "64", "--served-model-name", "tiny", "--log-level", "warning", *flags]  # fmt: skip
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[dict]:  # type: ignore[no-untyped-def,type-arg]
    base = tiny_model_dir("qwen2")
    root = tmp_path_factory.mktemp("served_mp")
    adapter = make_peft_lora(base, root / "a", seed=1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    flags = ("--distributed-executor-backend", "mp", "--enable-lora", "--lora-root", str(root))
    with serve_cli(base, root / "server.log", *flags) as (url, proc):
        yield {"url": url, "base": base, "adapter": adapter, "proc": proc}


def _offline(base: Path, lora: Path | None = None) -> list[str]:
    kw = {"enable_lora": True} if lora is not None else {}
    llm = LLM(model=str(base), device="cpu", dtype="float32", num_kv_blocks=64, progress=False, **kw)
    if lora is not None:
        llm.load_lora_adapter("a", str(lora))
    prompts = [{"prompt": p} | ({"lora_name": "a"} if lora is not None else {}) for p in PROMPTS]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


def _streamed(client, model: str) -> list[str]:  # type: ignore[no-untyped-def]
    texts = []
    for prompt in PROMPTS:
        chunks = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})  # fmt: skip
        texts.append("".join(c.choices[0].text for c in chunks))
    return texts


def _gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def check_streams_and_hang_up(url: str, base: Path) -> None:
    """Streams through the official client match offline; a stream closed early frees its blocks."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    assert _streamed(client, "tiny") == _offline(base)
    stream = client.completions.create(model="tiny", prompt="a long one", max_tokens=2000, stream=True,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    next(iter(stream))
    stream.close()  # the client hangs up: the engine aborts the request
    deadline = time.time() + 30
    while _gauge(url, "inflight_kv_cache_usage_ratio") > 0 or _gauge(url, "inflight_requests_running") > 0:
        assert time.time() < deadline, "the aborted request still holds KV blocks"
        time.sleep(0.2)
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_streams_match_offline_and_a_closed_stream_frees_its_blocks(server) -> None:  # type: ignore[no-untyped-def]
    check_streams_and_hang_up(server["url"], server["base"])
    busy, idle = (_gauge(server["url"], f"inflight_model_worker_{k}_seconds_total") for k in ("busy", "idle"))
    assert busy > 0 and idle >= 0  # the worker's own step seconds, counted in that process


def test_adapters_load_and_unload_at_run_time(server) -> None:  # type: ignore[no-untyped-def]
    url = server["url"]
    r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(server["adapter"])}, timeout=60)
    assert r.status_code == 200, r.text
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    assert "a" in [m.id for m in client.models.list().data]
    with_adapter = _streamed(client, "a")
    assert with_adapter == _offline(server["base"], server["adapter"])
    assert with_adapter != _streamed(client, "tiny")
    assert httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "a"}, timeout=60).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="a", prompt="x", max_tokens=2)
