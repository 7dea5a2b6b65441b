"""Host time per decode step at batch 32: what the engine and the runner spend around the model.

A tiny random Llama (hidden 64, 2 layers: its forward is a few hundred microseconds) runs --batch
requests of a --prompt-len prompt (long block tables: 512 tokens = 32 blocks of 16) to all-decode
steps; half the rows are greedy, half sample with temperature, top-k, top-p and a seed (so the
sampling columns are not all defaults). Per step it times `LLMEngine.step()` and, inside it, the
model's forward (`model.forward` wrapped); host time = step - forward: scheduling, the runner's
input batch, attention metadata, sampling tensors, sampling, output processing. `uni` executor,
so no pickling is counted (benchmarks/executor_overhead.py measures that).

Before/after: give it source trees; each sample runs in its own process with PYTHONPATH set to
one tree, alternating A B B A ..., and it prints the medians per tree:

    python benchmarks/step_host_time.py --trees /tmp/before . --samples 6
    python benchmarks/step_host_time.py            # this tree only, one sample in-process
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process, with whatever `inflight` is on sys.path."""
    import torch

    from inflight import LLM, SamplingParams
    from inflight.testing import make_tiny_checkpoint

    torch.set_num_threads(args.threads)
    path = make_tiny_checkpoint("llama", Path(args.workdir) / "tiny", max_position_embeddings=4096)
    llm = LLM(model=str(path), max_num_seqs=args.batch, max_model_len=2048, enable_prefix_caching=False,
              distributed_executor_backend="uni", progress=False)  # fmt: skip
    engine = llm.engine
    model = engine.runner.model
    forward_s: list[float] = []
    plain = model.forward

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = plain(*a, **kw)
        forward_s.append(time.perf_counter() - t)
        return out

    model.forward = timed
    g = torch.Generator().manual_seed(0)
    for i in range(args.batch):
        ids = torch.randint(10, 200, (args.prompt_len,), generator=g).tolist()
        p = SamplingParams(max_tokens=args.steps + 8, ignore_eos=True, temperature=0.0)
        if i % 2:
            p = SamplingParams(max_tokens=args.steps + 8, ignore_eos=True, temperature=0.8, top_k=50, top_p=0.9, seed=i)
        engine.add_request(engine.make_request({"prompt_token_ids": ids}, p))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step()  # prefill
    for _ in range(4):
        engine.step()  # warm-up decodes
    steps, hosts = [], []
    for _ in range(args.steps):
        forward_s.clear()
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        steps.append(dt)
        hosts.append(dt - sum(forward_s))
    return {"step_ms": statistics.median(steps) * 1e3, "host_ms": statistics.median(hosts) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="*", default=[], help="source trees to compare (default: this one, in-process)")
    ap.add_argument("--samples", type=int, default=6, help="processes per tree")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60, help="decode steps timed per sample")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the host work is what varies)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one sample, JSON out
    args = ap.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="step-host-")
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
    print(f"{cpu_name()}, torch threads {args.threads}; batch {args.batch}, prompt {args.prompt_len}, "
          f"{args.steps} decode steps x {args.samples} processes per tree (medians)")  # fmt: skip
    base = None
    for tree, rs in results.items():
        host = statistics.median(r["host_ms"] for r in rs)
        step = statistics.median(r["step_ms"] for r in rs)
        base = host if base is None else base
        print(f"  {tree}: host {host:.3f} ms/step ({host / base:.2f}x the first), step {step:.3f} ms")


if __name__ == "__main__":
    main()
