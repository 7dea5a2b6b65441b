"""Tensor parallelism on this machine: TP=1 vs TP=N throughput and TPOT, and what the collectives
cost per step (issue: scale out).

Workload: the Qwen2.5-0.5B shape (24 layers, hidden 896, 14 heads, 2 KV heads, vocab 151936)
with random weights (`load_format="dummy"`, nothing downloaded), float32, greedy, --batch
requests of a 32-token prompt x --output-len tokens, for each --tp. Reported per run: output
tokens/s, median TPOT (ms between tokens of a request), and the step time.

Second table: the communication alone, in N gloo processes on this machine: per decode step a
TP rank runs 2 all-reduces per layer + 1 for the embedding over (batch, 896) float32, and one
all-gather of its (batch, vocab / N) logits. That is the floor TP adds to every step here.

On a 2-core CPU TP=2 cannot be faster: the two ranks split the same two cores (1 thread each
instead of 2 threads in one process) and add the collectives and a second process's overheads.
The figures show that cost. What TP buys -- a model larger than one device, or more memory
bandwidth (more sockets / GPUs) -- needs more hardware than this machine has.

    python benchmarks/tensor_parallel.py --tp 1 2 --batch 1 32 --output-len 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from inflight import LLM, SamplingParams, platform  # noqa: E402
from inflight.testing import QWEN25_05B_CONFIG  # noqa: E402
from inflight.worker.distributed import free_port  # noqa: E402

PROMPT_LEN = 32


def run_engine(path: str, tp: int, batch: int, output_len: int) -> dict[str, float]:
    llm = LLM(model=path, load_format="dummy", dtype="float32", device="cpu", tensor_parallel_size=tp,
              max_num_seqs=max(batch, 1), max_model_len=256, progress=False)  # fmt: skip
    prompts = [{"prompt_token_ids": [100 + i + j for j in range(PROMPT_LEN)]} for i in range(batch)]
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate(
        prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False
    )  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tpots = [d for o in outs for d in o.metrics.decode_times_ms]
    llm.engine.shutdown()
    steps = output_len  # every request decodes together after the first step
    return {
        "tok_s": batch * output_len / wall,
        "tpot_ms": statistics.median(tpots),
        "step_ms": 1e3 * wall / steps,
    }


def _comm_rank(rank: int, size: int, port: int, batch: int, reps: int, out: dict) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    cfg = QWEN25_05B_CONFIG
    x = torch.randn(batch, cfg["hidden_size"])
    logits = torch.randn(batch, -(-cfg["vocab_size"] // size))
    parts = [torch.empty_like(logits) for _ in range(size)]
    per_step = 2 * cfg["num_hidden_layers"] + 1
    for _ in range(3):  # warm-up
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        for _ in range(per_step):
            dist.all_reduce(x)
        dist.all_gather(parts, logits)
    ms = 1e3 * (time.perf_counter() - start) / reps
    if rank == 0:
        out[batch] = ms
    dist.destroy_process_group()


def comm_per_step(size: int, batch: int, reps: int = 20) -> float:
    out = mp.Manager().dict()
    mp.spawn(_comm_rank, args=(size, free_port(), batch, reps, out), nprocs=size, join=True)
    return float(out[batch])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    plat = platform.current()
    print(f"# {plat.cpu.model_name} | {plat.summary()} | torch {torch.__version__}")
    print("# Qwen2.5-0.5B shape, random weights, float32, greedy; prompt 32 tokens")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(QWEN25_05B_CONFIG))
        print(f"{'tp':>3} {'batch':>5} {'out tok/s':>10} {'TPOT ms':>8} {'step ms':>8}")
        for batch in args.batch:
            for tp in args.tp:
                r = run_engine(tmp, tp, batch, args.output_len)
                rows.append({"tp": tp, "batch": batch, **r})
                print(
                    f"{tp:>3} {batch:>5} {r['tok_s']:>10.1f} {r['tpot_ms']:>8.1f} {r['step_ms']:>8.1f}",
                    flush=True,
                )
    print(
        "\n# collectives alone per decode step (49 all-reduces of (batch, 896) + 1 logits all-gather), gloo"
    )
    print(f"{'tp':>3} {'batch':>5} {'ms/step':>8}")
    for tp in [t for t in args.tp if t > 1]:
        for batch in args.batch:
            ms = comm_per_step(tp, batch)
            rows.append({"tp": tp, "batch": batch, "comm_ms_per_step": ms})
            print(f"{tp:>3} {batch:>5} {ms:>8.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
