"""Quantized-weight speed: inflight's CPU kernels against the bandwidth roofline, oneDNN float32
and llama.cpp on the same GGUF file.

    python benchmarks/quant_bench.py                           # vs llama.cpp: Q8_0 and Q4_K_M, 2 threads
    python benchmarks/quant_bench.py --types Q8_0 --batch 32 --input-len 128 --output-len 128
    python benchmarks/quant_bench.py --kernels                 # kernels alone, Qwen2.5-0.5B shapes
    python benchmarks/quant_bench.py --paired --pairs 64       # batch-1 vs the paired roofline only
    python benchmarks/quant_bench.py --kernels --qtypes q8_0,q4_k --threads 2

Default (llama.cpp side by side): a random Qwen2.5-0.5B-shaped model (inflight.testing's config:
hidden 896, 24 layers, 14 / 2 heads, intermediate 4864, vocab 151936, tied embeddings) written
as an F16 GGUF, which llama.cpp's own `llama-quantize` turns into Q8_0 and Q4_K_M files; then on
each file, with the same threads: `llama-batched-bench -npp 128 -ntg 128 -npl 1,32` and
inflight's LLM (batch-1 TPOT; 32 x 128 -> 128 offline output tok/s), with the read bandwidth
measured in the same run and the bytes each engine's batch-1 step reads (roofline %), and the CPU
seconds each spent on the batch, and the batch's prefill rate (llama.cpp's S_PP; ours: the batch
with one output token) (CPU: user + system; on a shared, loaded machine the wall times
measure the neighbours; `--llama-poll 0` keeps llama.cpp's idle threads from spinning). llama.cpp
is built once from the sources vendored in the llama-cpp-python sdist (llamacpp.py `llama_build`, cached
under ~/.cache/inflight/llama.cpp; minutes on 2 cores).

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
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from llamacpp import LLAMA_DIR, cpu_seconds, llama_batched, llama_build, llama_quantize, write_model  # noqa: E402
from report_parts import _best_seconds as best_seconds  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402
from roofline import fastest_read, paired_roofline  # noqa: E402

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


# ------------------------------------------------------------------ llama.cpp side by side (llamacpp.py)
def open_llm(path: Path, tok: Path | None, args: argparse.Namespace, **kwargs: Any) -> Any:
    """inflight's LLM on the file, sized for `args.batch` x (input + output)."""
    from inflight import LLM

    return LLM(model=str(path), tokenizer=str(tok) if tok else None, dtype=args.dtype, device="cpu",
               max_num_seqs=args.batch, max_model_len=args.input_len + max(args.output_len, args.pairs + 8) + 8, progress=False,
               enable_prefix_caching=False, **kwargs)  # the warm-up's prompt must not save the batch its prefill  # fmt: skip


def random_prompts(llm: Any, n: int, length: int) -> list[dict[str, list[int]]]:
    vocab = min(150000, llm.engine.config.model.hf_config["vocab_size"])
    gen = torch.Generator().manual_seed(0)
    return [{"prompt_token_ids": torch.randint(10, vocab, (length,), generator=gen).tolist()} for _ in range(n)]


def run_batch(llm: Any, prompts: list[dict[str, list[int]]], n: int) -> float:
    """Seconds to generate n tokens (greedy, no early stop) for every prompt, one LLM.generate."""
    from inflight import SamplingParams

    t0 = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - t0


def ours_batched(llm: Any, prompts: list[dict[str, list[int]]], args: argparse.Namespace) -> dict[str, float]:
    """The batch's output tok/s and CPU seconds (prompts -> args.output_len), then its prefill
    rate: the same prompts with one output token, llama.cpp's S_PP counterpart."""
    import resource

    c0 = cpu_seconds(resource.RUSAGE_SELF)
    offline = run_batch(llm, prompts, args.output_len)
    cpu = cpu_seconds(resource.RUSAGE_SELF) - c0
    prefill = run_batch(llm, prompts, 1)
    return {"tok_s": len(prompts) * args.output_len / offline, "cpu_s": cpu, "pp_tok_s": len(prompts) * args.input_len / prefill}


def ours(path: Path, tok: Path, args: argparse.Namespace) -> dict[str, Any]:
    """inflight on the same file: batch-1 TPOT (ms), `batch` x input -> output tok/s, bytes per step."""
    from inflight.models.linear import linear_layers

    llm = open_llm(path, tok, args)
    runner = llm.engine.executor.runner
    prompts = random_prompts(llm, args.batch, args.input_len)
    run_batch(llm, prompts[:1], 4)  # warm: kernels built, pages touched
    first = min(run_batch(llm, prompts[:1], 1) for _ in range(2))
    whole = run_batch(llm, prompts[:1], args.output_len + 1)
    tpot = (whole - first) / args.output_len
    batched = ours_batched(llm, prompts, args)
    model, kernel = runner.model, runner.decode_kernel
    if kernel is not None and kernel.quant:  # the bytes the fused batch-1 step reads
        weights = kernel.quant_bytes
    else:
        weights = sum(w.nbytes for layer in linear_layers(model) for w in getattr(layer.method, "weights", []))
    paired = paired_steps(llm, prompts[0], weights, args)
    return batched | {"tpot_ms": tpot * 1e3, "bytes": weights, "paths": model.cpu_paths.summary, "paired": paired}


def paired_steps(llm: object, prompt: dict, nbytes: int, args: argparse.Namespace) -> dict[str, object]:  # type: ignore[type-arg]
    """The strict roofline beside the decode (benchmarks/roofline.py): one request's batch-1 engine
    steps (scheduling, the fused C step, sampling, output: what TPOT times), each paired with the
    fastest streaming read of the step's quantized bytes, `args.pairs` pairs."""
    from inflight import SamplingParams

    engine = llm.engine  # type: ignore[attr-defined]
    name, read, best = fastest_read(nbytes, args.threads)
    params = SamplingParams(max_tokens=args.pairs + 8, temperature=0.0, ignore_eos=True)
    engine.add_request(engine.make_request(prompt, params))
    for _ in range(3):
        engine.step()  # the prefill, then warm decodes
    out = paired_roofline(engine.step, read, nbytes, args.pairs)
    while engine.has_unfinished_requests():
        engine.step()
    return {**out, "probe": name, "candidates": best}


def run_paired(args: argparse.Namespace) -> None:
    """--paired: batch-1 against the paired roofline only, on the files already written (no
    llama.cpp run, no batch; ~1 minute a file)."""
    from inflight import LLM

    torch.set_num_threads(args.threads)
    root = Path(args.work)
    print(f"CPU: {cpu_name()}; threads {args.threads}; load average {os.getloadavg()[0]:.1f}")
    for ftype in args.types.split(","):
        path = root / f"model-{ftype}.gguf"
        llm = LLM(model=str(path), tokenizer=str(root / "tokenizer"), dtype=args.dtype, device="cpu", max_num_seqs=1,
                  max_model_len=args.input_len + args.pairs + 32, progress=False)  # fmt: skip
        kernel = llm.engine.executor.runner.decode_kernel
        assert kernel is not None and kernel.quant, "the fused quantized step did not build"
        prompt = {"prompt_token_ids": torch.randint(10, 150000, (args.input_len,)).tolist()}
        pr = paired_steps(llm, prompt, kernel.quant_bytes, args)
        print(f"{ftype}: {kernel.quant_bytes / 1e6:.0f} MB/token; {pr['pairs']} pairs, step then {pr['probe']}: median "
              f"{pr['median_%']:.0f} % of the paired roofline (quartiles {pr['q1_%']:.0f}-{pr['q3_%']:.0f} %), step "
              f"{pr['step_ms']:.1f} ms, probe {pr['probe_gbps']:.1f} GB/s median, {pr['probe_best_gbps']:.1f} best; "
              "candidates' best GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in pr["candidates"].items()), flush=True)
        del llm


def run_llama(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    bin_dir = llama_build()
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    tok, f16 = write_model(root)
    bandwidth = sum_bandwidth(1 << 30)
    print(f"CPU: {cpu_name()}; threads {args.threads}; read bandwidth (x.sum() over 1 GiB, best of 8 probes): {bandwidth:.1f} GB/s")
    print(f"model: random Qwen2.5-0.5B shape; {args.batch} x {args.input_len} -> {args.output_len}; ours --dtype {args.dtype}")
    print(f"| file | MB | llama.cpp batch-1 TPOT ms | ours TPOT ms | ours vs roofline (best probe) | ours vs paired roofline "
          f"| llama.cpp {args.batch}x tok/s | ours tok/s | ours / llama.cpp | CPU s llama.cpp / ours (ratio) "
          "| prefill tok/s llama.cpp / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for ftype in args.types.split(","):
        path = llama_quantize(bin_dir, f16, ftype)
        ll = llama_batched(Path(args.llama_bin) if args.llama_bin else bin_dir, path, args)
        us = ours(path, tok, args)
        bandwidth = max(bandwidth, sum_bandwidth(1 << 30))  # probed again after each run: the best of all
        roof_ms = us["bytes"] / bandwidth / 1e6
        print(f"| {ftype} | {path.stat().st_size / 1e6:.0f} | {ll['tpot_ms']:.1f} | {us['tpot_ms']:.1f} | "
              f"{100 * roof_ms / us['tpot_ms']:.0f} % ({us['bytes'] / 1e6:.0f} MB/token) | {us['paired']['median_%']:.0f} % | "
              f"{ll['tok_s']:.1f} | "
              f"{us['tok_s']:.1f} | {us['tok_s'] / ll['tok_s']:.2f}x | {ll['cpu_s']:.1f} / {us['cpu_s']:.1f} "
              f"({ll['cpu_s'] / us['cpu_s']:.2f}x) | {ll['pp_tok_s']:.0f} / {us['pp_tok_s']:.0f} |", flush=True)
        print(f"  llama.cpp: {ll['cmd']}\n  ours: {us['paths']}\n  read bandwidth, best probe so far: {bandwidth:.1f} GB/s", flush=True)
        pr = us["paired"]
        print(f"  paired roofline (each batch-1 step of ours, then {pr['probe']} over the same {us['bytes'] / 1e6:.0f} MB; "
              f"{pr['pairs']} pairs): median {pr['median_%']:.0f} % (quartiles {pr['q1_%']:.0f}-{pr['q3_%']:.0f} %), "
              f"step {pr['step_ms']:.1f} ms, probe median {pr['probe_gbps']:.1f} GB/s, best {pr['probe_best_gbps']:.1f}; "
              "candidates' best GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in pr["candidates"].items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", action="store_true", help="kernels alone (no model, no llama.cpp)")
    ap.add_argument("--paired", action="store_true", help="batch-1 vs the paired roofline only (files written before)")
    ap.add_argument("--types", default="Q8_0,Q4_K_M", help="llama-quantize file types")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dtype", default="float32", help="ours: activations / KV cache dtype")
    ap.add_argument("--work", default=str(LLAMA_DIR / "models"), help="where the model files are written")
    ap.add_argument("--qtypes", default="q8_0,q4_0,q4_k,q5_k,q6_k,i4g,i8c")
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--llama-bin", help="llama-batched-bench from another build (an AVX2-only one: cmake "
                    "-DGGML_NATIVE=OFF -DGGML_AVX512=OFF, beside INFLIGHT_CPU_FEATURES=avx2)")
    ap.add_argument("--llama-poll", type=int, default=None, help="llama.cpp's --poll (0: no spinning; its default 50)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=32, help="step / read pairs of the paired roofline")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.kernels:
        run_kernels(args)
    elif args.paired:
        run_paired(args)
    else:
        run_llama(args)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
