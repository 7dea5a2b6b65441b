"""What the "mp" executor costs per engine step: the runner in a worker process vs in the engine
thread (issue: one contract between scheduler and runner; target < 0.3 ms per step at batch 32).

Each executor runs the same greedy workload (--batch requests x --output-len tokens, short
prompts, so almost every step is an all-decode step of --batch rows) on a tiny random model, so
the model's own time is small and the difference shows. Overhead per step is measured two ways:
the mp executor's time in execute() calls minus the time its worker spent running them
(pickling, the socket round trip, unpickling), and the wall-clock difference of the two runs
divided by the steps.

    python benchmarks/executor_overhead.py --batch 32 --output-len 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight import LLM, SamplingParams  # noqa: E402
from inflight.testing import make_tiny_checkpoint  # noqa: E402


def run(llm: LLM, batch: int, output_len: int) -> float:
    prompts = [{"prompt_token_ids": [5 + i, 6, 7, 8]} for i in range(batch)]
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    path = make_tiny_checkpoint("llama", tempfile.mkdtemp(prefix="inflight-exec-"))
    common = {"dtype": "float32", "device": "cpu", "max_num_seqs": args.batch, "progress": False}
    uni = LLM(model=str(path), **common)
    multi = LLM(model=str(path), distributed_executor_backend="mp", **common)
    ex = multi.engine.executor
    walls: dict[str, list[float]] = {"uni": [], "mp": []}
    per_call: list[float] = []
    for _ in range(args.repeats + 1):  # the first round warms both up
        walls["uni"].append(run(uni, args.batch, args.output_len))
        ex.call_seconds = ex.worker_seconds = 0.0
        ex.num_calls = 0
        walls["mp"].append(run(multi, args.batch, args.output_len))
        per_call.append((ex.call_seconds - ex.worker_seconds) / ex.num_calls)
    steps = ex.num_calls
    uni_s, mp_s = statistics.median(walls["uni"][1:]), statistics.median(walls["mp"][1:])
    print(f"batch {args.batch} x {args.output_len} tokens, {steps} steps per run, median of {args.repeats}")
    print("| executor | wall s | ms / step |\n|---|---:|---:|")
    print(f"| uni | {uni_s:.3f} | {uni_s / steps * 1e3:.3f} |")
    print(f"| mp | {mp_s:.3f} | {mp_s / steps * 1e3:.3f} |")
    print(f"mp overhead per step: {statistics.median(per_call[1:]) * 1e3:.3f} ms (execute() minus worker time), "
          f"{(mp_s - uni_s) / steps * 1e3:.3f} ms (wall difference); target < 0.3 ms")  # fmt: skip
    multi.engine.shutdown()


if __name__ == "__main__":
    main()
