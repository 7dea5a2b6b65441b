"""Quantized-weight speed: inflight's CPU kernels against the bandwidth roofline, oneDNN float32
and (`--llama`) llama.cpp on the same GGUF file.

    python benchmarks/quant_bench.py --kernels                 # kernels alone, Qwen2.5-0.5B shapes
    python benchmarks/quant_bench.py --kernels --qtypes q8_0,q4_k --threads 2

--kernels: per qtype, (1) batch-1 GEMV over a whole model's layers (24 x qkv, o, gate_up,
down of the Qwen2.5-0.5B shape, ~160-400 MB, so out of cache as in decoding): seconds per
token and GB/s of quantized bytes against the read bandwidth measured in this run (x.sum() over
1 GB) = % of roofline; (2) GEMM at 32 and 512 rows (batched decode, prefill chunk) on one
layer's shapes: GFLOP/s against oneDNN float32 packed weights (what the engine runs today).
Weights are random valid blocks of each format (speed does not depend on the values).
"""

from __future__ import annotations

import argparse
import os
import platform as _py_platform
import sys
import time
from pathlib import Path

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from report_parts import _best_seconds as best_seconds  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402

from inflight import platform  # noqa: E402
from inflight.quant import kernels  # noqa: E402
from inflight.quant.weight import QTYPES, QuantWeight  # noqa: E402

QWEN05B = {"hidden": 896, "inter": 4864, "layers": 24, "heads": 14, "kv_heads": 2, "vocab": 151936}
_HALF_AT = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q4_k": (0, 2), "q5_k": (0, 2),
            "q6_k": (208,)}  # fmt: skip
# llama-quantize's type for a K-quant tensor whose rows are not a multiple of 256 (Qwen2.5-0.5B's 896)
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def layer_shapes(cfg: dict[str, int]) -> dict[str, tuple[int, int]]:
    h, i, hd = cfg["hidden"], cfg["inter"], cfg["hidden"] // cfg["heads"]
    return {"qkv": ((cfg["heads"] + 2 * cfg["kv_heads"]) * hd, h), "o": (h, h), "gate_up": (2 * i, h), "down": (h, i)}


def random_weight(qtype: str, n: int, k: int) -> QuantWeight:
    """Random bits in the format's layout with finite, realistic float16 scales."""
    if qtype in FALLBACK and k % 256:
        qtype = FALLBACK[qtype]
    if qtype == "i4g":
        return QuantWeight(qtype, (n, k), torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
                           (torch.randn(n, k // 128) * 0.02).half(), torch.randint(0, 16, (n, k // 128), dtype=torch.uint8),
                           group_size=128)  # fmt: skip
    if qtype == "i8c":
        return QuantWeight(qtype, (n, k), torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) * 0.01)
    elems, nbytes = QTYPES[qtype]
    blocks = torch.randint(0, 256, (n, k // elems, nbytes), dtype=torch.uint8)
    for off in _HALF_AT[qtype]:
        half = (torch.rand(n, k // elems) * 0.02 + 0.001).half()
        blocks[:, :, off : off + 2] = half.view(torch.uint8).view(n, k // elems, 2)
    return QuantWeight(qtype, (n, k), blocks.reshape(n, -1))


def cpu_name() -> str:
    plat = platform.current()
    return f"{plat.cpu.model_name or _py_platform.processor()} ({plat.cpu.name}; {plat.summary()})"


def bench_gemv(qtype: str, cfg: dict[str, int], bandwidth: float, reps: int) -> dict[str, float]:
    shapes = layer_shapes(cfg)
    model = [[random_weight(qtype, n, k) for (n, k) in shapes.values()] for _ in range(cfg["layers"])]
    xs = {k: torch.randn(1, k) for (_, k) in shapes.values()}
    nbytes = sum(w.nbytes for layer in model for w in layer)

    def token() -> None:
        for layer in model:
            for w in layer:
                kernels.matmul(w, xs[w.shape[1]])

    s = best_seconds(token, reps)
    return {"ms_per_token": s * 1e3, "MB": nbytes / 1e6, "GB/s": nbytes / s / 1e9, "roofline_%": 100 * nbytes / s / 1e9 / bandwidth}


def bench_gemm(qtype: str, cfg: dict[str, int], rows: int, reps: int) -> tuple[float, float]:
    """(quantized kernel GFLOP/s, oneDNN float32 packed GFLOP/s) over one layer's four shapes."""
    q_s = f_s = 0.0
    flops = 0
    for n, k in layer_shapes(cfg).values():
        w = random_weight(qtype, n, k)
        x = torch.randn(rows, k)
        q_s += best_seconds(lambda: kernels.matmul(w, x), reps)  # noqa: B023
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k) * 0.02, rows)
        f_s += best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), reps)  # noqa: B023
        flops += 2 * n * k * rows
    return flops / q_s / 1e9, flops / f_s / 1e9


def run_kernels(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    cfg = dict(QWEN05B)
    bandwidth = sum_bandwidth(1 << 30)
    print(f"CPU: {cpu_name()}; threads {args.threads}; quant kernel flavour {platform.current().quant_flavour()}")
    print(f"read bandwidth (x.sum() over 1 GiB float32, {args.threads} threads): {bandwidth:.1f} GB/s")
    print("| qtype | GEMV MB/token | ms/token | GB/s | % roofline | GEMM@32 GFLOP/s (oneDNN fp32) | GEMM@512 GFLOP/s (oneDNN fp32) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for qtype in args.qtypes.split(","):
            g = bench_gemv(qtype, cfg, bandwidth, args.reps)
            m32 = bench_gemm(qtype, cfg, 32, args.reps)
            m512 = bench_gemm(qtype, cfg, 512, max(2, args.reps // 2))
            print(f"| {qtype} | {g['MB']:.0f} | {g['ms_per_token']:.2f} | {g['GB/s']:.1f} | {g['roofline_%']:.0f} % | "
                  f"{m32[0]:.0f} ({m32[1]:.0f}) | {m512[0]:.0f} ({m512[1]:.0f}) |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", action="store_true", help="kernels alone (no model, no llama.cpp)")
    ap.add_argument("--qtypes", default="q8_0,q4_0,q4_k,q5_k,q6_k,i4g,i8c")
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.kernels:
        run_kernels(args)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
