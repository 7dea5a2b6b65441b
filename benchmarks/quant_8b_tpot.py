"""Decode of a large GGUF (the Llama-3-8B shape): inflight against llama.cpp on the same file.

    python benchmarks/random_gguf.py /tmp/l3-8b-q4_k_m.gguf --type q4_k_m
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quant_8b_tpot.py /tmp/l3-8b-q4_k_m.gguf [--input-len 16 --output-len 16]
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quant_8b_tpot.py /tmp/l3-8b-q4_k_m.gguf --batch 32 --input-len 32 --output-len 32 --llama-poll 0

Batch 1 (the default): llama.cpp `llama-batched-bench -npl 1` (built by llamacpp.py's
`llama_build`); inflight: LLM on the file, TPOT = (time of input -> 1 + output tokens - time of
input -> 1) / output, best of 3. The read bandwidth (x.sum() over 1 GiB) and the bytes a step reads
(the file's weights but the embedding: the roofline) are printed beside them.

`--batch N` (N > 1): the batched side by side of quant_bench.py on any existing file (quant_bench
writes its own 0.5B-shaped ones): `llama-batched-bench -npl N` against one LLM.generate of N
prompts of --input-len random ids -> --output-len tokens; output tok/s, CPU seconds of each
whole run, prefill tok/s (llama.cpp's S_PP; ours: the same prompts -> 1 token), the ratios, and
our RSS (steady after the runs, and the peak). Both with the same threads, one after the other.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)

import llamacpp  # noqa: E402
import quant_bench as qb  # noqa: E402
import torch  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402

BLOCK_SIZE = 16  # the engine's default tokens per KV block


def llama_tpot(bin_dir: Path, path: Path, args: argparse.Namespace) -> float:
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(path), "-t", str(args.threads), "-tb", str(args.threads),
           "-npp", str(args.input_len), "-ntg", str(args.output_len), "-npl", "1", "-c", "512"]  # fmt: skip
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            return 1e3 / float(cells[7])  # S_TG t/s
    raise RuntimeError(f"no result from {' '.join(cmd)}")


def ours_tpot(path: Path, args: argparse.Namespace) -> tuple[float, int, str, dict | None]:  # type: ignore[type-arg]
    from inflight import LLM, SamplingParams

    llm = LLM(model=str(path), tokenizer=str(args.tokenizer) if args.tokenizer else None, device="cpu", dtype=args.dtype,
              max_num_seqs=1, max_model_len=512, num_kv_blocks=64, progress=False)  # fmt: skip
    runner = llm.engine.executor.runner
    prompt = [{"prompt_token_ids": list(range(100, 100 + args.input_len))}]

    def run(n: int) -> float:
        t0 = time.perf_counter()
        llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0

    run(2)  # warm
    # best of 3 each: one sample of each once gave a 35 ms "TPOT" (572 % of the roofline) when the
    # prefill-only run was the one descheduled on the shared machine
    first = min(run(1) for _ in range(3))
    whole = min(run(args.output_len + 1) for _ in range(3))
    kernel = runner.decode_kernel
    nbytes = kernel.quant_bytes if kernel else 0
    # the strict roofline beside the steps themselves (quant_bench.paired_steps; this VM's bandwidth moves second to second)
    paired = qb.paired_steps(llm, prompt[0], nbytes, args) if args.pairs and nbytes else None
    return 1e3 * (whole - first) / args.output_len, nbytes, runner.model.cpu_paths.summary, paired


def run_tpot(args: argparse.Namespace) -> None:
    bandwidth = sum_bandwidth(1 << 30)
    print(f"CPU: {qb.cpu_name()}; threads {args.threads}; read bandwidth {bandwidth:.1f} GB/s; {args.file.name} "
          f"{args.file.stat().st_size / 1e9:.2f} GB; {args.input_len} -> {args.output_len}", flush=True)  # fmt: skip
    ll = llama_tpot(Path(args.llama_bin) if args.llama_bin else llamacpp.llama_build(), args.file, args)
    print(f"llama.cpp batch-1 TPOT {ll:.0f} ms", flush=True)
    us, nbytes, paths, pr = ours_tpot(args.file, args)
    roof = nbytes / bandwidth / 1e6
    print(f"inflight batch-1 TPOT {us:.0f} ms ({us / ll:.2f}x llama.cpp's time; {nbytes / 1e9:.2f} GB a step, "
          f"roofline (best probe) {roof:.0f} ms = {100 * roof / us:.0f} %)\n  {paths}")  # fmt: skip
    if pr:
        print(f"  paired roofline: {pr['pairs']} steps, each then {pr['probe']} over the same bytes: median "
              f"{pr['median_%']:.0f} % (quartiles {pr['q1_%']:.0f}-{pr['q3_%']:.0f} %), step {pr['step_ms']:.0f} ms, "
              f"probe {pr['probe_gbps']:.1f} GB/s median, {pr['probe_best_gbps']:.1f} best")  # fmt: skip


def rss_mib() -> tuple[float, float]:
    """(steady, peak) resident MiB of this process (llama.cpp runs in a child: not counted)."""
    with open("/proc/self/status") as f:
        now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return now / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def command_line() -> str:
    """This run's command, with the environment that changes what runs (for the report)."""
    env = [f"{k}={os.environ[k]}" for k in ("INFLIGHT_CPU_FEATURES", "OMP_WAIT_POLICY") if k in os.environ]
    return " ".join([*env, "python", *sys.argv])


def run_batched(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    print(f"CPU: {qb.cpu_name()}; threads {args.threads}; {args.file.name} {args.file.stat().st_size / 1e9:.2f} GB; "
          f"{args.batch} x {args.input_len} -> {args.output_len}; ours --dtype {args.dtype}", flush=True)  # fmt: skip
    ll = llamacpp.llama_bench(Path(args.llama_bin) if args.llama_bin else llamacpp.llama_build(), args.file, args.batch, args)
    print(f"llama.cpp: {ll['tok_s']:.2f} tok/s, {ll['cpu_s']:.1f} CPU s, prefill {ll['pp_tok_s']:.1f} tok/s "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    blocks = args.batch * -(-(args.input_len + args.output_len + 8) // BLOCK_SIZE) + 8
    llm = qb.open_llm(args.file, args.tokenizer, args, num_kv_blocks=blocks, block_size=BLOCK_SIZE)
    prompts = qb.random_prompts(llm, args.batch, args.input_len)
    qb.run_batch(llm, prompts[:1], 2)  # warm: kernels built, pages touched
    us = qb.ours_batched(llm, prompts, args)
    steady, peak = rss_mib()
    print(f"| file | GB | llama.cpp {args.batch}x tok/s | ours tok/s | ours / llama.cpp | CPU s llama.cpp / ours (ratio) "
          "| prefill tok/s llama.cpp / ours | ours RSS steady / peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.file.name} | {args.file.stat().st_size / 1e9:.2f} | {ll['tok_s']:.2f} | {us['tok_s']:.2f} | "
          f"{us['tok_s'] / ll['tok_s']:.2f}x | {ll['cpu_s']:.1f} / {us['cpu_s']:.1f} ({ll['cpu_s'] / us['cpu_s']:.2f}x) | "
          f"{ll['pp_tok_s']:.1f} / {us['pp_tok_s']:.1f} | {steady:,.0f} / {peak:,.0f} |")  # fmt: skip
    print(f"  llama.cpp: {ll['cmd']}\n  ours: {llm.engine.executor.runner.model.cpu_paths.summary}\n"
          f"  command: {command_line()}\n({time.perf_counter() - t0:.0f} s)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--batch", type=int, default=1, help="1: batch-1 TPOT; N > 1: N x input -> output throughput")
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--dtype", default="auto", help="ours: activations / KV cache dtype")
    ap.add_argument("--tokenizer", type=Path, help="ours: a tokenizer directory (random_gguf.py's no-vocab files need none; quant_bench's do)")
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--llama-bin", help="llama-batched-bench from another build (quant_bench.py --help)")
    ap.add_argument("--llama-poll", type=int, default=None, help="llama.cpp's --poll (0: no spinning; its default 50)")
    ap.add_argument("--pairs", type=int, default=16, help="batch-1: step / read pairs of the paired roofline (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run_batched(args) if args.batch > 1 else run_tpot(args)


if __name__ == "__main__":
    main()
