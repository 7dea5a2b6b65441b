"""Our bf16 GEMM on plain weights (inflight/csrc/bf16_gemm.c) against oneDNN's bf16 GEMM on a
packed copy (what cpu_linear.OneDNNLinear runs), per Qwen2.5-0.5B linear shape and row count,
interleaved in one run (best of the repeats; needs an AVX-512 BF16 CPU):

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bf16_gemm_ab.py [--rows 2,4,8,16,32,64,128 --threads 2]
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

from inflight import platform  # noqa: E402
from inflight.models import bf16_gemm  # noqa: E402

SHAPES = {"[gate; up]": (9728, 896), "down": (896, 4864), "qkv": (1152, 896), "o": (896, 896),
          "lm_head": (151936, 896)}  # fmt: skip


def best_ms(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2,4,8,16,32,64,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best of)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = bf16_gemm.load()
    print(f"CPU: {platform.current().summary()}; {args.threads} threads; load {os.getloadavg()[0]:.1f}")
    print("| shape | rows | ours ms | oneDNN packed ms | ours / oneDNN |\n|---|---:|---:|---:|---:|")
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = torch.randn(n, k).to(torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 32)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k).to(torch.bfloat16)
            reps = 3 if n * k * m > 1e9 else 5 if n > 100000 else 20
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(best_ms(lambda w=w, x=x: bf16_gemm.linear(w, x, lib=lib), reps))
                theirs.append(best_ms(lambda x=x, p=packed: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
                                      reps))  # fmt: skip
            a, b = min(ours), min(theirs)
            print(f"| {name} {n} x {k} | {m} | {a:.3f} | {b:.3f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
