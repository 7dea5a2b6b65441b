"""Batch-1 GEMV over K-quant / Q8_0 weights of the Llama-3-8B shape (QuantLinear's
ifl_quant_matmul, one activation row): the blocks multiplied straight from the file
(inflight/csrc/quant_gemv.h, "direct") against what ran before it, the same source built with
-DIFLV_OFF ("before": the 8-row groups of quant_gemm.h; the fused decode kernel's qgemv ran the
unpack-then-dot path of quant_kernels.h), interleaved in one run, with the read bandwidth of
x.sum() measured in the same run.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py                 # 2 threads
    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py --threads 1 --flavour avx2

Each line: the weight (qtype, N x K, MB), best-of-reps ms and GB/s of quantized bytes for both
builds, and the speed-up. Random valid blocks (speed does not depend on the values); the
weights total ~1 GB, so every GEMV reads from DRAM, as in decoding.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from quant_bench import cpu_name, random_weight  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402

from inflight import platform  # noqa: E402
from inflight.models.cbuild import compile_cached  # noqa: E402
from inflight.quant import kernels  # noqa: E402

# Llama-3-8B (hidden 4096, intermediate 14336, vocab 128256) as a Q4_K_M file has them
SHAPES = [("q6_k", 128256, 4096, "lm_head"), ("q4_k", 28672, 4096, "gate_up"), ("q6_k", 4096, 14336, "down"),
          ("q5_k", 6144, 4096, "qkv"), ("q8_0", 28672, 4096, "gate_up Q8_0")]  # fmt: skip


def load(flavour: str, off: bool) -> ctypes.CDLL:
    flags = ["-O3", *platform.current().quant_flags(flavour), "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]
    path = compile_cached(kernels.SOURCE, f"quant-{flavour}" + ("-before" if off else ""),
                          flags + (["-DIFLV_OFF"] if off else []))  # fmt: skip
    lib = ctypes.CDLL(str(path))
    lib.ifl_quant_matmul.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flavour", default=None, help="quant kernel flavour (default: the platform's pick)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flavour = args.flavour or platform.current().quant_flavour()
    libs = {"before": load(flavour, True), "direct": load(flavour, False)}
    bw = sum_bandwidth(1 << 30)
    print(f"CPU: {cpu_name()}; flavour {flavour}; threads {args.threads}; x.sum() read {bw:.1f} GB/s")
    print("| weight | qtype | N x K | MB | before ms (GB/s) | direct ms (GB/s) | speed-up |")
    print("|---|---|---|---:|---:|---:|---:|")
    for qtype, n, k, name in SHAPES:
        qw = random_weight(qtype, n, k)
        x = torch.randn(1, k)
        best = {key: float("inf") for key in libs}
        for _ in range(args.reps):  # interleaved: the load moves under both alike
            for key, lib in libs.items():
                t0 = time.perf_counter()
                kernels.matmul(qw, x, lib=lib)
                best[key] = min(best[key], time.perf_counter() - t0)
        ys = [kernels.matmul(qw, x, lib=lib) for lib in libs.values()]
        torch.testing.assert_close(ys[0], ys[1], rtol=1e-4, atol=1e-3 * ys[0].abs().max().item())
        mb = qw.nbytes / 1e6
        cells = " | ".join(f"{best[key] * 1e3:.1f} ({mb / 1e3 / best[key]:.1f})" for key in libs)
        print(f"| {name} | {qtype} | {n} x {k} | {mb:.0f} | {cells} | {best['before'] / best['direct']:.2f}x |",
              flush=True)
        del qw


if __name__ == "__main__":
    main()
