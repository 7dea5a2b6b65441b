"""The "mp" executor: the model runner in its own worker process, reached only through the two
messages of outputs.py (and, through the same tests, `uni` with the runner on a thread of its own). Every feature that crosses the contract gives the tokens the in-thread
("uni") runner gives, the engine process never imports the model code, and a killed worker
fails the live requests and makes the server unhealthy instead of hanging."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from inflight import LLM, SamplingParams
from inflight.engine.async_engine import AsyncEngine, EngineDeadError
from inflight.engine.llm_engine import LLMEngine
from inflight.server.app import build_app

ARGS = {"dtype": "float32", "device": "cpu", "max_num_seqs": 8, "num_kv_blocks": 40, "progress": False}


@pytest.fixture(scope="module", params=["mp", "runner-thread"])
def engines(tiny_model_dir: Callable[..., Path], request: pytest.FixtureRequest) -> Iterator[tuple[LLM, LLM]]:
    """(uni, the pipelined engine): `mp`, or `uni` with the runner on its own thread (what a GPU
    gets by default: worker/executor.py), forced here on CPU."""
    path = str(tiny_model_dir("qwen2"))
    uni = LLM(model=path, **ARGS)
    if request.param == "mp":
        multi = LLM(model=path, distributed_executor_backend="mp", **ARGS)
        assert multi.engine.runner is None  # nothing of the model in this process's engine
    else:
        os.environ["INFLIGHT_RUNNER_THREAD"] = "1"
        try:
            multi = LLM(model=path, **ARGS)
        finally:
            del os.environ["INFLIGHT_RUNNER_THREAD"]
        assert multi.engine.executor.pipelined and not uni.engine.executor.pipelined
    yield uni, multi
    multi.engine.shutdown()


def _same(a: Any, b: Any) -> None:
    for x, y in zip(a, b):
        assert [o.token_ids for o in x.outputs] == [o.token_ids for o in y.outputs]
        assert [o.text for o in x.outputs] == [o.text for o in y.outputs]
        assert [o.cumulative_logprob for o in x.outputs] == pytest.approx([o.cumulative_logprob for o in y.outputs], abs=1e-5)


def _both(engines: tuple[LLM, LLM], prompts: list[Any], params: SamplingParams) -> tuple[list, list]:
    uni, multi = engines
    return uni.generate(prompts, params, use_tqdm=False), multi.generate(prompts, params, use_tqdm=False)


def test_chunked_prefill_preemption_seeded_n_and_logprobs(engines: tuple[LLM, LLM]) -> None:
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 9 * i))} for i in range(6)]  # > the 40-block pool
    params = SamplingParams(max_tokens=20, temperature=0.9, seed=7, n=2, logprobs=2, ignore_eos=True)
    a, b = _both(engines, prompts, params)
    _same(a, b)
    assert engines[1].engine.scheduler.num_preemptions > 0
    stats = engines[1].engine.stats()  # the worker's own clock: /metrics' inflight_model_worker_*_seconds
    if engines[1].engine.runner is None:  # mp (the runner thread has no worker process to time)
        assert stats.worker_busy_s > 0 and stats.worker_idle_s >= 0  # type: ignore[operator]
    assert engines[0].engine.stats().worker_busy_s is None  # no worker process: no such figures


def test_async_scheduling_stops_preemption_and_aborts_match_uni(engines: tuple[LLM, LLM]) -> None:
    """mp schedules step N+1 while the worker runs step N: requests that stop (stop token, stop
    string, max_tokens) or are preempted with a token in flight give uni's tokens, and an abort
    leaves the others untouched and the pool empty."""
    uni, multi = engines
    prompts = [{"prompt_token_ids": [(7 * i + j) % 90 + 3 for j in range(60 + 20 * i)]} for i in range(6)]  # > the pool
    free = [SamplingParams(max_tokens=8 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    ref = uni.generate(prompts, free, use_tqdm=False)
    stop_id = ref[1].outputs[0].token_ids[4]
    stop_text = ref[3].outputs[0].text[6:9]
    params = [
        SamplingParams(max_tokens=8 + 3 * i, temperature=0.0, stop_token_ids=[stop_id], stop=[stop_text] if stop_text.strip() else None)
        for i in range(6)
    ]
    ahead = multi.engine.num_steps_ahead
    a, b = _both(engines, prompts, params)
    _same(a, b)
    assert multi.engine.num_steps_ahead > ahead and multi.engine.scheduler.num_preemptions > 0
    assert b[1].outputs[0].token_ids[-1] == stop_id and b[1].outputs[0].finish_reason == "stop"
    assert [len(o.outputs[0].token_ids) for o in b] != [8 + 3 * i for i in range(6)]  # some stopped early

    # a sibling that stops early ran one more row: none of its logits or logprobs come back
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=1, n=2, ignore_eos=True)
    stop = uni.generate(prompts[:1], sampled, use_tqdm=False)[0].outputs[0].token_ids[3]
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=1, n=2, stop_token_ids=[stop], return_generation_logits=True, logprobs=1)
    (x,), (y,) = _both(engines, prompts[:1], sampled)
    _same([x], [y])
    assert [len(c.token_ids) for c in y.outputs][0] == 4
    for c in y.outputs:
        assert c.generation_logits.shape[0] == len(c.logprobs) == len(c.token_ids)

    engine = multi.engine
    reqs = [engine.make_request(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)) for p in prompts[:3]]
    for r in reqs:
        engine.add_request(r)
    done: dict[str, Any] = {}
    for i in range(200):
        if i == 6:
            engine.abort_request(reqs[1].request_id)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    assert done[reqs[1].request_id].outputs[0].finish_reason == "abort"
    want = uni.generate(prompts[:3], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True), use_tqdm=False)
    for k in (0, 2):
        assert done[reqs[k].request_id].outputs[0].token_ids == want[k].outputs[0].token_ids
    assert engine.kv.pool.usage == 0.0 and engine.loop._inflight is None


def test_a_large_step_sent_ahead_of_a_large_reply_does_not_deadlock(engines: tuple[LLM, LLM]) -> None:
    """Step N's reply (a prompt's context logits, ~1 MB) and step N+1 (sent before that reply is
    read: a request with a ~2.5 MB p-tuning table) each overfill the socket: the worker reads
    its calls as they arrive, so neither side blocks forever."""
    engine = engines[1].engine
    hidden, vocab = engine.config.model.hf_config["hidden_size"], engine.config.model.vocab_size
    first = engine.make_request({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=6, temperature=0.0))
    logits = engine.make_request(
        {"prompt_token_ids": [(7 * j) % 900 + 3 for j in range(300)]},
        SamplingParams(max_tokens=2, temperature=0.0, return_context_logits=True),
    )
    table = torch.randn(10_000, hidden, generator=torch.Generator().manual_seed(0))
    big = engine.make_request(
        {"prompt_token_ids": [vocab, vocab + 9_999, 5], "prompt_embedding_table": table}, SamplingParams(max_tokens=2, temperature=0.0)
    )
    done: dict[str, Any] = {}

    def drive() -> None:
        for req in (first, logits, big):  # each joins while the step before it is in flight
            engine.add_request(req)
            for out in engine.step():
                done[out.request_id] = out
        while engine.has_unfinished_requests():
            for out in engine.step():
                done[out.request_id] = out

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "engine and worker blocked on each other"
    assert done[logits.request_id].context_logits.shape == (300, vocab)
    assert len(done[big.request_id].outputs[0].token_ids) == 2 and engine.kv.pool.usage == 0.0


def test_beam_search_and_drafts(engines: tuple[LLM, LLM]) -> None:
    beams = SamplingParams(use_beam_search=True, beam_width=3, n=2, temperature=0.0, max_tokens=8)
    _same(*_both(engines, [{"prompt_token_ids": [5, 6, 7, 8]}], beams))
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = engines[0].generate([{"prompt_token_ids": [9, 10, 11]}], greedy, use_tqdm=False)[0].outputs[0].token_ids
    drafted = [{"prompt_token_ids": [9, 10, 11], "draft_input_ids": ref[:4] + [1, 2]}]
    a, b = _both(engines, drafted, greedy)
    _same(a, b)
    assert b[0].outputs[0].token_ids == ref
    assert b[0].metrics.num_accepted_draft_tokens == 4


def test_structured_output_ptuning_logits_and_pooling(engines: tuple[LLM, LLM]) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    json_params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, structured_outputs={"json": schema})
    ahead = engines[1].engine.num_steps_ahead
    a, b = _both(engines, ["give json", "json please", "an object"], json_params)  # the first completes: "stop"
    _same(a, b)
    assert all(o.outputs[0].text.startswith("{") for o in b)
    assert b[0].outputs[0].finish_reason == "stop" and b[0].outputs[0].text.endswith("}")  # grammar complete
    assert engines[1].engine.num_steps_ahead > ahead  # a grammar does not stop async scheduling

    vocab = engines[0].engine.config.model.vocab_size
    table = torch.randn(3, engines[0].engine.config.model.hf_config["hidden_size"], generator=torch.Generator().manual_seed(1))
    virtual = [{"prompt_token_ids": [vocab, vocab + 1, vocab + 2, 40, 41], "prompt_embedding_table": table}]
    _same(*_both(engines, virtual, SamplingParams(max_tokens=6, temperature=0.0)))

    logits = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2, return_context_logits=True, return_generation_logits=True)
    (x,), (y,) = _both(engines, [{"prompt_token_ids": list(range(20, 50))}], logits)
    _same([x], [y])
    torch.testing.assert_close(x.context_logits, y.context_logits)
    torch.testing.assert_close(x.outputs[0].generation_logits, y.outputs[0].generation_logits)
    assert [sorted(e) if e else e for e in x.prompt_logprobs] == [sorted(e) if e else e for e in y.prompt_logprobs]

    ea, eb = (llm.embed(["a sentence to pool"], pooling="mean")[0].outputs.embedding for llm in engines)
    assert ea == pytest.approx(eb, abs=1e-6)


def test_engine_process_never_imports_the_model(tiny_model_dir: Callable[..., Path]) -> None:
    code = (
        "import sys\n"
        "from inflight import LLM, SamplingParams\n"
        f"llm = LLM(model={str(tiny_model_dir('llama'))!r}, device='cpu', dtype='float32', distributed_executor_backend='mp', progress=False)\n"
        "out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)\n"
        "assert len(out[0].outputs[0].token_ids) == 3\n"
        "print(sorted(m for m in sys.modules if m.startswith(('inflight.models', 'inflight.worker.model_runner'))))\n"
        "del llm\n"  # dropped without shutdown(): the executor kills its worker, and says nothing of it
        "import gc, time\n"
        "gc.collect()\n"
        "time.sleep(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "exited with code" not in done.stderr


def test_a_killed_worker_fails_requests_and_the_server_reports_unhealthy(tiny_model_dir: Callable[..., Path]) -> None:
    path = str(tiny_model_dir("llama"))
    engine = AsyncEngine.launch(lambda: LLMEngine.from_args(path, distributed_executor_backend="mp", **ARGS))
    server = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        assert httpx.get(url + "/health", timeout=10).status_code == 200

        async def stream_then_kill() -> str:
            outs = engine.generate([5, 6, 7], SamplingParams(max_tokens=400, ignore_eos=True, temperature=0))
            await anext(outs)  # running when the worker dies
            os.kill(engine.engine.executor.pid, signal.SIGKILL)
            try:
                async for out in outs:
                    if out.error:
                        return out.error
            except EngineDeadError as e:
                return str(e)
            return "finished without an error"

        error = asyncio.run(asyncio.wait_for(stream_then_kill(), timeout=60))  # ends: never hangs
        assert "model worker process died" in error
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and "model worker process died" in health.json()["error"]
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        assert r.status_code == 503
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.shutdown()


def test_the_runner_thread_switch(engines: tuple[LLM, LLM], monkeypatch: pytest.MonkeyPatch) -> None:
    """INFLIGHT_RUNNER_THREAD: 1 turns it on, 0 / auto (unset) leave the runner in the engine's
    thread, on a GPU too (the H100's offline run was 8 % faster without it), anything else is a
    ValueError naming the variable."""
    from dataclasses import replace

    import torch

    from inflight.worker.executor import runner_thread

    config = engines[0].engine.config  # a CPU engine's
    on_gpu = replace(config, model=replace(config.model, device=torch.device("cuda")))
    assert not runner_thread(config) and not runner_thread(on_gpu)
    assert not runner_thread(replace(config, async_scheduling=False))
    monkeypatch.setenv("INFLIGHT_RUNNER_THREAD", "1")
    assert runner_thread(config)
    monkeypatch.setenv("INFLIGHT_RUNNER_THREAD", "yes")
    with pytest.raises(ValueError, match="INFLIGHT_RUNNER_THREAD"):
        runner_thread(config)
