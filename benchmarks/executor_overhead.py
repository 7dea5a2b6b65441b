"""What the "mp" executor costs per engine step: the runner in a worker process vs in the engine
thread (issue: one contract between scheduler and runner; target < 0.3 ms per step at batch 32).

Each executor runs the same greedy workload (--batch requests x --output-len tokens, short
prompts, so almost every step is an all-decode step of --batch rows) on a tiny random model, so
the model's own time is small and the difference shows. Three engines: uni (the runner in the
engine thread), mp with async scheduling (the default: step N+1 is sent before step N's output
is read) and mp without it (one request/reply per step). Per step it prints the wall-clock time,
the difference to uni (what the process boundary costs end to end), and the time the worker sat
waiting for its next step (what async scheduling hides). Runs alternate between the engines, so
a machine whose speed drifts affects all of them alike.

On a CPU the worker's model threads and the engine process share the cores: with every core
given to the model (the default), the engine's own work per step competes with it, which shows
in the wall-clock column and not in the idle one. `--threads N` gives both engines N model
threads (e.g. one fewer than the cores, leaving one to the engine process).

    python benchmarks/executor_overhead.py --batch 32 --output-len 128
    python benchmarks/executor_overhead.py --batch 32 --output-len 128 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)


def _threads_from_argv() -> None:
    """--threads must reach the OpenMP runtime before torch loads (the worker inherits it)."""
    if "--threads" in sys.argv:
        os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]


_threads_from_argv()
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
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="model threads for both engines (default: all cores)")
    args = p.parse_args()
    path = make_tiny_checkpoint("llama", tempfile.mkdtemp(prefix="inflight-exec-"))
    common = {"dtype": "float32", "device": "cpu", "max_num_seqs": args.batch, "progress": False}
    engines = {
        "uni": LLM(model=str(path), **common),
        "mp (async scheduling)": LLM(model=str(path), distributed_executor_backend="mp", **common),
        "mp (no async scheduling)": LLM(
            model=str(path), distributed_executor_backend="mp", async_scheduling=False, **common
        ),
    }
    walls: dict[str, list[float]] = {name: [] for name in engines}
    idle: dict[str, list[float]] = {name: [] for name in engines}
    steps = 0
    for round_ in range(args.repeats + 1):  # the first round warms every engine up
        for name, llm in engines.items():
            ex = llm.engine.executor
            if hasattr(ex, "worker_idle_seconds"):
                ex.worker_idle_seconds, ex.num_calls = 0.0, 0
            wall = run(llm, args.batch, args.output_len)
            if round_:
                walls[name].append(wall)
                if hasattr(ex, "worker_idle_seconds"):
                    steps = ex.num_calls
                    idle[name].append(ex.worker_idle_seconds / ex.num_calls)
    uni = statistics.median(walls["uni"])
    import torch

    print(f"batch {args.batch} x {args.output_len} tokens, {steps} steps per run, median of {args.repeats}, "
          f"{torch.get_num_threads()} model threads, {os.cpu_count()} cores")  # fmt: skip
    print("| executor | wall s | ms / step | vs uni, ms / step | worker idle, ms / step |")
    print("|---|---:|---:|---:|---:|")
    for name in engines:
        wall = statistics.median(walls[name])
        waits = f"{statistics.median(idle[name]) * 1e3:.3f}" if idle[name] else "-"
        print(f"| {name} | {wall:.3f} | {wall / steps * 1e3:.3f} | {(wall - uni) / steps * 1e3:+.3f} | {waits} |")
    print("target: mp overhead < 0.3 ms per step")
    for llm in engines.values():
        llm.engine.shutdown()


if __name__ == "__main__":
    main()
