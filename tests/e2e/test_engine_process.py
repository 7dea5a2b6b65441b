"""`inflight serve --engine-process`: the engine (scheduler, outputs, the model) in a process of its
own, apart from the HTTP event loop (engine/core_process.py). The real CLI server on loopback and
the official `openai` client: streams match the offline engine, a stream closed early frees its
blocks, a killed engine process ends the streams with an error and turns /health to 503, what it
does not serve yet is refused at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_served_mp import check_streams_and_hang_up, serve_cli

openai = pytest.importorskip("openai")


def _core_pid(server_pid: int) -> int:
    """The engine process: the server's child running inflight.engine.core_process."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == server_pid and b"inflight.engine.core_process" in cmdline:
            return int(stat.parent.name)
    raise AssertionError("no engine process under the server")


def test_served_through_an_engine_process_and_its_death(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base = tiny_model_dir("qwen2")
    with serve_cli(base, tmp_path / "server.log", "--engine-process") as (url, proc):
        core = _core_pid(proc.pid)
        check_streams_and_hang_up(url, base)
        steps = httpx.get(url + "/metrics", timeout=10).text
        assert "inflight_engine_steps_total" in steps and "inflight_engine_steps_total 0.0" not in steps
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        stream = client.completions.create(model="tiny", prompt="on and on", max_tokens=4000, stream=True,
                                           extra_body={"ignore_eos": True})  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        os.kill(core, signal.SIGKILL)
        with pytest.raises(Exception) as ended:  # noqa: PT011 -- the error chunk or the cut stream
            for _ in chunks:
                pass
        assert "engine" in str(ended.value)
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and "engine process exited" in health.text
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503


def test_what_it_does_not_serve_yet_is_refused_at_start(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base = str(tiny_model_dir("qwen2"))
    done = subprocess.run([sys.executable, "-m", "inflight.cli", "serve", "--model", base, "--device", "cpu",
                           "--port", "0", "--engine-process", "--data-parallel-size", "2"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "--engine-process: not with LoRA adapters or data-parallel replicas" in done.stderr


def test_outputs_cross_as_what_grew_and_arrive_whole(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """engine/core_wire.py: every step's outputs, pickled through the encoder and rebuilt by the
    decoder, equal the engine's own (n = 2 siblings, logprobs, a stop string, a preempted request),
    and after the first output of a request, what crosses no longer grows with its length."""
    import pickle

    from inflight import SamplingParams
    from inflight.engine.core_wire import Decoder, Encoder
    from inflight.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_args(str(tiny_model_dir("qwen2")), device="cpu", dtype="float32", num_kv_blocks=12,
                                 max_num_seqs=4, progress=False)  # fmt: skip
    params = [SamplingParams(max_tokens=40, temperature=0.8, seed=1, n=2, logprobs=2, ignore_eos=True),
              SamplingParams(max_tokens=60, temperature=0.0, stop=["e"], ignore_eos=True),
              SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)]  # fmt: skip
    for i, p in enumerate(params):
        engine.add_request(engine.make_request(f"prompt number {i} " * 3, p, request_id=str(i)))
    enc, dec, sizes = Encoder(), Decoder(), {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            raw = pickle.dumps(enc.encode(out))
            sizes.setdefault(out.request_id, []).append(len(raw))
            got = dec.decode(pickle.loads(raw))
            for a, b in zip(got.outputs, out.outputs, strict=True):
                assert (a.text, a.token_ids, a.logprobs, a.delta_text, a.delta_token_ids, a.finish_reason) == (
                    b.text, b.token_ids, b.logprobs, b.delta_text, b.delta_token_ids, b.finish_reason)  # fmt: skip
            assert (got.finished, got.serial, got.prompt_token_ids, got.metrics.token_times) == (
                out.finished, out.serial, out.prompt_token_ids, out.metrics.token_times)  # fmt: skip
    assert engine.scheduler.num_preemptions > 0 and not enc.sent and not dec.state
    long = sizes["2"]  # 60 tokens: the whole output at the end would be several times the second
    assert len(long) > 30 and max(long[1:-1]) <= 1.5 * long[1]
