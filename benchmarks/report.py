"""One run, the whole speed story side by side: inflight offline, served and batch-1 decode
against Hugging Face `generate`, the batch-1 roofline, and a batch x context sweep.

On the random Qwen2.5-0.5B-shaped bf16 checkpoint with the tiny test tokenizer (built and
cached under /tmp/inflight-bench/ on the first run, as structured_overhead.py does; --model
DIR takes another checkpoint, which needs a tokenizer), with torch threads = all cores:

1. memory read bandwidth (best of 5 of a 1 GiB float32 `x.sum()` and of bf16 oneDNN-packed
   GEMVs over 256 MiB of model-shaped weights), right before and right after step 2;
2. batch-1 decode (--input-len -> --output-len, after a warmup request): TPOT = median
   inter-token gap, against the roofline (weights + lm_head + norms read once per token);
3. a sweep through the offline engine: --sweep-batches x --sweep-contexts prompt lengths;
4. inflight offline (--num-requests requests at once through one `LLM.generate`) and served
   (`inflight serve` in a subprocess, --no-prefix-caching, driven by the `inflight bench`
   client in this process: completions, streamed, --max-concurrency), back to back, --pairs
   times (one warmup each before the first pair); the table shows the pair with the median
   served/offline ratio, the JSON every pair;
5. HF `generate` one request at a time (--hf-single-requests timed) and as a static batch.

Steps 1-4 share one LLM (freed before 5); the server runs throughout step 4. It prints three
markdown tables and whether the targets are met; it never asserts or exits non-zero on a
missed target. The "other" column is how many cores other processes kept busy meanwhile
(bench_timing.py): trust only rows where it is near 0. --dtype auto (the default) runs what the
engine picks for this CPU (inflight/platform.py), and Hugging Face runs in that same dtype; the
CPU's features and the engine's chosen paths (its log line) are recorded with every result.

--compare-dtypes runs instead, side by side, a float32 checkpoint in float32 and the bf16
checkpoint at dtype auto (float32 with bf16 kernel weights on a CPU without native bf16):
offline --num-requests x (--input-len -> --output-len) against HF static batching in the same
dtype, and batch-1 decode against the roofline of the bytes that path reads per token.

    python benchmarks/report.py --wait-quiet 300 --json /tmp/report.json
    python benchmarks/report.py --no-sweep --num-requests 16
    python benchmarks/report.py --compare-dtypes --json /tmp/dtypes.json
    python benchmarks/report.py --quick        # tiny model, seconds: checks that it all runs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import report_parts as rp  # noqa: E402
from report_tables import compare_table, print_report, targets  # noqa: E402

MIB = 1 << 20
FULL = {"num_requests": 32, "input_len": 128, "output_len": 128, "hf_single_requests": 2,
        "sweep_batches": [1, 8, 32], "sweep_contexts": [128, 1024], "sweep_output_len": 64,
        "sum_mib": 1024, "gemv_mib": 256, "server_timeout": 600.0, "pairs": 3}
QUICK = {"num_requests": 4, "input_len": 16, "output_len": 8, "hf_single_requests": 1,
         "sweep_batches": [1], "sweep_contexts": [16, 32], "sweep_output_len": 8,
         "sum_mib": 16, "gemv_mib": 8, "server_timeout": 120.0, "pairs": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="checkpoint with a tokenizer")
    p.add_argument("--cache-root", type=Path, default=Path("/tmp/inflight-bench"))
    p.add_argument("--quick", action="store_true", help="tiny model and workload (a smoke run)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="the engine's dtype (auto: what it picks for this CPU); HF runs in the same")
    p.add_argument("--compare-dtypes", action="store_true",
                   help="float32 vs bf16-checkpoint-at-auto: offline vs HF static, batch-1 vs roofline")
    p.add_argument("--compare-only", choices=("float32", "auto"), default=None,
                   help="--compare-dtypes: run only this one of the two")
    p.add_argument("--retry-busy", type=int, default=0, metavar="N",
                   help="--compare-dtypes: measure a row again (up to N times) while other processes kept "
                        "more than 0.25 cores busy; the least disturbed run is kept")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads, here and in the server (default: all cores)")
    for name in ("num_requests", "input_len", "output_len", "hf_single_requests",
                 "sweep_output_len", "sum_mib", "gemv_mib"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {FULL[name]} ({QUICK[name]} with --quick)")
    for name in ("sweep_batches", "sweep_contexts"):
        p.add_argument("--" + name.replace("_", "-"), type=int, nargs="+", default=None,
                       help=f"default {FULL[name]} ({QUICK[name]} with --quick)")
    p.add_argument("--server-timeout", type=float, default=None, help="seconds to wait for /health")
    p.add_argument("--pairs", type=int, default=None,
                   help=f"offline/served runs, alternating (default {FULL['pairs']}, {QUICK['pairs']} with --quick)")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--max-concurrency", type=int, default=32, help="served: requests in flight")
    p.add_argument("--nominal-bandwidth", type=float, default=75.0, help="GB/s")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the engine's (512 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each measurement wait up to this long for idle cores")
    p.add_argument("--json", type=Path, default=None, help="write everything to this file")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# ------------------------------------------------------------------ measuring
def measure_engine(model: Path, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Bandwidth around batch-1 decode, the sweep, then offline vs served pairs, on one LLM."""
    cfg = rp.model_config(model)
    shape = (cfg["intermediate_size"], cfg["hidden_size"])
    llm = rp.build_llm(model, args)
    paths = rp.decode_paths(llm)
    print(f"[paths] {paths['summary']}", flush=True)
    print("[bandwidth] before batch-1", flush=True)
    before = rp.measure_bandwidth(args.sum_mib * MIB, args.gemv_mib * MIB, shape)
    print(f"[batch-1] {args.input_len} -> {args.output_len} tokens", flush=True)
    batch1 = rp.batch1_row(llm, args)
    eager = batch1_without_kernel(llm, args)
    after = rp.measure_bandwidth(args.sum_mib * MIB, args.gemv_mib * MIB, shape)
    nbytes = rp.bytes_per_token(cfg, paths["weight_bytes"], paths["storage_bytes"])["total_bytes"]
    print("[batch-1] paired with a streaming read of its bytes (the strict roofline)", flush=True)
    paired = rp.paired_batch1(llm, nbytes, 8 if args.quick else 32, args.input_len)
    cells = [] if args.no_sweep else rp.sweep(llm, args)
    pairs = offline_vs_served(llm, model, args, workdir)
    del llm
    gc.collect()
    return {"batch1": batch1, "batch1_eager": eager, "pairs": pairs, "sweep": cells,
            "bandwidth": {"before": before, "after": after}, "paths": paths, "paired": paired}


def batch1_without_kernel(llm: Any, args: argparse.Namespace) -> rp.Row | None:
    """The same batch-1 run with the C decode kernel switched off (the eager PyTorch step)."""
    runner = llm.engine.runner
    kernel = runner.decode_kernel
    if kernel is None:
        return None
    print("[batch-1] again without the C decode kernel", flush=True)
    runner.decode_kernel = None
    try:
        return rp.batch1_row(llm, args)
    finally:
        runner.decode_kernel = kernel


def offline_vs_served(llm: Any, model: Path, args: argparse.Namespace,
                      workdir: Path) -> list[tuple[rp.Row, rp.Row]]:
    """--pairs runs each of offline and served, alternating, the server up throughout: the two
    halves of a pair see the same machine (this VM's memory bandwidth swings ~1.6x in minutes)."""
    pairs = []
    with rp.running_server(model, args, workdir / "server.log") as server:
        for i in range(args.pairs):
            warmups = 1 if i == 0 else 0
            print(f"[offline] {args.num_requests} x ({args.input_len} -> {args.output_len}), "
                  f"pair {i + 1}/{args.pairs}", flush=True)
            offline = rp.offline_row("offline", *rp.offline_metrics(
                llm, args.num_requests, args.input_len, args.output_len, args.seed, warmups,
                args.wait_quiet))
            print(f"[served] inflight serve + inflight bench, pair {i + 1}/{args.pairs}", flush=True)
            pairs.append((offline, rp.served_row(model, server, args, warmups)))
    return pairs


def median_pair(pairs: list[tuple[rp.Row, rp.Row]]) -> tuple[rp.Row, rp.Row]:
    """The pair with the median served/offline throughput ratio (the lower middle one)."""
    ranked = sorted(pairs, key=lambda p: p[1].tok_per_s / p[0].tok_per_s)
    return ranked[(len(ranked) - 1) // 2]


def roofline(cfg: dict[str, Any], bw: dict[str, Any], tpot_ms: float | None,
             args: argparse.Namespace, paths: dict[str, Any]) -> dict[str, Any]:
    counts = rp.bytes_per_token(cfg, paths["weight_bytes"], paths["storage_bytes"])
    best = max(bw["before"]["max_gbps"], bw["after"]["max_gbps"])
    ms_measured = counts["total_bytes"] / (best * 1e9) * 1e3
    ms_nominal = counts["total_bytes"] / (args.nominal_bandwidth * 1e9) * 1e3
    return counts | {
        "bandwidth_before_gbps": bw["before"]["max_gbps"],
        "bandwidth_after_gbps": bw["after"]["max_gbps"], "bandwidth_max_gbps": best,
        "kernels": bw, "nominal_gbps": args.nominal_bandwidth,
        "roofline_ms": ms_measured, "roofline_nominal_ms": ms_nominal, "tpot_ms": tpot_ms,
        "pct_of_roofline": 100 * ms_measured / tpot_ms if tpot_ms else None,
        "pct_of_nominal": 100 * ms_nominal / tpot_ms if tpot_ms else None,
    }  # fmt: skip


def run_all(model: Path, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    engine = measure_engine(model, args, workdir)
    dtype = getattr(torch, engine["paths"]["dtype"])
    print(f"[hf] transformers generate ({engine['paths']['dtype']})", flush=True)
    hf = rp.hf_rows(model, len(rp.tokenizer_of(model)), args, dtype)
    gc.collect()
    offline, served = median_pair(engine["pairs"])
    rows = {r.name: r for r in (offline, served, *hf, engine["batch1"])}
    cfg = rp.model_config(model)
    pairs = [{"offline_tok_per_s": o.tok_per_s, "served_tok_per_s": s.tok_per_s,
              "served_over_offline": s.tok_per_s / o.tok_per_s} for o, s in engine["pairs"]]
    roof = roofline(cfg, engine["bandwidth"], engine["batch1"].tpot_median_ms, args, engine["paths"])
    return {"rows": rows, "sweep": engine["sweep"], "pairs": pairs, "paths": engine["paths"],
            "roofline": roof | {"tpot_eager_ms": engine["batch1_eager"].tpot_median_ms if engine["batch1_eager"] else None,
                                "paired": engine["paired"]}}


# ------------------------------------------------------------------ --compare-dtypes
COMPARED = (("float32", torch.float32, "float32"), ("bf16 ckpt, auto", torch.bfloat16, "auto"))


def compare_dtypes(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """compare_one for each of COMPARED (or the --compare-only one)."""
    return [compare_one(label, ckpt_dtype, dtype, args, workdir) for label, ckpt_dtype, dtype in COMPARED
            if args.compare_only in (None, dtype)]  # fmt: skip


def compare_one(label: str, ckpt_dtype: torch.dtype, dtype: str, args: argparse.Namespace,
                workdir: Path) -> dict[str, Any]:  # fmt: skip
    """A `ckpt_dtype` checkpoint at engine dtype `dtype`: batch-1 decode between two bandwidth
    measurements, then offline, then HF static in the dtype the engine resolved."""
    model = (rp.quick_checkpoint(workdir / f"model-{dtype}", ckpt_dtype) if args.quick
             else rp.default_checkpoint(args.cache_root, ckpt_dtype))  # fmt: skip
    cfg = rp.model_config(model)
    shape = (cfg["intermediate_size"], cfg["hidden_size"])
    run_args = argparse.Namespace(**vars(args) | {"dtype": dtype})
    llm = rp.build_llm(model, run_args)
    paths = rp.decode_paths(llm)
    print(f"[{label}] {paths['summary']}", flush=True)

    def bandwidth() -> dict[str, float]:
        return rp.measure_bandwidth(args.sum_mib * MIB, args.gemv_mib * MIB, shape)

    before, batch1, after = _least_disturbed(args, lambda: (bandwidth(), rp.batch1_row(llm, run_args), bandwidth()), 1)
    print(f"[{label}] offline {args.num_requests} x ({args.input_len} -> {args.output_len})", flush=True)
    offline = _least_disturbed(args, lambda: rp.offline_row("offline", *rp.offline_metrics(
        llm, args.num_requests, args.input_len, args.output_len, args.seed, 1, args.wait_quiet)))
    llm = None
    gc.collect()
    print(f"[{label}] HF static batch ({paths['dtype']})", flush=True)
    vocab, hf_dtype = len(rp.tokenizer_of(model)), getattr(torch, paths["dtype"])
    hf = _least_disturbed(args, lambda: rp.hf_static_row(model, vocab, hf_dtype, run_args))
    gc.collect()
    roof = roofline(cfg, {"before": before, "after": after}, batch1.tpot_median_ms, run_args, paths)
    return {"label": label, "checkpoint_dtype": str(ckpt_dtype).replace("torch.", ""), "paths": paths,
            "offline": vars(offline), "hf_static": vars(hf), "batch1": vars(batch1),
            "vs_hf_static": offline.tok_per_s / hf.tok_per_s if hf.tok_per_s else None, "roofline": roof}  # fmt: skip


def _least_disturbed(args: argparse.Namespace, measure: Any, key: int | None = None) -> Any:
    """measure() once, and again up to --retry-busy times while its row's other load is > 0.25
    cores; the least disturbed result. `key`: the index of the row when measure() returns a tuple."""
    results = []
    for _ in range(1 + args.retry_busy):
        got = measure()
        other = (got if key is None else got[key]).other_cores or 0.0
        results.append((other, got))
        if other <= 0.25:
            break
        print(f"  [busy] other processes kept {other:.2f} cores busy; measuring again", flush=True)
    return min(results, key=lambda r: r[0])[1]


def machine() -> dict[str, Any]:
    """The machine, as the platform module sees it (features, override) and the versions."""
    import transformers

    from inflight import platform

    plat = platform.current()
    return {"cpu": plat.cpu.name, "cpu_model": plat.cpu.model_name, "arch": plat.cpu.arch,
            "cpu_features": sorted(plat.cpu.features), "features_used": sorted(plat.features),
            "override": plat.override, "native_bf16": plat.native_bf16, "kernel_flavour": plat.kernel_flavour(),
            "cores": plat.cpu.num_cores, "platform": plat.summary(), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "python": sys.version.split()[0]}  # fmt: skip


def write_json(path: Path, model: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    payload = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        | {"model_path": str(model), "model_config": rp.model_config(model)},
        "machine": machine(),
        "paths": report["paths"], "rows": {name: vars(r) for name, r in report["rows"].items()},
        "roofline": report["roofline"], "sweep": report["sweep"], "pairs": report["pairs"],
        "targets": report["targets"],
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {path}")


def run_compare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    print(f"--compare-dtypes; threads {args.threads}; {args.num_requests} requests x "
          f"{args.input_len} -> {args.output_len} tokens", flush=True)
    runs = compare_dtypes(args, workdir)
    print("\n" + compare_table(runs))
    print(f"\n{machine()['platform']}; bandwidth = best of x.sum() and bf16 GEMVs, before and after batch-1")
    report = {"compare_dtypes": runs}
    if args.json:
        payload = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                   "machine": machine(), "compare_dtypes": runs}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, default=str))
        print(f"\nwrote {args.json}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
    with tempfile.TemporaryDirectory(prefix="inflight-report-") as tmp:
        workdir = Path(tmp)
        if args.compare_dtypes:
            return run_compare(args, workdir)
        model = (rp.quick_checkpoint(workdir / "model") if args.quick
                 else args.model or rp.default_checkpoint(args.cache_root))
        print(f"model {model}; threads {args.threads}; {args.num_requests} requests x "
              f"{args.input_len} -> {args.output_len} tokens; dtype {args.dtype}", flush=True)
        report = run_all(model, args, workdir)
        report["targets"] = targets(report)
        print_report(report)
        if args.json:
            write_json(args.json, model, args, report)
    return report


if __name__ == "__main__":
    main()
