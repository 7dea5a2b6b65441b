"""One sample of a before/after comparison of two source trees: run it with PYTHONPATH set to each
tree in turn (alternating, e.g. A B B A A B), one process per sample, on a quiet machine.

    PYTHONPATH=/tmp/before python benchmarks/tree_ab.py before >> ab.jsonl
    PYTHONPATH=$PWD        python benchmarks/tree_ab.py after  >> ab.jsonl

Measures, on the random Qwen2.5-0.5B-shaped checkpoint benchmarks/report.py builds (--model),
at dtype auto: offline 32 x (128 -> 64) output tok/s through one LLM.generate, batch-1 TPOT
(median gap between the tokens of one 64-token request), and served 32 x (128 -> 64): the
tree's `inflight serve` and 32 concurrent streamed /v1/completions, output tok/s. Prints one
JSON line. The client is this script's, the same for both trees.
"""

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx
import torch

from inflight import LLM, SamplingParams

MODEL = (
    sys.argv[sys.argv.index("--model") + 1]
    if "--model" in sys.argv
    else "/tmp/inflight-bench/qwen05b-bf16-tok"
)
label = sys.argv[1]
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 1000, (128,), generator=g).tolist() for _ in range(32)]
llm = LLM(
    model=MODEL, max_num_seqs=64, max_model_len=2048, enable_prefix_caching=False, progress=False
)
p = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
llm.generate(
    [{"prompt_token_ids": prompts[0]}],
    SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    use_tqdm=False,
)
t = time.perf_counter()
llm.generate([{"prompt_token_ids": x} for x in prompts], p, use_tqdm=False)
off = 32 * 64 / (time.perf_counter() - t)
one = llm.generate([{"prompt_token_ids": prompts[1]}], p, use_tqdm=False)[0]
tt = one.metrics.token_times
tpot = statistics.median(b - a for a, b in zip(tt, tt[1:])) * 1e3
del llm
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
srv = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "inflight",
        "serve",
        "--model",
        MODEL,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--max-num-seqs",
        "64",
        "--max-model-len",
        "2048",
        "--no-enable-prefix-caching",
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
url = f"http://127.0.0.1:{port}"
try:
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except Exception:
            pass
        time.sleep(0.5)
    model_id = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]

    async def one_req(c, prompt):
        n = 0
        async with c.stream(
            "POST",
            url + "/v1/completions",
            json={
                "model": model_id,
                "prompt": prompt,
                "max_tokens": 64,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            },
        ) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    n += 1
        return n

    async def run():
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as c:
            await one_req(c, prompts[0][:16])
            t = time.perf_counter()
            ns = await asyncio.gather(*[one_req(c, x) for x in prompts])
            return sum(ns), time.perf_counter() - t

    n, dt = asyncio.run(run())
    served = 32 * 64 / dt
finally:
    srv.terminate()
    srv.wait(30)
assert n == 32 * 64, n
print(
    json.dumps(
        {
            "tree": label,
            "offline_tok_s": round(off, 1),
            "batch1_tpot_ms": round(tpot, 2),
            "served_tok_s": round(served, 1),
            "chunks": n,
        }
    ),
    flush=True,
)
