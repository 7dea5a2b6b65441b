"""Cost of a step of M rows: the fused C decode kernel against the eager PyTorch model, per M.

Two kinds of step, on one loaded model, both through ModelRunner.forward + its logits (what the
engine runs):
  seq   M consecutive rows of one sequence after a --context-token context (a speculative
        verification of K = M - 1 drafts: causal attention among the new rows);
  batch M single-row decodes of M sequences of --context tokens each.
Kernel and eager runs alternate (a noisy neighbour hits both alike); each figure is the fastest
of --iters steps, the median over --repeat (the fastest step is the least disturbed one).
Prints ms per step and the ratio to the kernel's 1-row step; never asserts timings.

    python benchmarks/decode_rows.py                          # the spec_decode.py model (123M)
    python benchmarks/decode_rows.py --shape qwen0.5b --rows 1,2,4,5,8
    python benchmarks/decode_rows.py --gguf q8_0                # the same model as a Q8_0 GGUF
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from bench_timing import Timer, fmt_other  # noqa: E402
from spec_decode import CONFIG, checkpoint, target_path  # noqa: E402

from inflight import LLM  # noqa: E402
from inflight.models.step import StepBatch  # noqa: E402

QWEN05 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
          "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 4096,
          "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
SHAPES = {"spec": ("spec-llama-1024x8", CONFIG), "qwen0.5b": ("rows-qwen0.5b", QWEN05)}
BS = 16
CLOCK = time.perf_counter  # --cpu-time: time.process_time


def step(runner: Any, m: int, ctx: int, one_seq: bool) -> StepBatch:
    """A step of m rows on blocks 1.. (one sequence of ctx + m tokens, or m sequences of ctx + 1)."""
    lens = [ctx + m] if one_seq else [ctx + 1] * m
    nblocks = [-(-n // BS) for n in lens]
    width, tables, nxt = max(nblocks), [], 1
    for n in nblocks:
        tables.append(list(range(nxt, nxt + n)) + [0] * (width - n))
        nxt += n
    positions = list(range(ctx, ctx + m)) if one_seq else [ctx] * m
    piece = [0] * m if one_seq else list(range(m))
    slots = [tables[s][p // BS] * BS + p % BS for s, p in zip(piece, positions)]
    ids = [5 + i for i in range(m)]
    return StepBatch(
        token_ids=ids, positions=positions, query_lens=[m] if one_seq else [1] * m, context_lens=[ctx + m] if one_seq else lens,
        slots=torch.tensor(slots), block_table=torch.tensor(tables, dtype=torch.int32),
    )  # fmt: skip


def timed(runner: Any, s: StepBatch, kernel: Any, n: int) -> tuple[float, float | None]:
    """The fastest of n steps (ms; the least disturbed by other processes) and the cores others kept busy."""
    runner.decode_kernel = kernel
    best = float("inf")
    with torch.inference_mode(), Timer() as t:
        for _ in range(n):
            t0 = CLOCK()
            runner.logits(runner.forward(s))
            best = min(best, CLOCK() - t0)
    return best * 1e3, t.other_cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=SHAPES, default="spec")
    ap.add_argument("--rows", default="1,2,3,5,8")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="CPU time of this process instead of wall time: on a busy machine, the work a step "
                         "takes without the time other processes held the cores (with OMP_WAIT_POLICY=PASSIVE)")
    ap.add_argument("--root", default="/tmp/inflight-bench")
    ap.add_argument("--gguf", metavar="QTYPE", help="the spec shape as a GGUF file of this type (q8_0 ...), as spec_decode.py --gguf")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    name, config = SHAPES[args.shape]
    path = target_path(Path(args.root), args.gguf) if args.gguf else checkpoint(Path(args.root), name, config)
    llm = LLM(model=str(path), dtype=args.dtype, progress=False, block_size=BS, num_kv_blocks=512, enable_prefix_caching=False)
    if args.threads:
        torch.set_num_threads(args.threads)
    runner = llm.engine.runner
    kernel = runner.decode_kernel
    assert kernel is not None, "the decode kernel is off on this machine"
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; {runner.model.cpu_paths.summary}")
    res: dict[str, Any] = {}
    for kind in ("seq", "batch"):
        for m in sorted({1, *(int(r) for r in args.rows.split(","))}):  # 1 row: the k/k1 baseline
            s = step(runner, m, args.context, kind == "seq")
            if not kernel.accepts(m, s.decode_only, False, len(s.query_lens)):
                continue
            timed(runner, s, kernel, 1), timed(runner, s, None, 1)  # warm-up
            k_runs, e_runs, other = [], [], 0.0
            for _ in range(args.repeat):
                k_ms, k_o = timed(runner, s, kernel, args.iters)
                e_ms, e_o = timed(runner, s, None, args.iters)
                k_runs.append(k_ms), e_runs.append(e_ms)
                other = max(other, k_o or 0.0, e_o or 0.0)
            res[f"{kind}{m}"] = {"kernel_ms": statistics.median(k_runs), "eager_ms": statistics.median(e_runs), "other": other}
    runner.decode_kernel = kernel
    base = res["seq1"]["kernel_ms"]
    print(f"{'step':10}{'kernel ms':>11}{'eager ms':>10}{'k/k1':>7}  other")
    for key, r in res.items():
        print(f"{key:10}{r['kernel_ms']:11.2f}{r['eager_ms']:10.2f}{r['kernel_ms'] / base:7.2f}  {fmt_other(r['other'])}")
    print(json.dumps({"shape": args.shape, "time": time.strftime("%H:%M"), **res}))


if __name__ == "__main__":
    main()
