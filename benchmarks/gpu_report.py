"""The CUDA path in one run (issue: the CUDA path, measured on a GPU), on a Llama-3-8B-shaped
random bf16 model, against Hugging Face `generate` on the same GPU with the same weights:

1. ceilings: device-to-device copy bandwidth (bytes read + written) and a bf16 8192^3 GEMM;
2. HF `generate` as one static batch of --num-requests x (--input-len -> --output-len), and one
   request alone (TPOT), SDPA attention;
3. inflight offline on the same weights (copied from the HF model): the same workload through one
   `LLM.generate`; batch-1 decode TPOT with CUDA graphs and without (`enforce_eager` A/B in the
   same process; eager also with the fused elementwise kernels and split-KV off), and with graphs and --num-scheduler-steps decode passes a step (multi-step,
   docs/MULTISTEP.md), and with graphs on the Triton GEMV (INFLIGHT_TRITON_GEMV, docs/GPU.md), against the roofline (weight bytes read per token / measured copy bandwidth);
   the offline workload again with the runner in the engine's thread (no overlap of the host's work
   with the GPU's: the default before 2026-11-27) and in a worker process (`mp`);
4. served: `inflight serve --load-format dummy` in a subprocess (same shapes; the weights' values do
   not change the work), the `inflight bench` client, --served-requests streamed completions at
   --max-concurrency, once per executor (`uni`: the model in the server's engine thread, sharing
   the event loop's GIL; `mp`: in a worker process, what `inflight serve` runs on CUDA by default),
   then the same workload offline in the servers' absence for the ratios.

    python benchmarks/gpu_report.py --json /tmp/gpu.json            # the issue's figures
    python benchmarks/gpu_report.py --quick                          # a tiny model: checks it runs
    python benchmarks/gpu_report.py --quick --served-only --device cpu   # the served legs, rehearsed on CPU

Prints tables and the targets; it never asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import report_parts as rp  # noqa: E402
from gpu_report_hf import hf_model, hf_rows  # noqa: E402
from gpu_report_print import SERVED, print_report, print_served  # noqa: E402

LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}  # fmt: skip
QUICK_OVERRIDES = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny model and workload")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--hf-batch", type=int, default=256, help="HF static batch size (OOM: halves)")
    p.add_argument("--served-requests", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--batch1-output-len", type=int, default=256)
    p.add_argument("--num-scheduler-steps", type=int, default=8, help="decode passes per engine step of the batch-1 multi-step row (docs/MULTISTEP.md); 1: no such row")
    p.add_argument("--kv-cache-gib", type=float, default=24.0)
    p.add_argument("--skip", nargs="*", default=[], choices=["hf", "served", "mp"])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--served-only", action="store_true", help="only the served legs and their offline run")
    p.add_argument("--served-variants", nargs="*", default=[], choices=["engine-process"],
                   help="served legs beyond uni and mp: engine-process (inflight serve --engine-process)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: rehearse --served-only without a GPU")
    args = p.parse_args(argv)
    if args.device == "cpu" and not args.served_only:
        p.error("--device cpu: only with --served-only (the rest measures the GPU)")
    if args.quick:
        args.num_requests, args.input_len, args.output_len, args.hf_batch = 8, 32, 16, 8
        args.served_requests, args.max_concurrency, args.batch1_output_len = 8, 8, 16
        args.kv_cache_gib = 0.25
    return args


def cuda_time(fn: Any, repeats: int = 5) -> float:
    """Best seconds of `fn` over repeats, CUDA events around each call."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def ceilings(quick: bool) -> dict[str, float]:
    n = (256 if quick else 4096) << 20  # bytes copied
    bufs = [torch.randn(n // 2, dtype=torch.bfloat16, device="cuda")]
    bufs.append(torch.empty_like(bufs[0]))
    copy_s = cuda_time(lambda: bufs[1].copy_(bufs[0]))
    bufs.clear()
    m = 2048 if quick else 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    mm_s = cuda_time(lambda: a @ b)
    return {"copy_gb_s": 2 * n / copy_s / 1e9, "bf16_tflop_s": 2 * m**3 / mm_s / 1e12}


def checkpoint_dir(cfg: dict[str, Any], root: Path) -> Path:
    """config.json + the tiny test tokenizer (ids < its 1000 entries fit any vocab): no weights."""
    from inflight.testing import build_tiny_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    build_tiny_tokenizer(root)
    return root


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes a decode step reads once: every parameter but the embedding table (one row)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)


def make_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n, length), generator=gen).tolist()


# ---------------------------------------------------------------------------- Hugging Face
# ---------------------------------------------------------------------------- inflight
def build_llm(path: Path, args: argparse.Namespace, max_num_seqs: int, **kw: Any) -> Any:
    from inflight import LLM

    return LLM(model=str(path), dtype="bfloat16", device=args.device, max_num_seqs=max_num_seqs,
               max_model_len=args.input_len + max(args.output_len, args.batch1_output_len),
               kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)), enable_prefix_caching=False,
               progress=False, **kw)  # fmt: skip


def offline(llm: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    from inflight import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)  # warmup
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    return {"tok_s": len(prompts) * output_len / seconds, "seconds": seconds,
            "ttft_p50_ms": statistics.median(ttfts) * 1e3}  # fmt: skip


def batch1(llm: Any, args: argparse.Namespace, steps: int = 1) -> float:
    """Time per output token (ms) of one request: --input-len -> --batch1-output-len, `steps`
    decode passes per engine step. (last - first token time) / (tokens - 1): with several passes
    a step's tokens share one time, so the median gap between tokens would be 0."""
    from inflight import SamplingParams

    sched = llm.engine.scheduler
    config, sched.config = sched.config, dataclasses.replace(sched.config, num_scheduler_steps=steps)
    try:
        prompt = {"prompt_token_ids": make_prompts(1, args.input_len, 7)[0]}
        params = SamplingParams(max_tokens=args.batch1_output_len, temperature=0.0, ignore_eos=True)
        llm.generate([prompt], params, use_tqdm=False)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
    finally:
        sched.config = config
    times = out.metrics.token_times
    return (times[-1] - times[0]) / (len(times) - 1) * 1e3


def gemv_ab(llm: Any, args: argparse.Namespace) -> dict[str, float]:
    """Batch-1 TPOT from graphs with the Triton GEMV on (INFLIGHT_TRITON_GEMV=auto; off by default),
    then also with the MLP's down fused with SiLU * up (INFLIGHT_TRITON_GEMV_SILU=1): each time the
    batch-1 graph captured again (the switches are read at capture), then the default graphs back.
    A leg that fails is left out (the error printed); none without graphs."""
    from inflight.models import triton_gemv

    runner = llm.engine.runner
    if runner.graphs is None:
        return {}
    graphs, out = runner.graphs, {}
    legs = {"tpot_gemv_ms": {"INFLIGHT_TRITON_GEMV": "auto"},
            "tpot_gemv_silu_ms": {"INFLIGHT_TRITON_GEMV": "auto", "INFLIGHT_TRITON_GEMV_SILU": "1"}}  # fmt: skip
    for name, env in legs.items():
        os.environ.update(env)
        triton_gemv.reset()
        try:
            runner.graphs = None  # the old batch-1 graph's pool freed before the next capture
            runner.graphs = runner.attention.capture_graphs(runner.model, runner.kv_caches, 1, graphs.block_table.shape[1])
            out[name] = batch1(llm, args)
        except Exception as e:  # noqa: BLE001 -- an A/B row, not the run: say why and go on
            print(f"batch-1 {name} failed:", repr(e), flush=True)
        finally:
            for key in env:
                os.environ.pop(key)
            triton_gemv.reset()
    runner.graphs = graphs
    return out


def eager_launch_ab(llm: Any, args: argparse.Namespace) -> dict[str, float]:
    """Batch-1 eager TPOT with the fused elementwise kernels off, then split-KV off too: the second
    H100 run's eager token took 26.0 ms against 13.1 before them (docs/GPU.md), ~6 Triton launches a
    layer where Triton's Python launch path costs ~50 us; these rows say which launches cost it."""
    from inflight.models import triton_fused

    legs = {"tpot_eager_unfused_ms": {"INFLIGHT_TRITON_FUSED": "0"},
            "tpot_eager_unfused_unsplit_ms": {"INFLIGHT_TRITON_FUSED": "0", "INFLIGHT_ATTN_SPLITS": "1"}}  # fmt: skip
    out = {}
    for name, env in legs.items():
        os.environ.update(env)
        triton_fused.reset()
        try:
            out[name] = batch1(llm, args)
        finally:
            for key in env:
                os.environ.pop(key)
            triton_fused.reset()
    return out


def served(path: Path, args: argparse.Namespace, log: Path, flags: list[str]) -> dict[str, Any]:
    """`inflight serve` on the device + the bench client (the server is the only GPU user); its
    CPU seconds a token count the server's processes (the `mp` model worker too)."""
    import subprocess

    from served_overhead import tree_cpu_seconds, worker_seconds

    port = rp.free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", str(path), "--device", args.device,
           "--dtype", "bfloat16", "--load-format", "dummy", "--port", str(port),
           "--max-seq-len", str(args.input_len + args.output_len), "--max-num-seqs", str(args.max_concurrency),
           "--kv-cache-memory-bytes", str(int(args.kv_cache_gib * (1 << 30))),
           *flags, "--no-prefix-caching", "--log-level", "warning"]  # fmt: skip
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=rp.REPO_ROOT)
    try:
        rp.wait_healthy(proc, url, log, 900)
        bench = argparse.Namespace(num_requests=args.served_requests, input_len=args.input_len,
                                   output_len=args.output_len, max_concurrency=args.max_concurrency, seed=5)  # fmt: skip
        rp.bench_client(path, url, bench, warmups=2)  # the server's first steps (graphs, allocator), the client's imports
        cpu0, w0 = tree_cpu_seconds(proc.pid), worker_seconds(url)
        m = rp.bench_client(path, url, bench, warmups=0)["metrics"]
        cpu, w1 = tree_cpu_seconds(proc.pid) - cpu0, worker_seconds(url)
    finally:
        rp.stop_server(proc)
    row = {"tok_s": m["output_throughput"], "ttft_p50_ms": m["median_ttft_ms"], "tpot_ms": m["median_tpot_ms"],
           "failed": m["failed"], "cpu_ms_per_token": cpu / (args.served_requests * args.output_len) * 1e3}  # fmt: skip
    if w0 and w1:  # mp: the share of the run the model worker waited on the server process between steps
        busy, idle = w1[0] - w0[0], w1[1] - w0[1]
        row["worker_idle_share"] = idle / max(busy + idle, 1e-9)
    return row


def served_rows(path: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both executors served, then the same workload offline (`uni`) for the ratios."""
    rows: dict[str, Any] = {}
    for i, (name, flags) in enumerate(SERVED.items()):
        if name == "served (engine process)" and "engine-process" not in args.served_variants:
            continue
        try:
            rows[name] = served(path, args, work / f"server-{i}.log", flags)
        except Exception as e:  # noqa: BLE001 -- a report row, not the run: say why and go on
            rows[name] = {"error": repr(e)}
        print(name, rows[name], flush=True)
    # the server's step budget (2,048 on a GPU; offline runs take 8,192): served against offline is the serving cost
    llm = build_llm(path, args, max_num_seqs=args.max_concurrency, load_format="dummy",
                    max_num_batched_tokens=2048 if args.device == "cuda" else None)
    rows["offline (served workload)"] = offline(llm, make_prompts(args.served_requests, args.input_len, 5), args.output_len)
    print("offline (served workload)", rows["offline (served workload)"], flush=True)
    return rows


def inflight_on_hf_weights(cfg: dict[str, Any], path: Path, args: argparse.Namespace, report: dict[str, Any]) -> Any:
    """The HF baseline's rows (unless skipped), then the inflight LLM with the same weights copied
    from the HF model, which is freed before any inflight run."""
    hf = hf_model(cfg)
    if "hf" not in args.skip:
        report |= hf_rows(hf, args, make_prompts(args.num_requests, args.input_len, 0))
        print("HF", {k: report[k] for k in ("HF static", "HF single")}, flush=True)
    llm = build_llm(path, args, max_num_seqs=args.num_requests, load_format="dummy")
    from inflight.models.loader import load_weights

    load_weights(llm.engine.runner.model, llm.engine.config.model, hf.state_dict().items())  # the same weights
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return llm


def batch1_rows(llm: Any, args: argparse.Namespace, copy_gb_s: float) -> dict[str, Any]:
    """Batch-1 TPOT with CUDA graphs, multi-step, the GEMV A/B, then eager (graphs off) and its
    launch A/B, against the roofline (weight bytes a token / copy bandwidth)."""
    runner = llm.engine.runner
    wbytes = weight_bytes_per_token(runner.model)
    tpot = batch1(llm, args)
    steps = args.num_scheduler_steps
    tpot_multi = batch1(llm, args, steps) if steps > 1 else None
    gemv = gemv_ab(llm, args)
    graphs, runner.graphs = runner.graphs, None
    tpot_eager = batch1(llm, args)
    eager_ab = eager_launch_ab(llm, args)
    runner.graphs = graphs
    floor_ms = wbytes / (copy_gb_s * 1e9) * 1e3
    row = {"tpot_ms": tpot, "tpot_eager_ms": tpot_eager, "weight_gb": wbytes / 1e9,
           "roofline_ms": floor_ms, "of_roofline": floor_ms / tpot}  # fmt: skip
    row |= eager_ab | gemv
    if tpot_multi is not None:
        row |= {"num_scheduler_steps": steps, "tpot_multistep_ms": tpot_multi, "of_roofline_multistep": floor_ms / tpot_multi}
    return row


def executor_rows(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The offline workload again where the runner runs, against the default (the engine's thread)."""
    legs = {"offline (2,048 tokens a step)": ({}, {"max_num_batched_tokens": 2048}),  # the default until 2026-11-27
            "offline (runner on its own thread)": ({"INFLIGHT_RUNNER_THREAD": "1"}, {}),
            "offline (mp)": ({}, {"distributed_executor_backend": "mp"})}  # fmt: skip
    rows: dict[str, Any] = {}
    for name, (env, kw) in legs.items():
        os.environ.update(env)
        try:
            llm = build_llm(path, args, max_num_seqs=args.num_requests, load_format="dummy", **kw)
            rows[name] = offline(llm, make_prompts(args.num_requests, args.input_len, 1), args.output_len)
        except Exception as e:  # noqa: BLE001 -- a report row, not the run: say why and go on
            rows[name] = {"error": repr(e)}
        finally:
            for key in env:
                os.environ.pop(key)
        print(name, rows[name], flush=True)
        llm = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cfg = dict(LLAMA3_8B, **(QUICK_OVERRIDES if args.quick else {}))
    work = Path(tempfile.mkdtemp(prefix="inflight-gpu-"))
    path = checkpoint_dir(cfg, work / "model")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "config": "quick" if args.quick else "llama3-8b", "args": vars(args) | {"json": str(args.json)}}  # fmt: skip
    if args.served_only:
        report |= served_rows(path, args, work)
        print_served(report)
    else:
        report["ceilings"] = ceilings(args.quick)
        print("ceilings", report["ceilings"], flush=True)
        llm = inflight_on_hf_weights(cfg, path, args, report)
        report["offline"] = offline(llm, make_prompts(args.num_requests, args.input_len, 1), args.output_len)
        print("offline", report["offline"], flush=True)
        report["batch-1"] = batch1_rows(llm, args, report["ceilings"]["copy_gb_s"])
        print("batch-1", report["batch-1"], flush=True)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        if "mp" not in args.skip:
            report |= executor_rows(path, args)
        if "served" not in args.skip:
            report |= served_rows(path, args, work)
        print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
