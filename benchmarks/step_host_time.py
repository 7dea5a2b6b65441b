"""Host time per decode step at batch 32: what the engine and the runner spend around the model.

A tiny random Llama (hidden 64, 2 layers) runs --batch requests of a --prompt-len prompt (long
block tables: 1,024 tokens = 64 blocks of 16) to all-decode steps; half the rows are greedy, half
sample with temperature, top-k, top-p and a seed (so the sampling columns are not all defaults).
Per step it takes the CPU time of `LLMEngine.step()` and, inside it, of the device work (the
model's forward, the lm_head, the sampler's math: wrapped and timed); host = step - device:
scheduling, the runner's input batch, attention metadata, sampling tensors, output processing;
runner host = the part of it inside `ModelRunner.execute`. CPU time of the engine thread with one
torch thread, so other load on the machine counts less (caches and memory bandwidth still vary).
`uni` executor: each step's `SchedulerOutput` is also pickled and unpickled aside, to report what
the `mp` executor would send (bytes) and what that costs (not part of the step's time).

Before/after: give it source trees; each sample runs in its own process with PYTHONPATH set to
one tree, alternating A B B A ..., and it prints the medians per tree:

    python benchmarks/step_host_time.py --trees /tmp/before . --samples 6
    python benchmarks/step_host_time.py            # this tree only, one sample in-process
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
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


def _timed(fn: Any, spent: list[float]) -> Any:
    def call(*a: Any, **kw: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            spent.append(time.thread_time() - t)

    return call


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process, with whatever `inflight` is on sys.path. CPU time of this
    thread (torch runs single-threaded here), so other processes on the machine don't count."""
    import torch

    from inflight import LLM, SamplingParams
    from inflight.testing import make_tiny_checkpoint

    torch.set_num_threads(args.threads)
    # the first requests decode while the last ones prefill (512 tokens a step): enough max_tokens
    # that every row still runs through the timed steps (else the batch shrinks as they end)
    max_tokens = args.steps + 16 + args.batch * args.prompt_len // 512 + args.output_len
    length = args.prompt_len + max_tokens + 16
    path = make_tiny_checkpoint("llama", Path(args.workdir) / f"tiny-{length}", max_position_embeddings=length)
    llm = LLM(model=str(path), max_num_seqs=args.batch, max_model_len=length, enable_prefix_caching=False,
              distributed_executor_backend="uni", progress=False)  # fmt: skip
    engine, runner = llm.engine, llm.engine.runner
    model = runner.model
    device: list[float] = []  # the model's forward and lm_head, the sampler's math: not host work
    runner_s: list[float] = []
    model.forward = _timed(model.forward, device)
    model.compute_logits = _timed(model.compute_logits, device)
    runner.sampler = _timed(runner.sampler, device)
    if getattr(runner, "decode_kernel", None) is not None:  # batch 1: the fused C step is device work too
        runner.decode_kernel.forward = _timed(runner.decode_kernel.forward, device)
        runner.decode_kernel.logits = _timed(runner.decode_kernel.logits, device)
    runner.execute = _timed(runner.execute, runner_s)
    # what the `mp` executor would send this step: its pickled size and pickle + unpickle time
    sent: list[tuple[int, float]] = []
    execute = runner.execute

    def execute_and_measure(out: Any) -> Any:
        t = time.thread_time()
        raw = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(raw)
        sent.append((len(raw), time.thread_time() - t))
        return execute(out)

    runner.execute = execute_and_measure
    g = torch.Generator().manual_seed(0)
    for i in range(args.batch):
        ids = torch.randint(10, 200, (args.prompt_len,), generator=g).tolist()
        p = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        if i % 2:
            p = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, top_k=50, top_p=0.9, seed=i)
        engine.add_request(engine.make_request({"prompt_token_ids": ids}, p))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.requests.values()):
        engine.step()  # prefill
    for _ in range(4 + args.output_len):
        engine.step()  # warm-up decodes (and --output-len tokens more, untimed)
    assert engine.scheduler.num_running == args.batch, "every row decodes in the timed steps"
    steps, hosts, runner_host = [], [], []
    sent.clear()
    for _ in range(args.steps):
        device.clear()
        runner_s.clear()
        t = time.thread_time()
        engine.step()
        dt = time.thread_time() - t
        steps.append(dt)
        hosts.append(dt - sum(device))
        runner_host.append(sum(runner_s) - sum(device))
    ms = {k: statistics.median(v) * 1e3 for k, v in (("step_ms", steps), ("host_ms", hosts), ("runner_host_ms", runner_host))}
    ms["message_bytes"] = statistics.median(b for b, _ in sent)
    ms["pickle_ms"] = statistics.median(t for _, t in sent) * 1e3
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="*", default=[], help="source trees to compare (default: this one, in-process)")
    ap.add_argument("--samples", type=int, default=6, help="processes per tree")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60, help="decode steps timed per sample")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the host work is what varies)")
    ap.add_argument("--output-len", type=int, default=0,
                    help="tokens every request generates before the timed steps (what a long output costs the output path)")  # fmt: skip
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
          f"+{args.output_len} tokens, {args.steps} decode steps x {args.samples} processes per tree (medians)")  # fmt: skip
    base: dict[str, float] = {}
    for tree, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        base = base or med
        print(f"  {tree}: host {med['host_ms']:.3f} ms/step ({med['host_ms'] / base['host_ms']:.2f}x the first), "
              f"runner host {med['runner_host_ms']:.3f} ms ({med['runner_host_ms'] / base['runner_host_ms']:.2f}x), "
              f"whole step {med['step_ms']:.3f} ms; SchedulerOutput {med['message_bytes']:.0f} bytes, pickle + unpickle "
              f"{med['pickle_ms']:.3f} ms ({med['pickle_ms'] / base['pickle_ms']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
