"""A new user's first ten minutes, on whatever CPU runs the suite: `inflight serve` with no
arguments serves the bundled demo model with every feature on: chat, tool calls (the hermes
parser picked from its chat template), decoder embeddings, structured output; and every fenced
block of README.md runs against it, in order (docs/DEVELOPMENT.md says how). One server process
for the module; only the port is given, so parallel runs never collide on 8000.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inflight.testing.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
_MARK = re.compile(r"<!-- docs-test: (\w+) -->\s*$")


def readme_blocks() -> list[tuple[str, str, str | None]]:
    """(language, code, marker) of every fenced block of README.md, in order; the marker is the
    `<!-- docs-test: X -->` comment on the line just above the block, if any."""
    blocks, lines = [], (ROOT / "README.md").read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, end = lines[i][3:].strip(), lines.index("```", i + 1)
            mark = _MARK.match(lines[i - 1]) if i else None
            blocks.append((lang, "\n".join(lines[i + 1 : end]), mark.group(1) if mark else None))
            i = end
        i += 1
    return blocks


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
        wait_healthy(proc, server.url, log)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _client(demo: DemoServer):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{demo.url}/v1", api_key="none", timeout=300)


def test_links_of_the_readme_and_docs_resolve() -> None:
    """Every relative link of README.md and docs/*.md names a file that exists (the README points
    into docs/ for everything it no longer says)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / path).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken


def test_the_wheel_ships_every_c_source() -> None:
    """Every file the C kernels compile from (inflight/csrc/*.c and the headers they include) matches
    pyproject's package data: a non-editable install once shipped the .c files without their .h."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["inflight"]
    sources = sorted(p.relative_to(ROOT / "inflight").as_posix() for p in (ROOT / "inflight" / "csrc").iterdir())
    missing = [s for s in sources if not any(fnmatch.fnmatch(s, pat) for pat in patterns)]
    assert sources and not missing, missing


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


def _curl_with_httpx(command: str) -> None:
    args = shlex.split(command.replace("\\\n", " "))
    url = next(a for a in args if a.startswith("http"))
    body = args[args.index("-d") + 1]
    r = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=300)
    assert r.status_code == 200, r.text


def test_readme_runs_as_written(demo: DemoServer, tmp_path: Path) -> None:
    """Every block of README.md, in order, against the demo server: 127.0.0.1:8000 is its port,
    /tmp/ a fresh directory. Marked blocks are checked, not run: the serve block is the command
    the fixture runs (plus --port), the skipped one is .ci/run's command."""
    blocks = readme_blocks()
    marks = [m for _, _, m in blocks if m]
    assert marks == ["serve", "skip"], marks  # sparingly: everything else runs
    assert len((ROOT / "README.md").read_text().splitlines()) < 250
    namespace: dict[str, object] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}

    def here(code: str) -> str:
        return code.replace("127.0.0.1:8000", f"127.0.0.1:{demo.port}").replace("/tmp/", f"{tmp_path}/")

    for lang, code, mark in blocks:
        if mark == "serve":  # install, then exactly `inflight serve` (what the fixture started)
            install, serve = code.split(" && ")
            assert serve == "inflight serve" and install.startswith("pip install -e '.[bench]'"), code
            assert "bench = [" in (ROOT / "pyproject.toml").read_text()
        elif mark == "skip":
            ci = (ROOT / ".ci" / "run").read_text()
            assert code in ci, f"the README's test command is not .ci/run's: {code}"
        elif lang == "bash":
            if code.startswith("curl") and shutil.which("curl") is None:  # a slim image: the same request
                _curl_with_httpx(here(code))
                continue
            commands = here(code).replace("python ", f"{shlex.quote(sys.executable)} ", 1)
            commands = re.sub(r"^inflight ", f"{shlex.quote(sys.executable)} -m inflight ", commands, flags=re.M)
            r = subprocess.run(["bash", "-ec", commands], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"{code}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        else:
            assert lang == "python", lang
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(here(code), "README.md", "exec"), namespace)  # noqa: S102 - the README is ours
            assert out.getvalue().strip(), f"printed nothing:\n{code}"
    assert (tmp_path / "bench.png").stat().st_size > 1000 and (tmp_path / "my-lora" / "adapter_config.json").is_file()
