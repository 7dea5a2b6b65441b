"""The host cost per step at 256 running requests: `engine.step` outside `runner.execute`, and the runner's own.

Offline `LLM.generate` of --batch requests x (--prompt-len random tokens -> --max-tokens tokens,
ignore_eos, greedy) on a tiny random Llama (hidden 64, 2 layers, the tiny byte-level BPE
tokenizer: detokenization runs as on a real model), so the forward is small and what is left is
the engine's own work: scheduling, output processing, detokenization, RequestOutput objects.
Per step: CPU time of the engine thread (torch on 1 thread: the forward runs on it too, and other
load on the machine counts less than in wall time) in `engine.step()` minus that in
`runner.execute()` ("host"), and in its parts (schedule, update_from_output, outputs); medians over
the steps where at least --batch * 0.9 requests decode (the all-decode phase), and the total.
The runner's own host work ("runner host": its input batch, sampling rows, output objects) is
`runner.execute` outside the model's forward and lm_head and the sampler (on a GPU the device
waits for it as for the engine's), and "host + runner" the two together.
Then one more run under cProfile with the profiler paused inside the forward, lm_head and sampler:
the host work of both by function (tottime), i.e. where those milliseconds go.

On the H100 (docs/GPU.md) the same host work took 11.6 ms a step on 256 x (512 -> 256) while
the GPU idled: each ms is ~2 % of the decode phase there.

Before/after: give it source trees; each sample runs in its own process with PYTHONPATH set to
one tree, alternating A B B A ..., and it prints the medians per tree:

    git worktree add /tmp/before <commit>
    OMP_WAIT_POLICY=PASSIVE python benchmarks/offline_host_cost.py --trees /tmp/before . --samples 3
    python benchmarks/offline_host_cost.py --profile 40     # this tree, in-process, + cProfile
    python benchmarks/offline_host_cost.py --device cuda    # on a GPU machine: its host CPU's figure
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from step_host_time import cpu_name  # noqa: E402 - benchmarks/ is the script's folder


class HostClock:
    """Wraps engine.step and runner.execute (and the scheduler's and the output path's parts):
    per step, rows decoded and the wall time of each."""

    def __init__(self, llm: Any) -> None:
        # per step: rows in it, step s, execute s, {host part: s}
        self.rows: list[tuple[int, float, float, dict[str, float]]] = []
        self.parts: dict[str, float] = {}  # the step in progress
        self.profiler: cProfile.Profile | None = None
        engine, runner = llm.engine, llm.engine.runner
        step, execute = engine.step, runner.execute
        spent: list[float] = []
        scheduled: list[int] = []

        device: list[float] = []  # the model's forward and lm_head, the sampler: not host work

        def timed_execute(so: Any) -> Any:
            t = time.thread_time()
            try:
                return execute(so)
            finally:
                spent.append(time.thread_time() - t)
                scheduled.append(len(so.scheduled))

        def timed_step() -> Any:
            spent.clear()
            scheduled.clear()
            device.clear()
            self.parts = {}
            t = time.thread_time()
            out = step()
            self.parts["runner"] = sum(spent) - sum(device)
            self.rows.append((max(scheduled, default=0), time.thread_time() - t, sum(spent), self.parts))
            return out

        engine.step = timed_step
        runner.execute = timed_execute
        # the runner's host work (its input batch, sampling rows, output objects) is what is left of
        # `execute` outside these; the profile pauses in them
        model, kernel = runner.model, getattr(runner, "decode_kernel", None)
        model.forward = self._device(model.forward, device)
        model.compute_logits = self._device(model.compute_logits, device)
        runner.sampler = self._device(runner.sampler, device)
        if kernel is not None:  # the C decode step (and its lm_head) is device work too
            kernel.forward = self._device(kernel.forward, device)
            kernel.logits = self._device(kernel.logits, device)
        # the host parts (where they exist in the tree measured)
        for name, owner, attr in (("schedule", engine.scheduler, "schedule"),
                                  ("update", engine.scheduler, "update_from_output"),
                                  ("outputs", getattr(engine, "seqs", None), "step_outputs")):  # fmt: skip
            if owner is not None and hasattr(owner, attr):
                setattr(owner, attr, self._part(name, getattr(owner, attr)))

    def _device(self, fn: Any, spent: list[float]) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            if self.profiler is not None:
                self.profiler.disable()
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                spent.append(time.thread_time() - t)
                if self.profiler is not None:
                    self.profiler.enable()

        return call

    def _part(self, name: str, fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.parts[name] = self.parts.get(name, 0.0) + time.thread_time() - t

        return call


def build(args: argparse.Namespace) -> Any:
    import torch

    from inflight import LLM
    from inflight.testing import make_tiny_checkpoint

    torch.set_num_threads(args.threads)
    length = args.prompt_len + args.max_tokens + 16
    path = Path(args.workdir) / f"tiny-{length}"
    if not (path / "config.json").exists():
        make_tiny_checkpoint("llama", path, max_position_embeddings=length)
    return LLM(model=str(path), max_num_seqs=args.batch, max_model_len=length, enable_prefix_caching=False,
               device=args.device, distributed_executor_backend="uni", progress=False)  # fmt: skip


def prompts(args: argparse.Namespace) -> list[dict[str, list[int]]]:
    import torch

    g = torch.Generator().manual_seed(0)
    return [{"prompt_token_ids": torch.randint(10, 200, (args.prompt_len,), generator=g).tolist()} for _ in range(args.batch)]


def run(llm: Any, args: argparse.Namespace, params: Any) -> list[Any]:
    """LLM.generate, or with --streamed the engine driven as the server's engine thread drives it:
    requests that make an output every step they change (what a streamed response reads)."""
    if not args.streamed:
        return llm.generate(prompts(args), params, use_tqdm=False)  # type: ignore[no-any-return]
    engine, finals = llm.engine, []
    kw: dict[str, Any] = {"final_only": False}
    for p in prompts(args):
        try:
            engine.add_request(engine.make_request(p, params, **kw))
        except TypeError:  # a tree from before final_only: every request streams
            kw = {}
            engine.add_request(engine.make_request(p, params))
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    return finals


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process, with whatever `inflight` is on sys.path."""
    from inflight import SamplingParams

    llm = build(args)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0)
    llm.generate(prompts(args)[:8], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm
    clock = HostClock(llm)
    t = time.perf_counter()
    outs = run(llm, args, params)
    wall = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == args.max_tokens for o in outs)
    full = [r for r in clock.rows if r[0] >= 0.9 * args.batch]
    res = {
        "host_ms": statistics.median((s - e) * 1e3 for _, s, e, _ in full),
        "step_ms": statistics.median(s * 1e3 for _, s, _, _ in full),
        "host_total_s": sum(s - e for _, s, e, _ in clock.rows),
        "steps": len(clock.rows),
        "wall_s": wall,
        **{f"{k}_ms": statistics.median(p.get(k, 0.0) * 1e3 for *_, p in full) for k in full[0][3]},
    }
    # all of the step's host work: the engine's and the runner's (the GPU waits for both)
    res["both_ms"] = statistics.median((s - e + p["runner"]) * 1e3 for _, s, e, p in full)
    if args.profile:
        clock.rows.clear()
        clock.profiler = cProfile.Profile()
        clock.profiler.enable()
        run(llm, args, params)
        clock.profiler.disable()
        s = io.StringIO()
        pstats.Stats(clock.profiler, stream=s).sort_stats("tottime").print_stats(args.profile)
        res["profile"] = s.getvalue()
    return res


def parts(res: dict[str, Any]) -> str:
    skip = ("host_ms", "step_ms", "runner_ms", "both_ms")
    return ", ".join(f"{k[:-3]} {v:.2f} ms" for k, v in res.items() if k.endswith("_ms") and k not in skip)


def runner_part(res: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """The runner's host work (absent from results of this script before it measured it)."""
    if "runner_ms" not in res:
        return ""
    ratio = f" ({res['both_ms'] / base['both_ms']:.2f}x)" if base and "both_ms" in base else ""
    return (f"; runner host {res['runner_ms']:.2f} ms (execute outside the forward, lm_head, sampler); "
            f"host + runner {res['both_ms']:.2f} ms{ratio}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="*", default=[], help="source trees to compare (default: this one, in-process)")
    ap.add_argument("--samples", type=int, default=3, help="processes per tree")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the same host work beside a GPU's forward")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the host work is what varies)")
    ap.add_argument("--streamed", action="store_true",
                    help="requests that make an output every step (the server's streams), not LLM.generate's final-only ones")  # fmt: skip
    ap.add_argument("--profile", type=int, default=0, help="print this many cProfile rows (host work only)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one sample, JSON out
    args = ap.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="host-cost-")
    head = (f"{cpu_name()}, torch threads {args.threads}; {args.batch} x ({args.prompt_len} -> {args.max_tokens}) "
            f"offline, tiny Llama")  # fmt: skip
    if args.one or not args.trees:
        res = sample(args)
        if args.one:
            print(json.dumps({k: v for k, v in res.items() if k != "profile"}))
            return
        print(head)
        print(f"  host {res['host_ms']:.2f} ms/step at >= 90 % of {args.batch} rows (step {res['step_ms']:.2f} ms); "
              f"host total {res['host_total_s']:.2f} s over {res['steps']} steps; wall {res['wall_s']:.2f} s")  # fmt: skip
        print("  of it: " + parts(res) + runner_part(res))
        if "profile" in res:
            print("cProfile of engine.step outside the forward, lm_head and sampler, by tottime:\n" + res["profile"])
        return
    results: dict[str, list[dict[str, float]]] = {t: [] for t in args.trees}
    order = [t for i in range(args.samples) for t in (args.trees if i % 2 == 0 else args.trees[::-1])]
    argv = [a for a in sys.argv[1:] if a != "--trees" and a not in args.trees]
    for tree in order:
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        cmd = [sys.executable, __file__, "--one", "--workdir", args.workdir, *argv]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results[tree].append(json.loads(out.strip().splitlines()[-1]))
    print(head + f"; {args.samples} processes per tree (medians)")
    base: dict[str, float] = {}
    for tree, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        base = base or med
        print(f"  {tree}: host {med['host_ms']:.2f} ms/step ({med['host_ms'] / base['host_ms']:.2f}x the first), "
              f"step {med['step_ms']:.2f} ms; host total {med['host_total_s']:.2f} s over {med['steps']:.0f} steps; "
              f"wall {med['wall_s']:.2f} s")  # fmt: skip
        print("    of it: " + parts(med) + runner_part(med, base))


if __name__ == "__main__":
    main()
