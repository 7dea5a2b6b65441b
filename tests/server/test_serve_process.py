"""`inflight serve` as a process: start-up checks before the model loads (one line, exit 2),
and the SIGTERM drain with a deadline, with real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inflight import cli


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def _truncated_gguf(tmp_path: Path) -> Path:
    from inflight.testing.gguf import make_tiny_gguf

    path = make_tiny_gguf(tmp_path / "cut.gguf")
    path.write_bytes(path.read_bytes()[:-1000])
    return path


def test_startup_problems_are_one_line_and_exit_2(tiny_model_dir, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    model = str(tiny_model_dir("qwen2"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    bad_type = tmp_path / "c.json"
    bad_type.write_text(json.dumps({"max_num_seqs": "64"}))
    cases: list[tuple[list[str], str]] = [
        (["--model", model, "--port", str(busy.getsockname()[1])], "is already in use"),
        (["--model", model, "--ssl-certfile", str(tmp_path / "nope.pem")], "nope.pem does not exist"),
        (["--model", str(tmp_path / "no-model")], "no-model is not a directory"),
        (["--model", str(tmp_path / "nope.gguf")], "nope.gguf does not exist"),
        (["--model", str(_truncated_gguf(tmp_path))], "cut.gguf is not a readable GGUF file: tensor 'output_norm.weight' ends at byte"),
        (["--model", model, "--config", str(bad_type)], 'max_num_seqs: expected an integer, got "64"'),
        (["--model", model, "--max-seq-len", "0"], "max_model_len: must be at least 1"),
        (["--model", model, "--timeout-body", "0"], "timeout_body: must be more than 0"),
        (["--model", model, "--block-size", "48"], "block_size: must be a power of two"),
    ]
    import torch

    from inflight.config import gpu_driver_present

    if not gpu_driver_present():  # told before torch loads (tests/e2e/test_cli_imports.py)
        cases.append((["--model", model, "--device", "cuda"], "device: 'cuda', but this machine has no GPU driver"))
    elif not torch.cuda.is_available():  # a driver, but a CPU-only torch
        cases.append((["--model", model, "--device", "cuda"], "CUDA is not available"))
    capsys.readouterr()  # the fixture's checkpoint-writing progress
    try:
        for argv, expected in cases:
            t0 = time.monotonic()
            with pytest.raises(SystemExit) as e:
                cli.main(["serve", *argv])
            err = capsys.readouterr().err.strip()
            assert e.value.code == 2 and expected in err and "\n" not in err, (argv, err)
            assert time.monotonic() - t0 < 5, argv  # before any weights load
    finally:
        busy.close()


class _Stream(threading.Thread):
    """Reads one SSE stream to its end in the background; `events` are the parsed data lines."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.events: list[Any] = []
        self.times: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        data = line[5:].strip()
                        self.events.append(data if data == "[DONE]" else json.loads(data))
                        self.times.append(time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def _start(model: str, port: int, log: Path, *flags: str) -> subprocess.Popen:  # type: ignore[type-arg]
    proc = subprocess.Popen([sys.executable, "-m", "inflight.cli", "serve", "--model", model, "--dtype", "float32", "--num-kv-blocks", "1100", "--port", str(port), *flags],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise AssertionError(log.read_text())
    proc.kill()
    raise AssertionError("server did not start:\n" + log.read_text()[-3000:])


def _wait_for(cond, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline
        time.sleep(0.02)


def test_sigterm_drains_then_aborts_at_the_deadline(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = str(tiny_model_dir("qwen2", max_position_embeddings=16384))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(model, port, tmp_path / "serve.log", "--shutdown-timeout", "4")
    try:
        long = {"max_tokens": 16000, "ignore_eos": True, "temperature": 0, "stream": True}
        openai = _Stream(url + "/v1/completions", {"prompt": "a long story", **long})
        triton = _Stream(url + "/v2/models/" + Path(model).name + "/generate_stream",
                         {"text_input": "another", "parameters": {"max_new_tokens": 16000, "ignore_eos": True, "temperature": 0}})  # fmt: skip
        short = _Stream(url + "/v1/completions", {"prompt": "short", "max_tokens": 8, "ignore_eos": True, "temperature": 0, "stream": True})
        for s in (openai, triton, short):
            s.start()
        _wait_for(lambda: all(len(s.events) >= 2 for s in (openai, triton, short)))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _wait_for(lambda: httpx.get(url + "/health/ready", timeout=5).status_code == 503, timeout=2)
        refused = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] and refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(url + "/health", timeout=5).status_code == 200  # alive while draining
        for s in (openai, triton, short):
            s.join(timeout=30)
            assert s.error is None and not s.is_alive(), s.error
        assert proc.wait(timeout=30) == 0
        # the short request ran to its end; the long ones ran on until the deadline, then ended cleanly
        assert short.events[-1] == "[DONE]" and short.events[-2]["choices"][0]["finish_reason"] == "length"
        assert "finish_detail" not in short.events[-2]["choices"][0]
        assert openai.events[-1] == "[DONE]"
        final = openai.events[-2]["choices"][0]
        assert final["finish_reason"] == "length" and final["finish_detail"] == "abort"
        assert triton.events[-1]["details"]["finish_reason"] == "abort"
        assert any(t > t0 + 2 for t in openai.times[:-2])  # tokens kept coming during the drain
        assert openai.times[-1] - t0 < 4 + 5
    finally:
        proc.kill()
        proc.wait()


def test_second_signal_exits_at_once(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = str(tiny_model_dir("qwen2", max_position_embeddings=16384))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(model, port, tmp_path / "serve.log", "--shutdown-timeout", "120")
    try:
        stream = _Stream(url + "/v1/completions", {"prompt": "x", "max_tokens": 16000, "ignore_eos": True, "stream": True})
        stream.start()
        _wait_for(lambda: len(stream.events) >= 2)
        proc.send_signal(signal.SIGINT)
        _wait_for(lambda: httpx.get(url + "/health/ready", timeout=5).status_code == 503, timeout=2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) != 0 and time.monotonic() - t0 < 3
    finally:
        proc.kill()
        proc.wait()
