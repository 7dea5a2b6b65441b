"""Batch-1 engine overhead: a decode step's wall time minus the fused C step's, on a GGUF file.

One greedy request decodes --steps tokens through `LLMEngine.step()` (scheduling, the runner's
step object, the kernel, sampling, output processing, detokenization, stats); the kernel's
`forward` (embedding -> layers -> norm in one C call) and `logits` (the lm_head GEMV) are
wrapped and timed, so per step: engine = step wall time, kernel = forward + logits, overhead =
engine - kernel (what the Python around the kernel costs: the sampler's log-softmax / argmax
over the vocabulary included), in wall time and in the engine thread's CPU time (which load from
other processes inflates less); host = engine - the C calls alone (ifl_decode_step, ifl_logits*):
all the Python of a step, the kernel's own included. Medians over the steps.

Before/after: give it source trees; each sample runs in its own process with PYTHONPATH set to
one tree, alternating A B B A ..., and it prints the medians per tree:

    python benchmarks/engine_overhead.py --model ~/.cache/inflight/llama.cpp/models/model-Q8_0.gguf \\
        --tokenizer ~/.cache/inflight/llama.cpp/models/tokenizer --trees /tmp/before . --samples 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS = Path.home() / ".cache/inflight/llama.cpp/models"  # benchmarks/quant_bench.py writes them


def _timed(fn: Any, spent: list[float], cpu: list[float]) -> Any:
    def call(*a: Any, **kw: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)

    return call


def sample(args: argparse.Namespace) -> dict[str, float]:
    """One measurement in this process, with whatever `inflight` is on sys.path."""
    import torch

    from inflight import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, tokenizer=args.tokenizer or None, dtype="float32", device="cpu", max_num_seqs=1,
              max_model_len=args.prompt_len + args.steps + 32, progress=False)  # fmt: skip
    engine = llm.engine
    runner = engine.runner
    kernel = runner.decode_kernel
    assert kernel is not None, "the fused C step did not build: nothing to subtract"
    spent: list[float] = []
    spent_cpu: list[float] = []  # this thread's CPU time: what other load on the machine does not inflate
    kernel.forward = _timed(kernel.forward, spent, spent_cpu)
    kernel.logits = _timed(kernel.logits, spent, spent_cpu)
    try:  # a lone greedy stream's step: one C call, its lm_head included (worker/one_decode.py)
        from inflight.worker.one_decode import OneDecode

        OneDecode.__call__ = _timed(OneDecode.__call__, spent, spent_cpu)  # type: ignore[method-assign]
    except ImportError:  # a tree from before it
        pass
    in_c: list[float] = []  # the C calls alone: step - C is all the host work, forward's Python included
    for name in ("ifl_decode_step", "ifl_logits", "ifl_logits_q"):
        setattr(kernel.lib, name, _timed(getattr(kernel.lib, name), in_c, []))
    vocab = min(150000, engine.config.model.vocab_size)
    ids = torch.randint(10, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_tokens=args.steps + 8, temperature=0.0, ignore_eos=True)
    engine.add_request(engine.make_request({"prompt_token_ids": ids}, params))
    for _ in range(4):
        engine.step()  # the prefill, then warm decodes
    steps, kernels, kernels_cpu, over_cpu, c_calls = [], [], [], [], []
    for _ in range(args.steps):
        spent.clear()
        spent_cpu.clear()
        in_c.clear()
        t, c = time.perf_counter(), time.thread_time()
        engine.step()
        steps.append(time.perf_counter() - t)
        over_cpu.append(time.thread_time() - c - sum(spent_cpu))
        kernels.append(sum(spent))
        kernels_cpu.append(sum(spent_cpu))
        c_calls.append(sum(in_c))
    while engine.has_unfinished_requests():
        engine.step()
    over = [s - k for s, k in zip(steps, kernels)]
    host = [s - k for s, k in zip(steps, c_calls)]
    parts = (("step_ms", steps), ("kernel_ms", kernels), ("kernel_cpu_ms", kernels_cpu), ("overhead_ms", over),
             ("overhead_cpu_ms", over_cpu), ("c_ms", c_calls), ("host_ms", host))  # fmt: skip
    return {k: statistics.median(v) * 1e3 for k, v in parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODELS / "model-Q8_0.gguf"))
    ap.add_argument("--tokenizer", default=str(MODELS / "tokenizer"))
    ap.add_argument("--trees", nargs="*", default=[], help="source trees to compare (default: this one, in-process)")
    ap.add_argument("--samples", type=int, default=4, help="processes per tree")
    ap.add_argument("--steps", type=int, default=48, help="decode steps timed per sample")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one sample, JSON out
    args = ap.parse_args()
    if args.one or not args.trees:
        print(json.dumps(sample(args)))
        return
    results: dict[str, list[dict[str, float]]] = {t: [] for t in args.trees}
    order = [t for i in range(args.samples) for t in (args.trees if i % 2 == 0 else args.trees[::-1])]
    for tree in order:
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        cmd = [sys.executable, __file__, "--one", *sys.argv[1:]]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results[tree].append(json.loads(out.strip().splitlines()[-1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_host_time import cpu_name

    print(f"{cpu_name()}, {args.threads} threads; {Path(args.model).name}, batch 1, prompt {args.prompt_len}, "
          f"{args.steps} decode steps x {args.samples} processes per tree (medians of per-step medians)")  # fmt: skip
    for tree, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if all(k in r for r in rs)}
        print(f"  {tree}: step {med['step_ms']:.2f} ms = kernel {med['kernel_ms']:.2f} (the calling thread's CPU time "
              f"{med.get('kernel_cpu_ms', float('nan')):.2f}: all of it at --threads 1) + overhead "
              f"{med['overhead_ms']:.3f} ms ({100 * med['overhead_ms'] / med['step_ms']:.1f} %); overhead in the engine "
              f"thread's CPU time {med['overhead_cpu_ms']:.3f} ms; host work (step - the C calls, forward's Python "
              f"included) {med.get('host_ms', float('nan')):.3f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
