"""bf16 weights widened in the kernels vs float32 copies, on a CPU without bf16 arithmetic:

    INFLIGHT_CPU_FEATURES=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_WAIT_POLICY=PASSIVE \\
        python benchmarks/bf16_weights_ab.py [--batch 16 --input-len 32 --output-len 32 --reps 3]

One bf16 random Qwen2.5-0.5B-shaped checkpoint loaded twice in this process: A `--dtype float32`
(float32 weights: oneDNN-packed for batches, a bf16 copy for the batch-1 kernel: the path dtype
auto took on AVX2 before) and B `--dtype auto` (float32 model, linear weights kept bf16: the
float kernels for batches, the same tensors for the batch-1 kernel). Prints the resident memory
each load added, then batch-1 TPOT and batched output throughput, A and B interleaved per repeat
(best of the repeats). ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN's float32 GEMM to what an AVX2 CPU
runs, as INFLIGHT_CPU_FEATURES=avx2 does for ours.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402

from inflight import LLM, SamplingParams, platform  # noqa: E402
from inflight.testing import checkpoints  # noqa: E402
from inflight.testing.tokenizer import build_tiny_tokenizer  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "inflight" / "bf16_ab"))
    args = ap.parse_args()
    torch.set_num_threads(min(2, len(os.sched_getaffinity(0))))
    root = Path(args.work)
    hf = root / "hf"
    if not (hf / "model.safetensors").exists():
        checkpoints.make_random_checkpoint(hf, config=checkpoints.QWEN25_05B_CONFIG, dtype=torch.bfloat16)
    tok = root / "tokenizer"
    if not tok.exists():
        build_tiny_tokenizer(tok)
    print(f"CPU: {platform.current().summary()}; {torch.get_num_threads()} threads; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'native')}")  # fmt: skip
    llms, mem = {}, {}
    for name, dtype in (("A float32 copies", "float32"), ("B bf16 widened", "auto")):
        before = rss_mib()
        llms[name] = LLM(model=str(hf), tokenizer=str(tok), dtype=dtype, device="cpu", max_num_seqs=args.batch,
                         max_model_len=args.input_len + args.output_len + 8, num_kv_blocks=256, progress=False)  # fmt: skip
        mem[name] = rss_mib() - before
        print(f"{name}: +{mem[name]:.0f} MiB RSS | {llms[name].engine.executor.runner.model.cpu_paths.summary}", flush=True)
    decode_ab(llms, mem, args)

def decode_ab(llms: dict[str, LLM], mem: dict[str, float], args: argparse.Namespace) -> None:
    """Batch-1 TPOT and batched tok/s of each LLM, interleaved, best of `args.reps`; a table (also
    benchmarks/bf16_copies_ab.py's)."""
    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(10, 150000, (args.input_len,), generator=gen).tolist()}
               for _ in range(args.batch)]  # fmt: skip

    def run(llm: LLM, batch: list, n: int) -> float:  # type: ignore[type-arg]
        t0 = time.perf_counter()
        llm.generate(batch, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t0

    best: dict[str, dict[str, float]] = {name: {"tpot": 1e9, "tok_s": 0.0} for name in llms}
    for llm in llms.values():
        run(llm, prompts[:2], 2)  # warm: kernels built, pages touched
    for rep in range(args.reps):
        for name, llm in llms.items():
            first = run(llm, prompts[:1], 1)
            tpot = (run(llm, prompts[:1], args.output_len + 1) - first) / args.output_len
            tok_s = args.batch * args.output_len / run(llm, prompts, args.output_len)
            best[name] = {"tpot": min(best[name]["tpot"], tpot), "tok_s": max(best[name]["tok_s"], tok_s)}
            print(f"  rep {rep} {name}: batch-1 TPOT {tpot * 1e3:.1f} ms, {args.batch} x {args.input_len} -> "
                  f"{args.output_len}: {tok_s:.1f} tok/s (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    print(f"| path | RSS added MiB | batch-1 TPOT ms | {args.batch}x tok/s |\n|---|---:|---:|---:|")
    for name, b in best.items():
        print(f"| {name} | {mem[name]:.0f} | {b['tpot'] * 1e3:.1f} | {b['tok_s']:.1f} |")


if __name__ == "__main__":
    main()
