"""`inflight bench` end to end: the real server on a loopback port, each backend, offline, failures."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from inflight.cli import main
from inflight.engine.async_engine import AsyncEngine
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 6, 16, 8
LATENCY_KEYS = ("ttft", "tpot", "itl", "e2el")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return tiny_model_dir("qwen2")


@pytest.fixture(scope="module")
def server_url(model_dir: Path) -> Iterator[str]:
    """As tests/server/conftest.py: uvicorn in a thread over a tiny engine served as "tiny"."""
    engine = AsyncEngine(
        LLMEngine.from_args(str(model_dir), dtype="float32", device="cpu", progress=False)
    )
    port = _free_port()
    srv = uvicorn.Server(
        uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)
    engine.shutdown()


def _bench(model_dir: Path, out: Path, *args: str) -> dict[str, Any]:
    main([
        "bench", "--model", str(model_dir), "--served-model-name", "tiny", "--num-prompts", str(NUM_PROMPTS),
        "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--disable-tqdm",
        "--result-json", str(out), *args,
    ])  # fmt: skip
    return json.loads(out.read_text())


def _check_sane(report: dict[str, Any]) -> None:
    m = report["metrics"]
    assert m["completed"] == NUM_PROMPTS and m["failed"] == 0
    assert (
        m["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    )  # ignore_eos: exactly max_tokens each
    assert m["num_output_len_mismatch"] == 0
    assert m["duration_s"] > 0
    assert m["request_throughput"] > 0 and m["output_throughput"] > 0
    assert m["total_token_throughput"] > m["output_throughput"]
    assert m["mean_ttft_ms"] > 0
    for key in LATENCY_KEYS:
        assert 0 < m[f"median_{key}_ms"] <= m[f"p90_{key}_ms"] <= m[f"p99_{key}_ms"], key
    assert m["mean_e2el_ms"] >= m["mean_ttft_ms"]
    requests = report["requests"]
    assert len(requests) == NUM_PROMPTS and all(r["success"] for r in requests)
    # one streamed chunk per token, and one inter-token gap between consecutive chunks
    assert all(len(r["itl_s"]) == OUTPUT_LEN - 1 for r in requests)
    assert all(r["prompt_len"] == INPUT_LEN for r in requests)


@pytest.mark.parametrize(
    ("backend", "extra"),
    [
        ("completions", []),
        ("chat", ["--max-concurrency", "2", "--request-rate", "200"]),
        ("generate", []),
    ],
)
def test_backend(
    backend: str, extra: list[str], server_url: str, model_dir: Path, tmp_path: Path
) -> None:
    plot = tmp_path / "bench.png"
    args = ["--backend", backend, "--base-url", server_url, *extra]
    if backend == "completions":
        args += ["--plot", str(plot)]
    report = _bench(model_dir, tmp_path / "r.json", *args)
    _check_sane(report)
    requests = report["requests"]
    assert all(r["output_tokens_source"] == "server" for r in requests)
    if backend == "completions":  # the synthetic prompts are token-exact for the server too
        assert all(r["server_prompt_tokens"] == INPUT_LEN for r in requests)
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000
    if backend == "chat":
        assert report["metrics"]["peak_concurrent_requests"] <= 2
        # the chat template adds its own tokens around the message
        assert all(r["server_prompt_tokens"] > INPUT_LEN for r in requests)


def test_offline(model_dir: Path, tmp_path: Path) -> None:
    plot = tmp_path / "offline.png"
    args = [*"--offline --dtype float32 --device cpu --num-warmups 1".split(), "--plot", str(plot)]
    report = _bench(model_dir, tmp_path / "r.json", *args)
    _check_sane(report)
    assert report["config"]["backend"] == "offline"
    assert all(
        r["output_tokens_source"] == "engine" and r["server_prompt_tokens"] == INPUT_LEN
        for r in report["requests"]
    )
    assert plot.stat().st_size > 1000


def test_jsonl_dataset(server_url: str, model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        '{"prompt": "Hello! What is your name?", "output_len": 3}\n\n{"prompt": "Tell me a story"}\n'
    )
    args = ["--backend", "generate", "--base-url", server_url, "--dataset", "jsonl"]
    args += ["--dataset-path", str(data)]
    report = _bench(model_dir, tmp_path / "r.json", *args)
    m = report["metrics"]
    assert m["completed"] == 2 and m["failed"] == 0  # the file holds 2 of the 6 asked for
    assert report["config"]["ignore_eos"] is False
    assert [r["output_len"] for r in report["requests"]] == [3, OUTPUT_LEN]
    assert all(1 <= r["output_tokens"] <= r["output_len"] for r in report["requests"])


@pytest.mark.parametrize("failure", ["wrong_port", "wrong_model"])
def test_failures_are_reported(
    failure: str, server_url: str, model_dir: Path, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{_free_port()}" if failure == "wrong_port" else server_url
    args = ["--base-url", url, "--backend", "generate", "--plot", str(tmp_path / "p.png")]
    if failure == "wrong_model":
        args += ["--served-model-name", "nope"]  # the later flag wins
    report = _bench(model_dir, tmp_path / "r.json", *args)
    m = report["metrics"]
    assert m["completed"] == 0 and m["failed"] == NUM_PROMPTS
    assert m["total_output_tokens"] == 0 and m["mean_ttft_ms"] is None
    expected = "ConnectError" if failure == "wrong_port" else "HTTP 404"
    errors = {r["error"] for r in report["requests"]}
    assert all(expected in e for e in errors), errors
