"""A new user's first command, on whatever CPU runs the suite: `python -m inflight serve` with no
model arguments serves the bundled demo model and answers a chat request (README quickstart), and
the server's log names the CPU paths it chose. Only the port is given, so parallel runs never
collide on 8000.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_with_no_model_answers_a_chat(tmp_path: Path) -> None:
    port, log = _port(), tmp_path / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "inflight", "serve", "--port", str(port)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "no /health within 120 s:\n" + log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        body = {"model": "demo_model", "messages": [{"role": "user", "content": "Hello! What is your name?"}],
                "max_tokens": 40, "temperature": 0}  # fmt: skip
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"].strip() and choice["finish_reason"] in ("stop", "length")
        text = log.read_text()
        line = next((ln for ln in text.splitlines() if "| kernel: " in ln), "")
        assert "cpu: " in line and "| bf16: " in line and "| dtype: " in line, text[-3000:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
