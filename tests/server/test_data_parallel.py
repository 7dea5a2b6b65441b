"""--data-parallel-size: two engine replicas (each in its own worker process) behind one server.
The router sends new prompts to the less loaded replica, a repeated prompt to the replica that
cached it (visible per replica in /metrics), and /metrics carries each replica and the sum."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from inflight.cli import _replica_args
from inflight.engine.args import EngineArgs
from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.router import ReplicaRouter
from inflight.server.app import build_app

LONG_A = list(range(10, 60))  # 50 tokens: 3 full blocks of 16
LONG_B = list(range(100, 150))


@pytest.fixture(scope="module")
def served(tiny_model_dir: Callable[..., Path]) -> Iterator[tuple[str, ReplicaRouter]]:
    args = EngineArgs(model=str(tiny_model_dir("llama")), dtype="float32", device="cpu", num_kv_blocks=32,
                      data_parallel_size=2)  # fmt: skip
    replicas = [
        AsyncEngine.launch(lambda a=a: LLMEngine.from_engine_args(a, progress=False))
        for a in _replica_args(args)
    ]
    router = ReplicaRouter.of(replicas)
    server = uvicorn.Server(
        uvicorn.Config(build_app(router, "tiny"), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", router
    server.should_exit = True
    thread.join(timeout=10)
    router.shutdown()


def _metric(url: str, name: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["replica"]: s.value for s in family.samples}
    raise AssertionError(f"{name} not in /metrics")


def _complete(url: str, prompt: list[int]) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_replicas_share_the_load_and_a_repeat_goes_where_its_prefix_is(
    served: tuple[str, ReplicaRouter],
) -> None:
    url, router = served
    assert all(
        r.engine.runner is None for r in router.replicas
    )  # each replica's model in its own process
    first = _complete(url, LONG_A)
    _complete(url, LONG_B)
    assert router.routed == [1, 1]  # an idle pair: each new prompt to the replica that had fewer
    assert _metric(url, "inflight_prefix_cache_hit_rate") == {"0": 0.0, "1": 0.0, "all": 0.0}
    assert _complete(url, LONG_A) == first
    assert router.routed == [2, 1]  # the repeat went to replica 0, which holds its blocks
    hits = _metric(url, "inflight_prefix_cache_hit_rate")
    assert hits["0"] > 0 and hits["1"] == 0 and hits["all"] == pytest.approx(hits["0"] / 2)
    steps = _metric(url, "inflight_engine_steps")
    assert steps["0"] > 0 and steps["1"] > 0 and steps["all"] == steps["0"] + steps["1"]
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_replica_args_and_offline_refusal(tiny_model_dir: Callable[..., Path]) -> None:
    from inflight import LLM

    args = EngineArgs(model="/m", tensor_parallel_size=2, master_port=29500, data_parallel_size=2)
    assert [a.master_port for a in _replica_args(args)] == [
        29500,
        29501,
    ]  # one TP group per replica
    assert {
        a.distributed_executor_backend for a in _replica_args(EngineArgs(data_parallel_size=3))
    } == {"mp"}
    with pytest.raises(ValueError, match="data_parallel_size: replicas are served"):
        LLM(model=str(tiny_model_dir("llama")), data_parallel_size=2)
