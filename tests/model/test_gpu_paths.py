"""The CUDA path end to end: half-precision parity with Hugging Face on the same GPU, CUDA graphs
against eager steps, the KV pool sized after the weights. Needs `--device cuda` (a GPU): the
Triton kernels themselves are also checked on CPU (test_triton_attention.py, test_hf_parity.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_hf_parity import MAX_TOKENS, _engine_run, _hf_run, _random_prompts, _vocab

from inflight import LLM, SamplingParams
from inflight.testing.servers import wait_healthy

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs and half-precision GPU parity need a GPU"
)


@pytest.fixture(autouse=True)
def _on_gpu(test_device: str) -> None:
    assert test_device.startswith("cuda"), "run with --device cuda"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_half_precision_greedy_tracks_hf_on_the_gpu(
    arch: str, dtype: torch.dtype, tiny_model_dir: Callable[..., Path], test_device: str
) -> None:
    """Both implementations round differently (fused q/k/v, Triton vs SDPA attention), so a greedy
    path may part where two logits nearly tie; up to that point logprobs must agree closely."""
    path = tiny_model_dir(arch)
    prompts = _random_prompts(_vocab(path), seed=2)
    name = "bfloat16" if dtype == torch.bfloat16 else "float16"
    run = _engine_run(path, prompts, dtype=name, device=test_device)
    hf = _hf_run(path, prompts, dtype=dtype, device=test_device)
    assert run.num_preemptions >= 1 and run.graph_replays > 0
    whole, agreeing = 0, 0
    tol = 0.08 if dtype == torch.bfloat16 else 0.02
    for i, out in enumerate(run.outputs):
        o = out.outputs[0]
        same = 0
        while same < MAX_TOKENS and o.token_ids[same] == hf.tokens[i][same]:
            same += 1
        whole += same == MAX_TOKENS
        agreeing += same
        for step in range(same):
            ours = o.logprobs[step][o.token_ids[step]].logprob
            ref = float(hf.logprobs[i][step, o.token_ids[step]])
            assert abs(ours - ref) <= tol, f"prompt {i} step {step}: {ours} vs HF {ref}"
    assert whole >= len(prompts) - 2, f"only {whole}/{len(prompts)} sequences equal HF's"
    assert agreeing >= 0.85 * len(prompts) * MAX_TOKENS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_give_the_eager_tokens(dtype: str, tiny_model_dir: Callable[..., Path], test_device: str) -> None:
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path), seed=3)
    graphed = _engine_run(path, prompts, dtype=dtype, device=test_device)
    eager = _engine_run(path, prompts, dtype=dtype, device=test_device, enforce_eager=True)
    assert graphed.graph_replays > 0 and eager.graph_replays == 0
    for a, b in zip(graphed.outputs, eager.outputs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = [a.outputs[0].logprobs[s][t].logprob for s, t in enumerate(a.outputs[0].token_ids)]
        lb = [b.outputs[0].logprobs[s][t].logprob for s, t in enumerate(b.outputs[0].token_ids)]
        assert la == pytest.approx(lb, abs=1e-3 if dtype == "float32" else 0.05)


def test_a_worker_process_gives_the_engine_threads_tokens(tiny_model_dir: Callable[..., Path], test_device: str) -> None:
    """The model in a `mp` worker process on the GPU (CUDA graphs there, async scheduling here):
    the same greedy tokens and logprobs as the in-thread (`uni`) engine (gpu_report's offline (mp) row)."""
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path), seed=4)
    uni = _engine_run(path, prompts, dtype="bfloat16", device=test_device)
    mp = _engine_run(path, prompts, dtype="bfloat16", device=test_device, distributed_executor_backend="mp")
    assert uni.graph_replays > 0
    for a, b in zip(uni.outputs, mp.outputs):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = [a.outputs[0].logprobs[s][t].logprob for s, t in enumerate(a.outputs[0].token_ids)]
        lb = [b.outputs[0].logprobs[s][t].logprob for s, t in enumerate(b.outputs[0].token_ids)]
        assert la == pytest.approx(lb, abs=0.05)  # async scheduling groups steps differently: bf16 rounding


def _served_tokens(path: Path, prompts: list[list[int]], device: str, log: Path, *extra: str) -> list[list[int]]:
    """`inflight serve` in a subprocess (float32, `extra` flags); each prompt's greedy tokens,
    streamed (one request at a time), read from the chunks' `token_ids`."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", str(path), "--device", device, "--dtype", "float32",
           "--port", str(port), "--max-num-seqs", "8", "--log-level", "info", *extra]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, url, log, 240)
        tokens = []
        for p in prompts:
            body = {"model": path.name, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                    "stream": True, "return_token_ids": True}  # fmt: skip
            got: list[int] = []
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        got += json.loads(line[6:])["choices"][0].get("token_ids", [])
            tokens.append(got)
        return tokens
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_runs_the_model_in_a_worker_process_on_the_gpu(
    tiny_model_dir: Callable[..., Path], tmp_path: Path, test_device: str
) -> None:
    """`inflight serve` on CUDA with the default executor (`auto`) runs the model in an `mp` worker
    process (EngineArgs.serving_backend: off the event loop's GIL); the streamed greedy tokens are
    the offline engine's (in-thread) on the same GPU."""
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path), seed=6)[:3]
    served = _served_tokens(path, prompts, test_device, tmp_path / "server.log")
    assert "executor: mp (distributed_executor_backend auto)" in (tmp_path / "server.log").read_text()
    llm = LLM(model=str(path), device=test_device, dtype="float32", max_num_seqs=8, progress=False)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    offline = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert served == offline


def test_graph_batch_padding_and_sizes(tiny_model_dir: Callable[..., Path], test_device: str) -> None:
    """Batches of every size up to max_num_seqs replay a graph (padded to the next captured size)
    and give the tokens each prompt gives alone."""
    path = tiny_model_dir("llama")
    llm = LLM(model=str(path), device=test_device, dtype="float32", max_num_seqs=11, progress=False)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.sizes[-1] == 11
    prompts = _random_prompts(_vocab(path), seed=4)[:7] * 2  # 14 > max_num_seqs: queued
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    together = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    alone = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in prompts[:7]]
    for i, out in enumerate(together):
        assert out.outputs[0].token_ids == alone[i % 7].outputs[0].token_ids
    assert graphs.num_replays > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_multistep_graph_passes_give_the_one_step_tokens(dtype: str, tiny_model_dir: Callable[..., Path], test_device: str) -> None:
    """num_scheduler_steps 8 (docs/MULTISTEP.md): the graphs replay 8 passes a step, each argmax fed
    back on the device; batch 1 and 5 rows (padded to the 8-row graph), max_tokens 21 not a
    multiple of 8: the tokens and cumulative logprobs of one pass a step."""
    path = tiny_model_dir("qwen2")
    prompts = _random_prompts(_vocab(path), seed=5)[:5]
    params = SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True)
    runs = {}
    for steps in (1, 8):
        llm = LLM(model=str(path), device=test_device, dtype=dtype, num_scheduler_steps=steps, max_num_seqs=8,
                  num_kv_blocks=64, progress=False)  # fmt: skip
        graphs = llm.engine.runner.graphs
        assert graphs is not None
        outs = [llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)[0]]
        outs += llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        llm.engine.kv.pool.check_idle()
        runs[steps] = (outs, graphs.num_replays)
        llm.engine.shutdown()
        del llm, graphs
    (one, replays_one), (multi, replays_multi) = runs[1], runs[8]
    assert replays_multi == replays_one >= 2 * 20  # 20 decode tokens a request, batch 1 then 5: every pass replays
    for a, b in zip(multi, one, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == pytest.approx(b.outputs[0].cumulative_logprob, abs=1e-3 if dtype == "float32" else 0.05)


def test_mixed_adapters_match_peft_on_the_gpu(
    tiny_model_dir: Callable[..., Path], tmp_path: Path, test_device: str
) -> None:
    """Multi-LoRA on the GPU against PEFT on the same GPU in float32: a mixed batch (adapters a,
    b, c and none) through 2 adapter slots, so slots are evicted and reloaded."""
    import peft
    from test_lora import ADAPTERS, BATCH, _prompts
    from test_lora import MAX_TOKENS as LORA_TOKENS
    from transformers import AutoModelForCausalLM

    from inflight.testing import make_peft_lora

    base = tiny_model_dir("llama")
    paths = {n: make_peft_lora(base, tmp_path / n, seed=i + 1, **cfg) for i, (n, cfg) in enumerate(ADAPTERS.items())}
    llm = LLM(model=str(base), device=test_device, dtype="float32", enable_lora=True, max_loras=2,
              max_num_seqs=8, progress=False)  # fmt: skip
    for name, path in paths.items():
        llm.load_lora_adapter(name, str(path))
    prompts = _prompts()
    params = SamplingParams(max_tokens=LORA_TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)
    reqs = [{"prompt_token_ids": prompts[i]} | ({"lora_name": a} if a else {}) for a, i in BATCH]
    outs = llm.generate(reqs, params, use_tqdm=False)
    llm.engine.kv.pool.check_idle()
    for (name, i), out in zip(BATCH, outs, strict=True):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
        if name:
            model = peft.PeftModel.from_pretrained(model, str(paths[name]))
        model = model.to(test_device).eval()
        ids = torch.tensor([prompts[i]], device=test_device)
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=LORA_TOKENS,
                                 min_new_tokens=LORA_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)  # fmt: skip
        ref_tokens = ref.sequences[0, len(prompts[i]) :].tolist()
        o = out.outputs[0]
        assert o.token_ids == ref_tokens, f"adapter {name} prompt {i} diverged from PEFT on the GPU"
        ref_lps = torch.log_softmax(torch.stack(ref.logits)[:, 0].float(), dim=-1).cpu()
        for step, tok in enumerate(o.token_ids):
            assert abs(o.logprobs[step][tok].logprob - float(ref_lps[step, tok])) <= 1e-3
    assert len({tuple(o.outputs[0].token_ids) for (n, i), o in zip(BATCH, outs) if i == 0}) == 3


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_gives_the_plain_tokens_on_the_gpu(
    method: str, tiny_model_dir: Callable[..., Path], test_device: str
) -> None:
    """Speculative decoding on the GPU (each row's drafts verified in one eager step of K + 1 tokens
    through the Triton attention's prefill path; the plain engine decodes from CUDA graphs): the
    plain engine's greedy tokens, with drafts accepted. The draft model is the target itself."""
    path = str(tiny_model_dir("qwen2"))
    spec = ({"method": "ngram", "num_speculative_tokens": 4} if method == "ngram"
            else {"method": "draft_model", "model": path, "num_speculative_tokens": 3})  # fmt: skip
    prompts = [list(range(3, 40)) + list(range(3, 30)), [5, 9, 11, 13] * 4, list(range(100, 130))]  # copyable spans
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    runs = []
    for config in (None, spec):
        llm = LLM(model=path, device=test_device, dtype="float32", max_num_seqs=8, speculative_config=config, progress=False)
        runs.append(llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))
        llm.engine.kv.pool.check_idle()
        llm.engine.shutdown()
    plain, speculated = runs
    assert [o.outputs[0].token_ids for o in speculated] == [o.outputs[0].token_ids for o in plain]
    assert sum(o.metrics.num_accepted_draft_tokens for o in speculated) > 0
