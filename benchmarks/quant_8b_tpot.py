"""Batch-1 decode of a Llama-3-8B-shaped GGUF: inflight against llama.cpp on the same file.

    python benchmarks/random_gguf.py /tmp/l3-8b-q4_k_m.gguf --type q4_k_m
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quant_8b_tpot.py /tmp/l3-8b-q4_k_m.gguf [--input-len 16 --output-len 16]

llama.cpp: `llama-batched-bench -npl 1` (built by quant_bench.py's `llama_build`); inflight: LLM on
the file, TPOT = (time of input -> 1 + output tokens - time of input -> 1) / output. Both with the
same threads, one after the other; the read bandwidth (x.sum() over 1 GiB) and the bytes a step
reads (the file's weights but the embedding: the roofline) are printed beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)

import torch  # noqa: E402
from quant_bench import cpu_name, llama_build  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402


def llama_tpot(bin_dir: Path, path: Path, args: argparse.Namespace) -> float:
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(path), "-t", str(args.threads), "-tb", str(args.threads),
           "-npp", str(args.input_len), "-ntg", str(args.output_len), "-npl", "1", "-c", "512"]  # fmt: skip
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit():
            return 1e3 / float(cells[7])  # S_TG t/s
    raise RuntimeError(f"no result from {' '.join(cmd)}")


def ours_tpot(path: Path, args: argparse.Namespace) -> tuple[float, int, str]:
    from inflight import LLM, SamplingParams

    llm = LLM(model=str(path), device="cpu", max_num_seqs=1, max_model_len=512, num_kv_blocks=64, progress=False)
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
    return 1e3 * (whole - first) / args.output_len, kernel.quant_bytes if kernel else 0, runner.model.cpu_paths.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bandwidth = sum_bandwidth(1 << 30)
    print(f"CPU: {cpu_name()}; threads {args.threads}; read bandwidth {bandwidth:.1f} GB/s; {args.file.name} "
          f"{args.file.stat().st_size / 1e9:.2f} GB; {args.input_len} -> {args.output_len}", flush=True)  # fmt: skip
    ll = llama_tpot(llama_build(), args.file, args)
    print(f"llama.cpp batch-1 TPOT {ll:.0f} ms", flush=True)
    us, nbytes, paths = ours_tpot(args.file, args)
    roof = nbytes / bandwidth / 1e6
    print(f"inflight batch-1 TPOT {us:.0f} ms ({us / ll:.2f}x llama.cpp's time; {nbytes / 1e9:.2f} GB a step, "
          f"roofline {roof:.0f} ms = {100 * roof / us:.0f} %)\n  {paths}")  # fmt: skip


if __name__ == "__main__":
    main()
