"""Batch-1 decode with one decode pass per engine step against N (`num_scheduler_steps`,
docs/MULTISTEP.md), interleaved in one process on one model, CPU or GPU.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/multistep_tpot.py                     # quant_bench's 0.5B Q8_0 GGUF
    python benchmarks/multistep_tpot.py --model PATH [--steps 1,8] [--output-len 64] [--reps 5]

TPOT = (last token time - first token time) / (tokens - 1) of one request (the tokens of a
multi-step step share one time, so the median gap would be 0); the median over --reps runs of
each setting, the settings alternating run by run so a busy machine's drift hits both. The
default model is benchmarks/quant_bench.py's random Qwen2.5-0.5B-shaped Q8_0 file (written by
`python benchmarks/quant_bench.py` into ~/.cache/inflight/llama.cpp/models).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402
from quant_bench import cpu_name  # noqa: E402

DEFAULT_DIR = Path.home() / ".cache" / "inflight" / "llama.cpp" / "models"


class KernelClock:
    """Seconds spent in the CPU decode kernel's forward (its C call and argument set-up): the
    rest of a token's time is the host's (engine, runner, sampler), what multi-step divides."""

    def __init__(self, runner: Any) -> None:
        self.calls: list[tuple[float, float]] = []  # (start, seconds) of each forward
        kernel = runner.decode_kernel
        if kernel is None:
            return
        forward = kernel.forward

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return forward(*a, **kw)
            finally:
                self.calls.append((t0, time.perf_counter() - t0))

        kernel.forward = timed


def tpot_ms(llm: Any, prompt: list[int], output_len: int, steps: int, clock: KernelClock | None = None) -> tuple[float, float]:
    """(TPOT, host ms a token: TPOT less the decode kernel's share) of one request."""
    from inflight import SamplingParams

    sched = llm.engine.scheduler
    config, sched.config = sched.config, dataclasses.replace(sched.config, num_scheduler_steps=steps)
    try:
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    finally:
        sched.config = config
    times = out.metrics.token_times
    in_kernel = 0.0
    if clock is not None:  # the calls after the first token (the prompt's ran before it)
        in_kernel = sum(dt for t0, dt in clock.calls if t0 >= times[0])
        clock.calls.clear()
    tpot = (times[-1] - times[0]) / (len(times) - 1) * 1e3
    return tpot, tpot - in_kernel / (len(times) - 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_DIR / "model-Q8_0.gguf")
    ap.add_argument("--tokenizer", type=Path, default=None, help="default: quant_bench's tokenizer beside a GGUF file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--steps", default="1,8", help="num_scheduler_steps values, comma-separated")
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from inflight import LLM

    tok = args.tokenizer
    if tok is None and args.model.suffix == ".gguf" and (args.model.parent / "tokenizer").is_dir():
        tok = args.model.parent / "tokenizer"
    llm = LLM(model=str(args.model), tokenizer=str(tok) if tok else None, device=args.device, dtype=args.dtype,
              max_num_seqs=1, max_model_len=args.input_len + args.output_len + 16, progress=False)  # fmt: skip
    steps = [int(s) for s in args.steps.split(",")]
    prompt = list(range(100, 100 + args.input_len))
    for n in steps:
        tpot_ms(llm, prompt, 8, n)  # warm: kernels built, pages touched
    clock = KernelClock(llm.engine.runner) if args.device == "cpu" else None
    times: dict[int, list[float]] = {n: [] for n in steps}
    host: dict[int, list[float]] = {n: [] for n in steps}
    for _ in range(args.reps):
        for n in steps:
            if clock is not None:
                clock.calls.clear()
            tpot, h = tpot_ms(llm, prompt, args.output_len, n, clock)
            times[n].append(tpot)
            host[n].append(h)
    where = cpu_name() if args.device == "cpu" else torch.cuda.get_device_name()
    runner = llm.engine.runner
    path = runner.model.cpu_paths.summary if args.device == "cpu" else ("CUDA graphs" if runner.graphs else "eager")
    print(f"{where}; threads {args.threads}; {args.model.name}; batch 1, {args.input_len} -> {args.output_len}; "
          f"median of {args.reps} interleaved runs\n  {path}")  # fmt: skip
    print("| num_scheduler_steps | TPOT ms (median) | runs | vs 1 | host ms a token (TPOT less the C decode step; median) |")
    print("|---:|---:|---|---:|---:|")
    base = statistics.median(times[steps[0]])
    for n in steps:
        med = statistics.median(times[n])
        h = f"{statistics.median(host[n]):.3f}" if clock is not None else "n/a"
        print(f"| {n} | {med:.2f} | {' '.join(f'{t:.1f}' for t in times[n])} | {base / med:.3f}x | {h} |")
    print(f"command: {' '.join([*(f'{k}={os.environ[k]}' for k in ('OMP_WAIT_POLICY', 'INFLIGHT_CPU_FEATURES') if k in os.environ), 'python', *sys.argv])}")


if __name__ == "__main__":
    main()
