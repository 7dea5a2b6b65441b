"""`inflight serve --tensor-parallel-size 2` across two "nodes" on loopback: node 0 runs the front
end and rank 0, node 1 (`--node-rank 1`, no front end) runs rank 1; they meet at rank 0's port.
A streamed chat equals the single-process server's answer; a rank killed mid-stream ends the
stream with an error and turns /health unhealthy within seconds instead of hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from inflight.worker.distributed import free_port

MESSAGES = [{"role": "user", "content": "Tell me about the sea"}]


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "INFLIGHT_THREADS_PER_RANK": "1",
    }  # two "nodes", 2 cores
    return subprocess.Popen([sys.executable, "-m", "inflight", "serve", *args], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, env=env)  # fmt: skip


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def two_nodes(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    path = str(tiny_model_dir("qwen2"))
    logs = tmp_path_factory.mktemp("tp_serve")
    port, master = free_port(), free_port()
    common = ["--model", path, "--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "64",
              "--tensor-parallel-size", "2", "--nnodes", "2", "--master-port", str(master)]  # fmt: skip
    node1 = _start([*common, "--node-rank", "1"], logs / "node1.log")
    node0 = _start(
        [*common, "--node-rank", "0", "--port", str(port), "--served-model-name", "x"],
        logs / "node0.log",
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert node0.poll() is None, (logs / "node0.log").read_text()[-3000:]
        time.sleep(0.5)
    yield {"url": url, "node0": node0, "node1": node1, "logs": logs, "model": path}
    for proc in (node0, node1):
        proc.terminate()
    for proc in (node0, node1):
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_streamed_chat_at_tp2_then_a_killed_rank_fails_the_stream_and_health(
    two_nodes: dict,
) -> None:
    from inflight import LLM, SamplingParams

    client = openai.OpenAI(base_url=two_nodes["url"] + "/v1", api_key="x")
    # the same greedy answer as one process (the chat template applied by the engine's tokenizer)
    single = LLM(model=two_nodes["model"], dtype="float32", device="cpu", progress=False)
    want = (
        single.chat(MESSAGES, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    chunks = client.chat.completions.create(
        model="x", messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    log0 = (two_nodes["logs"] / "node0.log").read_text()
    assert (
        "tensor parallel rank 0 of 2: 1 threads" in log0 and "kernel: off (tensor parallel" in log0
    )
    assert "no front end on this node" in (two_nodes["logs"] / "node1.log").read_text()

    # kill node 1's rank in the middle of a long stream
    rank1 = _children(two_nodes["node1"].pid)
    assert len(rank1) == 1
    stream = client.chat.completions.create(
        model="x",
        messages=MESSAGES,
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    started, reasons, ended_by = time.time(), [], "finished"
    try:
        for i, chunk in enumerate(stream):
            if i == 2:
                os.kill(rank1[0], signal.SIGKILL)
            # an aborted request ends with length + finish_detail "abort" (OpenAI's values)
            reasons += [
                (c.model_extra or {}).get("finish_detail") for c in chunk.choices if c.finish_reason
            ]
            assert time.time() - started < 60
    except (openai.APIError, httpx.HTTPError) as e:  # the response cut off
        ended_by = type(e).__name__
    # failed, not completed: the engine aborted the request or the body was cut off
    assert reasons in (["abort"], []) and (reasons or ended_by != "finished"), (reasons, ended_by)
    deadline = time.time() + 10
    while (health := httpx.get(two_nodes["url"] + "/health", timeout=5)).status_code == 200:
        assert time.time() < deadline, "still healthy 10 s after a rank died"
        time.sleep(0.2)
    assert health.status_code == 503 and "model worker" in health.json()["error"]
    r = httpx.post(
        two_nodes["url"] + "/v1/completions",
        json={"model": "x", "prompt": "hi", "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 503
    assert two_nodes["node1"].wait(timeout=20) != 0  # node 1 went down with its rank


def test_torchrun_starts_the_same_server(
    tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """`torchrun --nproc-per-node 2 -m inflight serve`: RANK 0 serves (tensor_parallel_size from
    WORLD_SIZE), RANK 1 is a rank; greedy tokens equal one process's."""
    from inflight import LLM, SamplingParams

    path = str(tiny_model_dir("llama"))
    port = free_port()
    log = tmp_path / "torchrun.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "inflight", "serve", "--model", path, "--device", "cpu", "--dtype", "float32",
           "--num-kv-blocks", "32", "--port", str(port), "--served-model-name", "x"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        body = {"model": "x", "prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0}
        got = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0][
            "text"
        ]
        single = LLM(model=path, dtype="float32", device="cpu", progress=False)
        want = single.generate(
            [[5, 6, 7, 8]], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False
        )
        assert got == want[0].outputs[0].text
        assert "tensor parallel rank 1 of 2 joined" in log.read_text()
    finally:
        proc.send_signal(
            signal.SIGTERM
        )  # torchrun stops every rank; the front end's worker follows
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
