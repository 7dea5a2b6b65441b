"""Offline output-token throughput: inflight `LLM.generate` vs Hugging Face `generate`.

Fixed workload: N requests (default 32), each P random prompt token ids (default 128),
each generating exactly O tokens (default 128, eos ignored), on a random-weight model of
Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864,
vocab 151936, tied embeddings, qkv bias). For every dtype in --dtypes it measures:

1. inflight offline engine, all requests in one `LLM.generate` call (after a warmup);
2. HF transformers `generate`, one request at a time (batch 1, greedy), timed over the
   first --hf-single-requests requests and extrapolated as tokens/s;
3. HF transformers `generate`, all requests as one static batch.

It prints a table and whether the targets (inflight >= 10x HF single, >= 2x HF static
batch) are met. It only reports numbers; it never asserts timings. The "other" column is
how many cores other processes kept busy during each measurement: on a small shared
machine (2 cores) one busy neighbour slows a 2-thread run several-fold, so trust only
rows where it is near 0 (--wait-quiet waits for the machine to go idle first).

Run (from the repository root; the first run builds and caches the random checkpoint
under /tmp/inflight-bench/):

    python benchmarks/offline_throughput.py --wait-quiet 300 --json /tmp/bench.json
    python benchmarks/offline_throughput.py --dtypes bfloat16 --repeat 3   # medians of 3
    python benchmarks/offline_throughput.py --dtypes bfloat16
    python benchmarks/offline_throughput.py --skip-inflight --num-requests 4 --output-len 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

# bench_timing and offline_legs sit next to this file: its directory is on sys.path when this runs as a
# script, but not necessarily when it is loaded by path (tests/e2e/test_benchmark_script.py).
if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from bench_timing import OTHER_LOAD_WARN_CORES, fmt_other
from offline_legs import (
    BenchResult,
    bench_hf,
    bench_inflight,
    make_prompts,
    read_vocab_size,
    torch_dtype,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE_ROOT = Path("/tmp/inflight-bench")
# Qwen2.5-0.5B's config.json shape, used only when inflight.testing is unavailable.
FALLBACK_QWEN25_05B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
TARGET_VS_HF_SINGLE = 10.0
TARGET_VS_HF_STATIC = 2.0


# ------------------------------------------------------------------ setup
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated torch dtypes")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--hf-single-requests", type=int, default=4,
                   help="requests timed for HF batch-1 (tokens/s extrapolated from them)")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-inflight", action="store_true")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="use this checkpoint for every dtype instead of a cached random one")
    p.add_argument("--cache-root", type=Path, default=DEFAULT_CACHE_ROOT)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each timed run, wait up to this long for other processes "
                        "to leave the cores idle (shared machines)")
    p.add_argument("--repeat", type=int, default=1,
                   help="time inflight and HF static this many times and report the median "
                        "(VM steal time makes single runs vary by +-15%%)")
    p.add_argument("--json", type=Path, default=None, help="write results to this file")
    return p.parse_args(argv)


# ------------------------------------------------------------------ checkpoint
def ensure_checkpoint(cache_root: Path, dtype_name: str, seed: int) -> Path:
    """The cached random Qwen2.5-0.5B-shape checkpoint for `dtype_name`, built if missing."""
    out_dir = cache_root / f"qwen2.5-0.5b-shape-{dtype_name}"
    if (out_dir / "config.json").exists() and any(out_dir.glob("*.safetensors")):
        print(f"[ckpt] reusing {out_dir}")
        return out_dir
    t0 = time.perf_counter()
    tmp_dir = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)  # left over from an interrupted build
    try:
        from inflight.testing import QWEN25_05B_CONFIG, make_random_checkpoint
    except ImportError:
        how = "transformers (inflight.testing unavailable)"
        _make_checkpoint_with_hf(tmp_dir, torch_dtype(dtype_name), seed)
    else:
        how = "inflight.testing.make_random_checkpoint"
        make_random_checkpoint(tmp_dir, config=QWEN25_05B_CONFIG,
                               dtype=torch_dtype(dtype_name), seed=seed)
    tmp_dir.rename(out_dir)  # only a complete checkpoint ever appears under out_dir
    print(f"[ckpt] built {out_dir} with {how} in {time.perf_counter() - t0:.1f}s")
    return out_dir


def _make_checkpoint_with_hf(out_dir: Path, dtype: torch.dtype, seed: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{k: v for k, v in FALLBACK_QWEN25_05B_CONFIG.items()
                            if k not in ("architectures", "model_type")})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(out_dir)


# ------------------------------------------------------------------ reporting
def ratios(results: list[BenchResult]) -> dict[str, dict[str, float | None]]:
    """Per dtype: inflight tok/s over HF single and over HF static batch (None if missing)."""
    out: dict[str, dict[str, float | None]] = {}
    for dtype in dict.fromkeys(r.dtype for r in results):
        by_engine = {r.engine: r.tok_per_s for r in results if r.dtype == dtype}
        mine = by_engine.get("inflight")
        out[dtype] = {
            f"vs_{name}": (mine / by_engine[name] if mine and by_engine.get(name) else None)
            for name in ("hf-single", "hf-static")
        }
    return out


def _fmt_ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "n/a"


def print_table(results: list[BenchResult]) -> None:
    rs = ratios(results)
    header = (f"{'engine':<10} {'dtype':<9} {'reqs':>5} {'out tokens':>10} {'seconds':>9} "
              f"{'out tok/s':>10} {'vs HF-1':>8} {'vs HF-B':>8} {'TTFT ms':>8} {'other':>6}")
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        mine = r.engine == "inflight"
        ttft = r.extra.get("mean_ttft_ms")
        print(f"{r.engine:<10} {r.dtype:<9} {r.num_requests:>5} {r.output_tokens:>10} "
              f"{r.seconds:>9.2f} {r.tok_per_s:>10.2f} "
              f"{_fmt_ratio(rs[r.dtype]['vs_hf-single']) if mine else '':>8} "
              f"{_fmt_ratio(rs[r.dtype]['vs_hf-static']) if mine else '':>8} "
              f"{f'{ttft:.1f}' if ttft is not None else '':>8} "
              f"{f'{r.other_cores:.2f}' if r.other_cores is not None else '':>6}")
    for r in results:
        if r.engine == "hf-single":
            print(f"note: hf-single {r.dtype} timed {r.extra['timed_requests']} of "
                  f"{r.extra['total_requests']} requests; tok/s extrapolated from them")
    print("'other' = cores kept busy by other processes during the measurement; above "
          f"{OTHER_LOAD_WARN_CORES:g} the figure is likely pessimistic (machine not quiet)")


def print_targets(results: list[BenchResult]) -> None:
    print("\ntargets: inflight >= "
          f"{TARGET_VS_HF_SINGLE:g}x HF single, >= {TARGET_VS_HF_STATIC:g}x HF static batch")
    for dtype, r in ratios(results).items():
        checks = [("HF single", r["vs_hf-single"], TARGET_VS_HF_SINGLE),
                  ("HF static", r["vs_hf-static"], TARGET_VS_HF_STATIC)]
        parts = [f"{name} {_fmt_ratio(v)} -> "
                 f"{'n/a' if v is None else ('MET' if v >= goal else 'NOT met')}"
                 for name, v, goal in checks]
        print(f"  {dtype:<9} " + "; ".join(parts))


def write_json(path: Path, args: argparse.Namespace, results: list[BenchResult]) -> None:
    import transformers

    payload = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "env": {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": sys.version.split()[0], "machine": platform.machine(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads()},
        "results": [asdict(r) | {"tok_per_s": r.tok_per_s} for r in results],
        "ratios": ratios(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {path}")


# ------------------------------------------------------------------ main
def run_dtype(dtype_name: str, args: argparse.Namespace) -> list[BenchResult]:
    ckpt = args.model_dir or ensure_checkpoint(args.cache_root, dtype_name, args.seed)
    prompts = make_prompts(args.num_requests, args.prompt_len, read_vocab_size(ckpt), args.seed)
    results: list[BenchResult] = []
    if not args.skip_inflight:
        print(f"[inflight] {dtype_name}: {len(prompts)} requests", flush=True)
        results.append(bench_inflight(ckpt, dtype_name, prompts, args.output_len, args))
        print(f"  [inflight {dtype_name}] {results[-1].tok_per_s:.2f} tok/s"
              f"{fmt_other(results[-1].other_cores)}", flush=True)
    if not args.skip_hf:
        results.extend(bench_hf(ckpt, dtype_name, prompts, args))
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if str(REPO_ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
        sys.path.insert(0, str(REPO_ROOT))
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # for any worker processes
    torch.set_num_threads(args.threads)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for name in dtypes:
        torch_dtype(name)  # fail fast on a typo
    print(f"workload: {args.num_requests} requests x {args.prompt_len} prompt tokens -> "
          f"{args.output_len} output tokens; dtypes {dtypes}; threads {args.threads}")
    results: list[BenchResult] = []
    for name in dtypes:
        results.extend(run_dtype(name, args))
    print_table(results)
    print_targets(results)
    if args.json:
        write_json(args.json, args, results)


if __name__ == "__main__":
    main()
