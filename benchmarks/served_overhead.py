"""Served vs offline on one workload: what the server adds per output token.

A tiny random Llama (the tiny byte-level BPE tokenizer; the forward is small, so what is measured
is the engine's and the server's own work): `inflight serve` in a subprocess, the `inflight bench`
client (completions, streamed) sending --requests x (--input-len -> --output-len, ignore_eos) at
--concurrency, then the same workload offline (`LLM.generate`) in this process. Per side: output
tokens/s and CPU ms per output token (the server process's utime + stime over the bench, and its
main thread's: the event loop; the offline process's), and the ratios. CPU per token is the steadier figure on a loaded machine: the
bench client shares the cores with the server, so tokens/s moves with the load.

On the H100 (docs/GPU.md) served / offline was 0.77 on 64 x (512 -> 256) at concurrency 64 (`uni`).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/served_overhead.py
    python benchmarks/served_overhead.py --trees /tmp/before .     # the server from each tree, A B B A
    python benchmarks/served_overhead.py --server-args "" "--distributed-executor-backend mp"  # A B B A

CPU counts every process of the server (an `mp` model worker, an engine process) while the bench runs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report_parts as rp  # benchmarks/ is on sys.path when this runs as a script
from offline_host_cost import cpu_name

from inflight.testing.servers import NO_PROXY


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def loop_cpu_seconds(pid: int) -> float:
    """utime + stime of the server's main thread: the event loop (HTTP, SSE chunks, JSON)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and every live descendant (the server's worker processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += rp.process_cpu_seconds(p)
        todo += children.get(p, [])
    return total


def worker_seconds(url: str) -> tuple[float, float] | None:
    """(busy, idle) seconds of the model worker process from /metrics; None without one (`uni`)."""
    with NO_PROXY.open(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    got = [re.search(rf"^inflight_model_worker_{k}_seconds_total (\S+)$", text, re.M) for k in ("busy", "idle")]
    return (float(got[0].group(1)), float(got[1].group(1))) if got[0] and got[1] else None


def served(path: Path, tree: Path, variant: str, args: argparse.Namespace, log: Path) -> dict[str, float]:
    """One server run; `variant`: extra `inflight serve` arguments, after any leading NAME=value
    environment settings (as a shell reads them)."""
    port = rp.free_port()
    url = f"http://127.0.0.1:{port}"
    words = shlex.split(variant)
    settings = [w for w in itertools.takewhile(lambda w: "=" in w and not w.startswith("-"), words)]
    extra = words[len(settings) :]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(tree.resolve())}
    env |= dict(w.split("=", 1) for w in settings)
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", str(path), "--device", "cpu",
           "--port", str(port), "--max-seq-len", str(args.input_len + args.output_len + 16),
           "--max-num-seqs", str(args.concurrency), "--no-prefix-caching", "--log-level", "warning", *extra]  # fmt: skip
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tree)
    try:
        rp.wait_healthy(proc, url, log, 300)
        bench = argparse.Namespace(num_requests=args.concurrency, input_len=args.input_len,
                                   output_len=args.output_len, max_concurrency=args.concurrency, seed=5)  # fmt: skip
        rp.bench_client(path, url, bench, warmups=2)  # warm: the server's first steps, the client's imports
        bench.num_requests = args.requests
        c0, l0, w0 = tree_cpu_seconds(proc.pid), loop_cpu_seconds(proc.pid), worker_seconds(url)
        own0 = rp.process_cpu_seconds(proc.pid)
        m = rp.bench_client(path, url, bench, warmups=0)["metrics"]
        cpu, loop, w1 = tree_cpu_seconds(proc.pid) - c0, loop_cpu_seconds(proc.pid) - l0, worker_seconds(url)
        own = rp.process_cpu_seconds(proc.pid) - own0  # the server process alone: its children are the rest
    finally:
        rp.stop_server(proc)
    tokens = args.requests * args.output_len
    return {"tok_s": m["output_throughput"], "cpu_ms_per_token": cpu / tokens * 1e3, "failed": m["failed"],
            "loop_ms_per_token": loop / tokens * 1e3, "server_ms_per_token": own / tokens * 1e3,
            "ttft_ms": m["median_ttft_ms"], "tpot_ms": m["median_tpot_ms"],
            "worker_idle": (w1[1] - w0[1]) / max(w1[0] - w0[0] + w1[1] - w0[1], 1e-9) if w0 and w1 else None}  # fmt: skip


def offline(path: Path, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from inflight import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(model=str(path), device="cpu", max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=args.concurrency, enable_prefix_caching=False, progress=False)  # fmt: skip
    g = torch.Generator().manual_seed(5)
    prompts = [{"prompt_token_ids": torch.randint(10, 200, (args.input_len,), generator=g).tolist()} for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:4], params, use_tqdm=False)
    c0, t0 = cpu_s(), time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    tokens = args.requests * args.output_len
    return {"tok_s": tokens / wall, "cpu_ms_per_token": cpu / tokens * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="*", default=["."], help="source trees whose server to run (default: this one)")
    ap.add_argument("--server-args", nargs="*", default=[""],
                    help="variants of extra `inflight serve` arguments, one string each (leading NAME=value words: its environment), run with every tree")
    ap.add_argument("--samples", type=int, default=1, help="server runs per tree")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, server and offline")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="served-overhead-"))
    from inflight.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint("llama", work / "model", max_position_embeddings=args.input_len + args.output_len + 16)
    off = offline(path, args)
    print(f"{cpu_name()}, torch threads {args.threads}; "
          f"{args.requests} x ({args.input_len} -> {args.output_len}) at concurrency {args.concurrency}, tiny Llama")  # fmt: skip
    print(f"  offline: {off['tok_s']:.0f} tok/s, {off['cpu_ms_per_token']:.3f} CPU ms per token")
    variants = [(t, a) for t in args.trees for a in args.server_args]
    order = [v for i in range(args.samples) for v in (variants if i % 2 == 0 else variants[::-1])]
    for i, (tree, extra) in enumerate(order):
        s = served(path, Path(tree), extra, args, work / f"server-{i}.log")
        print(f"  served ({tree}{' ' + extra if extra else ''}): {s['tok_s']:.0f} tok/s ({s['tok_s'] / off['tok_s']:.2f}x offline), "
              f"{s['cpu_ms_per_token']:.3f} CPU ms per token ({s['cpu_ms_per_token'] / off['cpu_ms_per_token']:.2f}x; "
              f"server process {s['server_ms_per_token']:.3f}, its event loop thread {s['loop_ms_per_token']:.3f}); "
              f"TTFT p50 {s['ttft_ms']:.0f} ms, TPOT p50 {s['tpot_ms']:.1f} ms, failed {s['failed']}"
              + ("" if s["worker_idle"] is None else f"; model worker idle {100 * s['worker_idle']:.1f} %"), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
