"""The Triton GEMV (inflight/models/triton_gemv.py) against cuBLAS (`F.linear`) on the Llama-3-8B
decode shapes in bf16, at M = 1, 2, 4, 8 rows:

    qkv      6144 x 4096     o        4096 x 4096      gate_up  28672 x 4096
    down     4096 x 14336    lm_head  128256 x 4096    (N x K: W's rows x columns)

Each time is `triton.testing.do_bench_cudagraph` (replayed from a CUDA graph, as a decode step runs:
the device's time, no launch overhead), with the weights rotated over copies that together pass
200 MB, so no call finds its W in the 50 MB L2. GB/s is W's bytes (+ x and y) over the time, against
a device-to-device copy measured in the same run. For M = 1 and 8 a few other tilings run too
(`Config`s below): the fastest per shape is what `triton_gemv.choose` should pick next.

Then `down(SiLU(gate) * up)` from the (M, 2I) gate_up output: Triton's silu_mul + cuBLAS (the model's
path with the fused elementwise kernels), silu_mul + the Triton GEMV (INFLIGHT_TRITON_GEMV=auto) and
`silu_linear` (one launch: INFLIGHT_TRITON_GEMV_SILU=1); and a token's sum:
32 layers x (qkv + o + gate_up + down) + lm_head, cuBLAS / Triton default / Triton's best tiling
per shape, against the weights' bytes at the copy rate.

    python benchmarks/triton_gemv_bench.py                 # a GPU; ~25 s on an H100 (compiles included)
    TRITON_INTERPRET=1 python benchmarks/triton_gemv_bench.py --quick   # rehearsal on CPU: tiny shapes

Prints a table; it never asserts (correctness: tests/model/test_triton_gemv.py), but prints the
largest difference between Triton and cuBLAS outputs in ulps of bf16 (expected: <= 1).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from bench_timing import best_of_two

from inflight import platform
from inflight.models import triton_fused, triton_gemv
from inflight.models.triton_attention import interpreted
from inflight.models.triton_gemv import Config

LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}
TINY = {"qkv": (96, 64), "o": (64, 64), "gate_up": (320, 64), "down": (64, 160), "lm_head": (500, 64)}
PER_TOKEN = {"qkv": 32, "o": 32, "gate_up": 32, "down": 32, "lm_head": 1}
# other tilings tried at M = 1 (FMA, and tensor cores on x padded to 16 rows) and M = 8
OTHERS = {
    1: {"fma16": Config(block_n=16), "fma32x256w8": Config(block_n=32, block_k=256, num_warps=8),
        "dot16": Config(block_n=16, block_k=256, dot=True, num_stages=4)},
    8: {"dot16x128s6": Config(block_n=16, block_k=128, dot=True, num_stages=6),
        "dot32x256": Config(block_n=32, block_k=256, dot=True, num_stages=4)},
}  # fmt: skip


def timer(device: torch.device, rep: int) -> Callable[[Callable[[], object]], float]:
    """Seconds per call: from a CUDA graph on a GPU; on CPU (the interpreter) the best of 2 calls."""
    if device.type == "cuda":
        import triton.testing

        return lambda fn: float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")) / 1e3

    return best_of_two


def rotated(n: int, k: int, device: torch.device, quick: bool) -> list[torch.Tensor]:
    """Copies of an (N, K) bf16 weight passing 200 MB together (one when it alone does)."""
    size = n * k * 2
    copies = 1 if quick else max(1, -(-200_000_000 // size))
    return [(torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16) for _ in range(copies)]


def cycling(ws: list[torch.Tensor], call: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """A call that moves to the next copy of W each time (a graph captures the sequence)."""
    state = [0]

    def fn() -> torch.Tensor:
        state[0] = (state[0] + 1) % len(ws)
        return call(ws[state[0]])

    return fn


def ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in bf16 ulps of b."""
    _, exp = torch.frexp(b.float().abs().clamp_min(1e-30))
    return float(((a.float() - b.float()).abs() / torch.ldexp(torch.ones_like(b.float()), exp - 8)).max())


def shape_rows(shapes: dict[str, tuple[int, int]], rows: list[int], device: torch.device, measure: Callable,
               quick: bool) -> tuple[dict, float]:  # fmt: skip
    """{(shape, M): {name: seconds}} for cuBLAS, Triton's default and the other tilings; prints a row each."""
    times: dict[tuple[str, int], dict[str, float]] = {}
    worst = 0.0
    print(f"{'shape':>8} {'M':>2} | {'cuBLAS us':>9} {'GB/s':>5} | {'triton us':>9} {'GB/s':>5} {'x':>5} | best other tiling")
    for name, (n, k) in shapes.items():
        ws = rotated(n, k, device, quick)
        for m in rows:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            worst = max(worst, ulps(triton_gemv.linear(x, ws[0]), F.linear(x, ws[0])))
            row = {"cublas": measure(cycling(ws, lambda w, x=x: F.linear(x, w))),
                   "triton": measure(cycling(ws, lambda w, x=x: triton_gemv.linear(x, w)))}  # fmt: skip
            for label, cfg in OTHERS.get(m, {}).items():
                row[label] = measure(cycling(ws, lambda w, x=x, cfg=cfg: triton_gemv.linear(x, w, config=cfg)))
            times[name, m] = row
            nbytes = n * k * 2 + (m * k + m * n) * 2
            a, b = row["cublas"], row["triton"]
            others = {lb: t for lb, t in row.items() if lb not in ("cublas", "triton")}
            best = min(others, key=others.__getitem__) if others else None
            tail = f"{best} {others[best] * 1e6:.1f} us ({nbytes / others[best] / 1e9:.0f} GB/s)" if best else "-"
            print(f"{name:>8} {m:>2} | {a * 1e6:>9.1f} {nbytes / a / 1e9:>5.0f} | {b * 1e6:>9.1f} {nbytes / b / 1e9:>5.0f}"
                  f" {a / b:>5.2f} | {tail}")  # fmt: skip
    return times, worst


def silu_down_rows(n: int, k: int, rows: list[int], device: torch.device, measure: Callable, quick: bool) -> list[str]:
    """down(SiLU(gate) * up): silu_mul + cuBLAS, silu_mul + the Triton GEMV, the fused `silu_linear`."""
    ws = rotated(n, k, device, quick)
    out = []
    for m in rows:
        gate_up = torch.randn(m, 2 * k, device=device).to(torch.bfloat16)
        a = measure(cycling(ws, lambda w, g=gate_up: F.linear(triton_fused.silu_mul(g, k), w)))
        b = measure(cycling(ws, lambda w, g=gate_up: triton_gemv.linear(triton_fused.silu_mul(g, k), w)))
        c = measure(cycling(ws, lambda w, g=gate_up: triton_gemv.silu_linear(g, w)))
        out.append(f"M={m} {a * 1e6:.1f} / {b * 1e6:.1f} / {c * 1e6:.1f}")
    return out


def copy_rate(nbytes: int, device: torch.device, measure: Callable) -> float:
    """GB/s of a device-to-device copy (bytes read + written)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / measure(lambda: dst.copy_(src)) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU rehearsal under TRITON_INTERPRET=1)")
    ap.add_argument("--rep", type=int, default=10, help="ms of replays a measurement (do_bench_cudagraph's rep)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not interpreted() else "cpu")
    if device.type == "cpu" and not interpreted():
        raise SystemExit("no GPU: run it with TRITON_INTERPRET=1 --quick (the rehearsal)")
    os.environ["INFLIGHT_TRITON_GEMV"] = "1"  # silu_mul's torch twin and the GEMV: both on CPU tensors too
    os.environ["INFLIGHT_TRITON_FUSED"] = "1"
    triton_gemv.reset()
    triton_fused.reset()
    shapes, rows = (TINY, [1, 2]) if args.quick else (LLAMA3_8B, [1, 2, 4, 8])
    measure = timer(device, args.rep)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.current().cpu.name + " (interpreter)"
    copy_gbs = copy_rate(1 << (20 if args.quick else 30), device, measure)
    print(f"{name}: device copy {copy_gbs:,.0f} GB/s (read + written); bf16, weights rotated past 200 MB")
    t0 = time.perf_counter()
    times, worst = shape_rows(shapes, rows, device, measure, args.quick)
    down = silu_down_rows(*shapes["down"], rows, device, measure, args.quick)
    wbytes = sum(n * k * 2 * PER_TOKEN[s] for s, (n, k) in shapes.items())
    print(f"max |triton - cuBLAS|: {worst:.2f} bf16 ulps; {time.perf_counter() - t0:.0f} s")
    print("down(silu*up) us, silu_mul + cuBLAS / silu_mul + triton / fused: " + "; ".join(down))
    print(f"one token ({'tiny' if args.quick else '8B'}: 32 layers + lm_head, {wbytes / 1e9:.2f} GB; "
          f"at the copy rate {wbytes / copy_gbs / 1e6:.3f} ms), ms: cuBLAS / triton / best tiling per shape")  # fmt: skip
    for m in rows:
        cub = sum(times[s, m]["cublas"] * PER_TOKEN[s] for s in shapes)
        tri = sum(times[s, m]["triton"] * PER_TOKEN[s] for s in shapes)
        best = sum(min(t for lb, t in times[s, m].items() if lb != "cublas") * PER_TOKEN[s] for s in shapes)
        picks = ", ".join(f"{s}: {min((lb for lb in times[s, m] if lb != 'cublas'), key=times[s, m].__getitem__)}" for s in shapes)
        print(f"  M={m}: {cub * 1e3:.3f} / {tri * 1e3:.3f} / {best * 1e3:.3f}  ({cub / best:.2f}x; {picks})")


if __name__ == "__main__":
    main()
