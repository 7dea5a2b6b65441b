"""Native bf16 weights held twice vs once, on a CPU with bf16 arithmetic (AVX-512 BF16):

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bf16_copies_ab.py [--batch 16 --input-len 32 --output-len 32 --reps 3]

One bf16 random Qwen2.5-0.5B-shaped checkpoint (bf16_weights_ab.py's) loaded twice in this process
at dtype auto (bf16): A oneDNN's packed copy of each weight for batched steps beside the decode
kernel's plain copy for batch 1 (two copies: the loader before our bf16 GEMM, and with
INFLIGHT_BF16_GEMM=0), B as the loader does it now (one copy: our bf16 GEMM, inflight/csrc/
bf16_gemm.c, multiplies batches by the very plain weights the kernel reads), C one copy with
F.linear on them (`--with-flinear`). Prints the resident memory each load added, then batch-1
TPOT and batched output throughput, interleaved per repeat (best of the repeats).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402
from bf16_weights_ab import decode_ab  # noqa: E402

from inflight import LLM, platform  # noqa: E402
from inflight.models import cpu_linear  # noqa: E402
from inflight.testing import checkpoints  # noqa: E402
from inflight.testing.tokenizer import build_tiny_tokenizer  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def load(hf: Path, tok: Path, args: argparse.Namespace, path: str) -> LLM:
    refusal, ours = cpu_linear.packing_refusal, cpu_linear.one_copy_available
    if path == "flinear":
        cpu_linear.packing_refusal = lambda device, dtype: "off (one copy: the kernel's plain weights)"
    if path != "ours":
        cpu_linear.one_copy_available = lambda dtype: False
    try:
        return LLM(model=str(hf), tokenizer=str(tok), device="cpu", max_num_seqs=args.batch,
                   max_model_len=args.input_len + args.output_len + 8, num_kv_blocks=256, progress=False)  # fmt: skip
    finally:
        cpu_linear.packing_refusal, cpu_linear.one_copy_available = refusal, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--with-flinear", action="store_true", help="also C: one copy, F.linear for batches")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "inflight" / "bf16_ab"))
    args = ap.parse_args()
    torch.set_num_threads(min(2, len(os.sched_getaffinity(0))))
    root = Path(args.work)
    hf, tok = root / "hf", root / "tokenizer"
    if not (hf / "model.safetensors").exists():
        checkpoints.make_random_checkpoint(hf, config=checkpoints.QWEN25_05B_CONFIG, dtype=torch.bfloat16)
    if not tok.exists():
        build_tiny_tokenizer(tok)
    print(f"CPU: {platform.current().summary()}; {torch.get_num_threads()} threads; load {os.getloadavg()[0]:.1f}")
    llms, mem = {}, {}
    paths = [("A two copies (oneDNN packed + kernel's)", "onednn"), ("B one copy (our bf16 GEMM + kernel)", "ours")]
    if args.with_flinear:
        paths.append(("C one copy (F.linear + kernel)", "flinear"))
    for name, path in paths:
        before = rss_mib()
        llms[name] = load(hf, tok, args, path)
        mem[name] = rss_mib() - before
        print(f"{name}: +{mem[name]:.0f} MiB RSS | {llms[name].engine.executor.runner.model.cpu_paths.summary}", flush=True)
    decode_ab(llms, mem, args)

if __name__ == "__main__":
    main()
