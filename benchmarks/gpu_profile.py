"""Where a CUDA step's time goes, on the Llama-3-8B-shaped model of gpu_report.py (dummy weights:
the values do not change the work). Companion of gpu_report.py for the issue's three gaps:

1. batch-1 decode: engine step wall vs runner.execute wall vs the GPU's kernel time per token
   (torch.profiler), the top kernels, and the engine's Python by cProfile;
2. offline 256 x (512 -> 256) at --step-tokens (max_num_batched_tokens) values: wall split into
   prefill-carrying steps, pure decode steps and the rest, and the top kernels of one decode step
   at full batch and of one prefill step.

    python benchmarks/gpu_profile.py --out /tmp/prof        # on the GPU (device tool: --out $OUT)
    python benchmarks/gpu_profile.py --quick --device cpu    # a tiny model: checks it runs

Prints tables; it never asserts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from gpu_report import LLAMA3_8B, QUICK_OVERRIDES, checkpoint_dir, make_prompts  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--step-tokens", type=int, nargs="*", default=[2048, 8192])
    p.add_argument("--kv-cache-gib", type=float, default=24.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.input_len, args.output_len, args.kv_cache_gib = 8, 32, 16, 0.05
        args.step_tokens = [64, 256]
    return args


def build(path: Path, args: argparse.Namespace, step_tokens: int) -> Any:
    from inflight import LLM

    return LLM(model=str(path), dtype="bfloat16" if args.device == "cuda" else "float32", device=args.device,
               max_num_seqs=args.num_requests, max_num_batched_tokens=step_tokens,
               max_model_len=args.input_len + args.output_len, load_format="dummy",
               kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)), enable_prefix_caching=False, progress=False)  # fmt: skip


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class StepClock:
    """Wraps engine.step and runner.execute: wall per step, tokens and pieces per step; can run
    one chosen runner.execute under torch.profiler."""

    def __init__(self, llm: Any, device: str) -> None:
        self.device, self.rows, self.profile_when, self.tables = device, [], None, {}
        engine, runner = llm.engine, llm.engine.runner
        step, execute = engine.step, runner.execute
        clock = self

        def timed_step() -> Any:
            t0 = time.perf_counter()
            out = step()
            clock.rows[-1]["step_s"] = time.perf_counter() - t0 if clock.rows and "step_s" not in clock.rows[-1] else None
            return out

        def timed_execute(so: Any) -> Any:
            row = {"tokens": so.num_batched_tokens, "pieces": len(so.scheduled)}
            label = clock.profile_when(row) if clock.profile_when else None
            t0 = time.perf_counter()
            if label and label not in clock.tables:
                with torch.profiler.profile(activities=activities(device)) as prof:
                    res = execute(so)
                    sync(device)
                clock.tables[label] = (row, prof)
            else:
                res = execute(so)
            row["exec_s"] = time.perf_counter() - t0
            clock.rows.append(row)
            return res

        engine.step, runner.execute = timed_step, timed_execute  # type: ignore[method-assign]


def activities(device: str) -> list[Any]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def kernel_table(prof: Any, device: str, limit: int = 12) -> tuple[float, str]:
    """(device ms of all kernels, the top `limit` rows by self device time)."""
    events = prof.key_averages()
    if device == "cuda":
        attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        total = sum(getattr(e, attr) for e in events) / 1e3
        return total, events.table(sort_by=attr, row_limit=limit, max_name_column_width=60)
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    return total, events.table(sort_by="self_cpu_time_total", row_limit=limit, max_name_column_width=60)


def generate(llm: Any, prompts: list[list[int]], n: int) -> list[Any]:
    from inflight import SamplingParams

    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def batch1(llm: Any, args: argparse.Namespace, clock: StepClock, log: list[str]) -> None:
    prompt = make_prompts(1, args.input_len, 7)
    generate(llm, prompt, 16)  # warm
    clock.rows.clear()
    t0 = time.perf_counter()
    out = generate(llm, prompt, 128)[0]
    wall = time.perf_counter() - t0
    times = out.metrics.token_times
    tpot = statistics.median(b - a for a, b in zip(times, times[1:])) * 1e3
    decode = [r for r in clock.rows if r["tokens"] == 1]
    ex = statistics.median(r["exec_s"] for r in decode) * 1e3
    st = statistics.median(r["step_s"] for r in decode if r.get("step_s")) * 1e3
    with torch.profiler.profile(activities=activities(args.device)) as prof:
        generate(llm, prompt, 33)
        sync(args.device)
    dev_ms, table = kernel_table(prof, args.device)
    log.append(f"## batch-1 ({args.input_len} -> 128)\nTPOT median {tpot:.2f} ms; engine.step {st:.2f} ms; "
               f"runner.execute {ex:.2f} ms; kernels {dev_ms / 33:.2f} ms a token (33-token profiled run, "
               f"prefill included); wall {wall:.2f} s\n{table}")  # fmt: skip
    pr = cProfile.Profile()
    pr.enable()
    generate(llm, prompt, 64)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    log.append("## batch-1 cProfile (64 tokens), by tottime\n" + s.getvalue()[-6000:])


def offline(llm: Any, args: argparse.Namespace, clock: StepClock, step_tokens: int, log: list[str]) -> None:
    prompts = make_prompts(args.num_requests, args.input_len, 1)
    generate(llm, prompts[:2], 4)
    clock.rows.clear()
    full = args.num_requests

    def pick(row: dict[str, Any]) -> str | None:
        if row["pieces"] == full and row["tokens"] == full:
            return "decode"
        if row["tokens"] > row["pieces"] and row["pieces"] > 4:
            return "prefill"
        return None

    clock.profile_when, clock.tables = pick, {}
    sync(args.device)
    t0 = time.perf_counter()
    generate(llm, prompts, args.output_len)
    wall = time.perf_counter() - t0
    clock.profile_when = None
    rows = clock.rows
    pre = [r for r in rows if r["tokens"] > r["pieces"]]
    dec = [r for r in rows if r["tokens"] == r["pieces"]]
    tok = args.num_requests * args.output_len
    lines = [f"## offline {args.num_requests} x ({args.input_len} -> {args.output_len}), max_num_batched_tokens {step_tokens}",
             f"wall {wall:.2f} s, {tok / wall:.0f} tok/s; {len(rows)} steps; "
             f"prefill-carrying {len(pre)} steps, execute {sum(r['exec_s'] for r in pre):.2f} s; "
             f"pure decode {len(dec)} steps, execute {sum(r['exec_s'] for r in dec):.2f} s "
             f"(median {1e3 * statistics.median([r['exec_s'] for r in dec] or [0]):.2f} ms); "
             f"engine.step - execute {sum((r.get('step_s') or r['exec_s']) - r['exec_s'] for r in rows):.2f} s; "
             f"outside engine.step {wall - sum(r.get('step_s') or r['exec_s'] for r in rows):.2f} s"]  # fmt: skip
    for label, (row, prof) in clock.tables.items():
        dev_ms, table = kernel_table(prof, args.device, 10)
        lines.append(f"### one {label} step ({row['pieces']} pieces, {row['tokens']} tokens): "
                     f"execute {row['exec_s'] * 1e3:.1f} ms (profiled), kernels {dev_ms:.1f} ms\n{table}")  # fmt: skip
    log.append("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = dict(LLAMA3_8B, **(QUICK_OVERRIDES if args.quick else {}))
    path = checkpoint_dir(cfg, Path(tempfile.mkdtemp(prefix="inflight-prof-")) / "model")
    log: list[str] = []

    def flush(last: int = 1) -> None:
        print("\n\n".join(log[-last:]), flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "profile.md").write_text("\n\n".join(log))

    for i, st in enumerate(args.step_tokens):
        t0 = time.perf_counter()
        llm = build(path, args, st)
        log.append(f"# engine built in {time.perf_counter() - t0:.1f} s (max_num_batched_tokens {st})")
        flush()
        clock = StepClock(llm, args.device)
        if i == 0:
            batch1(llm, args, clock, log)
            flush(2)
        offline(llm, args, clock, st, log)
        flush()
        del llm, clock
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
