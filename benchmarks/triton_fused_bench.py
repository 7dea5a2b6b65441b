"""The fused elementwise Triton kernels (inflight/models/triton_fused.py) against the torch ops they
replace, on the Llama-3-8B shape in bf16 (hidden 4,096, intermediate 14,336, 32 / 8 heads x 128),
at T = 1 / 256 / 2,048 / 8,192 tokens a step. One layer's worth of each op:

    add+norm   x + r, then RMSNorm          (torch: add, rms_norm, mul)     x2 a layer
    silu*up    SiLU(gate) * up of (T, 2I)   (torch: silu, mul)
    rope       q and k rotated in place     (torch: the rotate-half products, roll; the step's
                                             cos / sin gather is left out: it is once a step)
    qk+rope    Qwen3's q / k norm + rope    (torch: 2 x (rms_norm, mul), then the rope above on each)

Each time is `triton.testing.do_bench_cudagraph` (the ops replayed from a CUDA graph, as a decode
step runs them: the device's time, no launch overhead) in us, torch / fused and the ratio; then
`do_bench` (eager launches: at small T the host's launch cost is what shows) for T = 1 and 256.
GB/s is the fused op's bytes (read + written) over its time, against a device-to-device copy
measured in the same run. Data of small T sits in L2 (50 MB on an H100): their GB/s is not HBM's.

    python benchmarks/triton_fused_bench.py              # a GPU; ~30 s on an H100
    TRITON_INTERPRET=1 python benchmarks/triton_fused_bench.py --quick   # rehearsal on CPU: tiny shapes

Then one whole decoder layer of the shape (random weights, Triton attention over a paged cache) as
the model runs it, with the kernels on and off (INFLIGHT_TRITON_FUSED=1 / 0) in the same process:
a batch-1 decode token at context 640 (from a graph, and eager) and a 2,048-token prefill (from a
graph); x 32 layers, the change a token / a step would see.

Prints a table; it never asserts (correctness: tests/model/test_triton_fused.py), but prints the
largest difference between fused and torch outputs over the run (bf16: 0 but for a norm's last bit).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from bench_timing import best_of_two

from inflight import platform
from inflight.models import triton_attention as ta
from inflight.models import triton_fused
from inflight.models.layers import RotaryEmbedding
from inflight.models.llama import ArchSpec, DecoderLayer
from inflight.models.parallel import TensorParallel
from inflight.models.triton_attention import interpreted


@dataclass(frozen=True)
class Shape:
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int


LLAMA3_8B = Shape(4096, 14336, 32, 8, 128)
TINY = Shape(96, 160, 4, 2, 16)
EPS = 1e-5


def timers(device: torch.device) -> tuple[Callable[[Callable[[], object]], float], Callable[[Callable[[], object]], float]]:
    """(graph replay, eager) seconds per call; on CPU (the interpreter) both the best of 2 calls."""
    if device.type == "cuda":
        import triton.testing

        def graphed(fn: Callable[[], object]) -> float:
            return float(triton.testing.do_bench_cudagraph(fn, rep=20)) / 1e3

        def eager(fn: Callable[[], object]) -> float:
            return float(triton.testing.do_bench(fn, warmup=5, rep=20)) / 1e3

        return graphed, eager

    return best_of_two, best_of_two


def ops(t: int, s: Shape, device: torch.device, dtype: torch.dtype) -> dict[str, tuple[Callable, Callable, int]]:
    """name -> (torch fn, fused fn, the fused op's bytes). Each fn returns its outputs (the fused
    rope's: qk, rotated in place, so a second call rotates again: only its time means anything)."""
    size = torch.empty(0, dtype=dtype).element_size()
    x, r = (torch.randn(t, s.hidden, device=device, dtype=dtype) for _ in range(2))
    w = 1 + 0.1 * torch.randn(s.hidden, device=device, dtype=dtype)
    y = 3 * torch.randn(t, 2 * s.inter, device=device, dtype=dtype)
    heads = s.heads + s.kv_heads
    qkv = torch.randn(t, (heads + s.kv_heads) * s.head_dim, device=device, dtype=dtype)
    qk = qkv[:, : heads * s.head_dim].view(t, heads, s.head_dim)  # (T, H + KV, hd) in the GEMM output
    rotary = RotaryEmbedding({"rope_theta": 500000.0}, s.head_dim, 8192).to(device)
    positions = torch.randint(0, 8192, (t,), device=device)
    cos_sin = rotary.cos[positions].unsqueeze(1).to(dtype), rotary.sin[positions].unsqueeze(1).to(dtype)  # torch's lookup
    wq, wk = (1 + 0.1 * torch.randn(s.head_dim, device=device, dtype=dtype) for _ in range(2))
    hd = s.head_dim

    def torch_norm() -> tuple:
        sm = x + r
        return sm, w * F.rms_norm(sm, (s.hidden,), None, EPS)

    def torch_silu() -> torch.Tensor:
        gate, up = y.split(s.inter, dim=-1)
        return F.silu(gate) * up

    def torch_qk_norm_rope() -> tuple:
        q = rotary.apply(cos_sin, wq * F.rms_norm(qk[:, : s.heads], (hd,), None, EPS))
        k = rotary.apply(cos_sin, wk * F.rms_norm(qk[:, s.heads :], (hd,), None, EPS))
        return q, k

    rows = t * s.hidden * size
    qk_bytes = 2 * t * heads * hd * size + 2 * t * hd * 4  # q and k read + written, the table rows
    return {
        "add+norm": (torch_norm, lambda: triton_fused.rms_norm(x, w, EPS, residual=r), 4 * rows),
        "silu*up": (torch_silu, lambda: triton_fused.silu_mul(y, s.inter), 3 * t * s.inter * size),
        "rope": (lambda: rotary.apply(cos_sin, qk), lambda: triton_fused.rope_(qk, positions, rotary.cos, rotary.sin), qk_bytes),
        "qk+rope": (torch_qk_norm_rope,
                    lambda: triton_fused.rope_(qk, positions, rotary.cos, rotary.sin, (wq, wk, s.heads, EPS)), qk_bytes),
    }  # fmt: skip


def max_diff(a: object, b: object) -> float:
    """Largest |a - b| over the outputs: a tensor or a tuple; (q, k) tuples side by side as in qk."""

    def flat(o: object) -> torch.Tensor:
        parts = o if isinstance(o, tuple) else (o,)
        if parts[0].dim() == 3:  # (T, H, hd), (T, KV, hd) -> (T, H + KV, hd)
            return torch.cat(parts, dim=1).float()
        return torch.cat([p.reshape(-1) for p in parts]).float()

    return float((flat(a) - flat(b)).abs().max())


def _layer(s: Shape, device: torch.device, dtype: torch.dtype) -> tuple[DecoderLayer, RotaryEmbedding]:
    hf = {"hidden_size": s.hidden, "intermediate_size": s.inter, "num_attention_heads": s.heads,
          "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "num_hidden_layers": 1,
          "vocab_size": 128, "rms_norm_eps": EPS, "rope_theta": 500000.0}  # fmt: skip
    with torch.device(device):
        rotary = RotaryEmbedding(hf, s.head_dim, 4096)
        layer = DecoderLayer(ArchSpec(hf), rotary, TensorParallel.single()).to(dtype)
        fresh = RotaryEmbedding(hf, s.head_dim, 4096)  # float32 tables, as the loader keeps them
        rotary.cos, rotary.sin = fresh.cos, fresh.sin
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.02)
    return layer, rotary


def layer_ab(s: Shape, device: torch.device, dtype: torch.dtype, quick: bool,
             graphed: Callable[[Callable[[], object]], float], eager: Callable[[Callable[[], object]], float]) -> None:  # fmt: skip
    """One layer's step as LlamaForCausalLM.forward runs it (the previous MLP output added by the input
    norm, the rope lookup counted per layer), kernels off then on (the ops' table warmed the GPU)."""
    layer, rotary = _layer(s, device, dtype)
    ctx, prefill = (8, 16) if quick else (640, 2048)
    kv = torch.zeros(2, s.kv_heads, ctx + prefill + 16, s.head_dim, device=device, dtype=dtype)
    i32 = dict(dtype=torch.int32, device=device)
    cases = {  # name -> (tokens, TritonMeta, timer)
        "decode": (1, ta.TritonMeta(torch.tensor([0, 1], **i32), torch.tensor([ctx + 1], **i32),
                                    torch.arange(-(-(ctx + 1) // 16), **i32)[None], 1, slot_mapping=torch.tensor([ctx], device=device))),
        "prefill": (prefill, ta.TritonMeta(torch.tensor([0, prefill], **i32), torch.tensor([prefill], **i32),
                                           torch.arange(-(-prefill // 16), **i32)[None], prefill,
                                           slot_mapping=torch.arange(prefill, device=device))),
    }  # fmt: skip
    results: dict[tuple[str, str], float] = {}
    for mode in ("0", "1"):  # each a median over many replays (do_bench); a second pair cost ~5 s
        os.environ["INFLIGHT_TRITON_FUSED"] = mode
        triton_fused.reset()
        for name, (t, meta) in cases.items():
            x, prev = (torch.randn(t, s.hidden, device=device, dtype=dtype) for _ in range(2))
            positions = torch.arange(ctx, ctx + t, device=device) if name == "decode" else torch.arange(t, device=device)

            def step(x: torch.Tensor = x, prev: torch.Tensor = prev, positions: torch.Tensor = positions, meta: ta.TritonMeta = meta) -> object:
                rope = rotary.lookup(positions, dtype)
                res, normed = layer.input_layernorm.add_forward(x, prev)
                return layer.step(res, normed, rope, kv, meta)

            with torch.no_grad():
                step()  # compiles
                timers = [("graph", graphed)] + ([("eager", eager)] if name == "decode" else [])
                for how, measure in timers:
                    key = (f"{name} {how}", mode)
                    results[key] = min(results.get(key, float("inf")), measure(step))
    os.environ.pop("INFLIGHT_TRITON_FUSED")
    triton_fused.reset()
    print(f"; one decoder layer ({'tiny' if quick else '8B'}, {dtype}), us: torch ops / fused, x, saved x 32 layers")
    for case in dict.fromkeys(k for k, _ in results):
        off, on = results[case, "0"], results[case, "1"]
        t = 1 if case.startswith("decode") else prefill
        print(f"  {case:>14} T={t:<5} {off * 1e6:>9.1f} / {on * 1e6:>9.1f}  {off / on:>5.2f}  {(off - on) * 32 * 1e3:>7.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU rehearsal under TRITON_INTERPRET=1)")
    ap.add_argument("--ops-only", action="store_true", help="the ops' table only, not the decoder-layer A/B")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not interpreted() else "cpu")
    if device.type == "cpu" and not interpreted():
        raise SystemExit("no GPU: run it with TRITON_INTERPRET=1 --quick (the rehearsal)")
    shape, tokens = (TINY, [1, 5]) if args.quick else (LLAMA3_8B, [1, 256, 2048, 8192])
    dtype = torch.bfloat16
    graphed, eager = timers(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.current().cpu.name + " (interpreter)"
    src = torch.empty(1 << (20 if args.quick else 30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / graphed(lambda: dst.copy_(src)) / 1e9
    print(f"{name}: device copy {copy:,.0f} GB/s (read + written); {shape}, {dtype}")
    names = ["add+norm", "silu*up", "rope", "qk+rope"]
    print(f"{'T':>5} graphs | " + " | ".join(f"{n:>8} torch/fused us    x  GB/s" for n in names))
    worst = 0.0
    eager_rows = []
    for t in tokens:
        cells = []
        for op, (ref_fn, fused_fn, nbytes) in ops(t, shape, device, dtype).items():
            worst = max(worst, max_diff(ref_fn(), fused_fn()))  # the first call: rope's input untouched yet
            a, b = graphed(ref_fn), graphed(fused_fn)
            cells.append(f"{a * 1e6:>9.1f} / {b * 1e6:>7.1f} {a / b:>5.2f} {nbytes / b / 1e9:>5.0f}")
            if t in tokens[:2]:
                eager_rows.append((t, op, eager(ref_fn), eager(fused_fn)))
        print(f"{t:>5}        | " + " | ".join(cells))
    for t in tokens[:2]:
        row = [(a, b) for tt, _, a, b in eager_rows if tt == t]
        print(f"{t:>5} eager  | " + " | ".join(f"{a * 1e6:>9.1f} / {b * 1e6:>7.1f} {a / b:>5.2f}      " for a, b in row))
    print(f"max |fused - torch| over the outputs: {worst:.2e}", end="" if not args.ops_only else "\n")
    if not args.ops_only:  # 12 lines in all: gpu_check.sh short shows the last 12
        layer_ab(shape, device, dtype, args.quick, graphed, eager)


if __name__ == "__main__":
    main()
