"""Split-KV decode attention (inflight/models/triton_attention.py) against the unsplit kernel, on the
Llama-3-8B shape (32 query heads, 8 KV heads, head_dim 128, bf16, 16-token pages): one layer's
decode attention at batch 1 / 8 / 64 / 256 x context 640 / 4,096 / 32,768.

Columns: the unsplit kernel (`splits=1`, the path before split-KV), the automatic split count with a
block table as wide as the context (an eager step), and with a table 32,768 tokens wide (a CUDA graph
captured for max_model_len 32,768: more partitions, most of them empty for short rows). Each time is
`triton.testing.do_bench_cudagraph` (the kernels replayed from a graph, as a decode step runs them:
no launch overhead), in us, and the K/V bytes read over it in GB/s, against a device-to-device copy
(bytes read + written) measured in the same run. Calls rotate over block tables covering >= 256 MB
of cache so that no cell reads its K/V from L2 (50 MB on an H100), as a real step, whose weights
pass through L2 between layers, does not either.

    python benchmarks/triton_attn_bench.py              # a GPU; ~30 s on an H100
    TRITON_INTERPRET=1 python benchmarks/triton_attn_bench.py --quick   # rehearsal on CPU: tiny shapes

Prints a table; it never asserts (the split path's correctness: tests/model/test_triton_attention.py),
but it does print each cell's largest difference between the split and unsplit outputs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from inflight import platform
from inflight.models import triton_attention as ta

PAGE = 16
ROTATE_BYTES = 256 << 20  # K/V touched per cell before a table repeats: > 5x an H100's L2
WIDE_TABLE = 32768  # tokens: the graph case's table width


def cells(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return [(1, 96), (2, 40), (3, 200)]
    # batch 256 x 32,768 (34 GB of one layer's K/V, 8.4M tokens) is past an 8B model's KV capacity
    # on one H100 (~470k tokens in its ~60 GB): left out
    return [(b, n) for b in (1, 8, 64, 256) for n in (640, 4096, 32768) if b * n <= 64 * 32768]


def timer(device: torch.device, reps: int) -> Callable[[Callable[[], object]], float]:
    """Seconds per call of fn: from a CUDA graph replay on a GPU, else the best of `reps` calls."""
    if device.type == "cuda":
        import triton.testing

        def graphed(fn: Callable[[], object]) -> float:
            try:
                return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") / 1e3
            except TypeError:  # a Triton without return_mode: its mean
                return triton.testing.do_bench_cudagraph(fn, rep=20) / 1e3

        return graphed

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return best


def copy_gbps(device: torch.device, nbytes: int, measure: Callable[[Callable[[], object]], float]) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / measure(lambda: dst.copy_(src)) / 1e9  # read + written


def rotating(metas: list[ta.TritonMeta], fn: Callable[[ta.TritonMeta], object]) -> Callable[[], None]:
    """fn over the next meta each call (a graph of unrolled calls bakes in each one's table)."""
    calls = 0

    def call() -> None:
        nonlocal calls
        fn(metas[calls % len(metas)])
        calls += 1

    return call


def run_cell(batch: int, ctx: int, heads: tuple[int, int, int], kv: torch.Tensor, dtype: torch.dtype,
             measure: Callable[[Callable[[], object]], float]) -> dict[str, float]:  # fmt: skip
    num_heads, num_kv, hd = heads
    dev = kv.device
    pool_blocks = kv.shape[2] // PAGE
    blocks = -(-ctx // PAGE)
    call_bytes = batch * ctx * num_kv * hd * 2 * kv.element_size()  # K and V
    rotations = max(1, min(-(-ROTATE_BYTES // call_bytes), pool_blocks // (batch * blocks)))
    perm = torch.randperm(pool_blocks, device=dev)[: rotations * batch * blocks].int()
    tables = perm.view(rotations, batch, blocks)
    q = torch.randn(batch, num_heads, hd, device=dev, dtype=dtype)
    out = torch.empty_like(q)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    wide_pad = torch.zeros(batch, max(0, WIDE_TABLE // PAGE - blocks), dtype=torch.int32, device=dev)
    scratch: dict = {}  # one set of partials for all of a cell's calls, as for a step's layers
    metas = {
        "unsplit": [ta.TritonMeta(starts, lens, t, 1, scratch=scratch) for t in tables],
        "auto": [ta.TritonMeta(starts, lens, t, 1, scratch=scratch) for t in tables],
        "auto_wide": [ta.TritonMeta(starts, lens, torch.cat([t, wide_pad], 1), 1, scratch=scratch) for t in tables],
    }
    row: dict[str, float] = {"rotations": rotations, "gb": call_bytes / 1e9}
    outputs = {}
    for name, ms in metas.items():
        splits = 1 if name == "unsplit" else None
        call = rotating(ms, lambda m, s=splits: ta.attention(q, kv, m, PAGE, hd**-0.5, out=out, splits=s))
        call()  # compiles; allocates the partials (reused: the meta's scratch)
        outputs[name] = out.clone()
        row[name] = measure(call)
        width = ms[0].block_table.shape[1] * PAGE
        row[name + "_splits"] = 1 if splits else ta.num_splits(batch, num_kv, width, ta.sm_count(dev))
    ref = outputs["unsplit"].float()
    row["max_diff"] = max(float((o.float() - ref).abs().max()) for o in outputs.values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU rehearsal under TRITON_INTERPRET=1)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not ta.interpreted() else "cpu")
    if device.type == "cpu" and not ta.interpreted():
        raise SystemExit("no GPU: run it with TRITON_INTERPRET=1 --quick (the rehearsal)")
    heads = (4, 2, 16) if args.quick else (32, 8, 128)
    dtype = torch.bfloat16
    grid = cells(args.quick)
    tokens = max(b * -(-n // PAGE) * PAGE for b, n in grid)
    tokens = max(tokens, ROTATE_BYTES // (heads[1] * heads[2] * 4)) if not args.quick else tokens
    kv = torch.randn(2, heads[1], tokens, heads[2], device=device, dtype=dtype)  # one layer's paged K/V
    measure = timer(device, reps=1 if args.quick else 5)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.current().cpu.name + " (interpreter)"
    copy = copy_gbps(device, 1 << 20 if args.quick else 1 << 30, measure)
    print(f"{name}: {ta.sm_count(device)} SMs; device copy {copy:,.0f} GB/s (read + written); heads {heads}, {dtype}", flush=True)
    print(f"{'batch':>5} {'ctx':>6} {'K/V MB':>8} | {'unsplit us':>10} {'GB/s':>6} | "
          f"{'auto us':>8} {'GB/s':>6} {'splits':>6} {'x':>5} | {'wide us':>8} {'splits':>6} {'x':>5} | max diff")  # fmt: skip
    for batch, ctx in grid:
        r = run_cell(batch, ctx, heads, kv, dtype, measure)
        gb = r["gb"]
        print(f"{batch:>5} {ctx:>6} {gb * 1e3:>8.1f} | {r['unsplit'] * 1e6:>10.1f} {gb / r['unsplit']:>6.0f} | "
              f"{r['auto'] * 1e6:>8.1f} {gb / r['auto']:>6.0f} {r['auto_splits']:>6} {r['unsplit'] / r['auto']:>5.2f} | "
              f"{r['auto_wide'] * 1e6:>8.1f} {r['auto_wide_splits']:>6} {r['unsplit'] / r['auto_wide']:>5.2f} | "
              f"{r['max_diff']:.1e}", flush=True)  # fmt: skip
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
