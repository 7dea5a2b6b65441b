"""Measurements behind benchmarks/report.py: bandwidth, roofline bytes, inflight, server, HF.

Each function measures one thing and returns plain numbers; report.py decides the order,
prints the tables and writes the JSON. Reused, not copied: the Hugging Face baselines come
from offline_legs.py (offline_throughput.py's), the workload and metrics from inflight.bench.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import offline_legs as legs  # noqa: E402
from bench_timing import Timer, wait_until_quiet  # noqa: E402

from inflight.testing.servers import stop_server, wait_healthy  # noqa: E402,F401 (callers also use rp.stop_server)

REPO_ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def quiet(max_wait_s: float) -> None:
    """bench_timing.wait_until_quiet, skipped at 0 (it warns "still busy" when given 0 s)."""
    if max_wait_s > 0:
        wait_until_quiet(max_wait_s)


@dataclass
class Row:
    """One line of the main table (tok/s over output tokens; latencies in ms)."""

    name: str
    tok_per_s: float
    ttft_p50_ms: float | None
    tpot_median_ms: float | None
    other_cores: float | None
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ checkpoints
def quick_checkpoint(out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """A 2-layer Qwen2-shaped checkpoint (bf16 by default) with the tiny tokenizer (ids 0..999)."""
    from inflight.testing import QWEN25_05B_CONFIG, build_tiny_tokenizer, make_random_checkpoint

    shrunk = QWEN25_05B_CONFIG | {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
        "bos_token_id": 0, "eos_token_id": 2,  # the tiny tokenizer's <|endoftext|>, <|im_end|>
    }  # fmt: skip
    make_random_checkpoint(out_dir, config=shrunk, dtype=dtype, seed=0)
    build_tiny_tokenizer(out_dir)
    return out_dir


def default_checkpoint(cache_root: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The random Qwen2.5-0.5B-shaped checkpoint (bf16, or float32) with the tiny tokenizer (cached)."""
    from structured_overhead import checkpoint

    if dtype == torch.bfloat16:
        return checkpoint(cache_root)
    from inflight.testing import QWEN25_05B_CONFIG, build_tiny_tokenizer, make_random_checkpoint

    path = cache_root / "qwen05b-fp32-tok"
    if not (path / "model.safetensors").exists():
        make_random_checkpoint(path, config=QWEN25_05B_CONFIG, dtype=dtype, seed=0)
        build_tiny_tokenizer(path)
    return path



def model_config(model: Path) -> dict[str, Any]:
    from inflight.testing import read_config

    cfg = read_config(model)
    return cfg.get("text_config", cfg)


def tokenizer_of(model: Path) -> Any:
    from inflight.bench.dataset import load_tokenizer

    tok = load_tokenizer(str(model))
    if tok is None:
        raise SystemExit(f"{model} has no tokenizer (the served run's random prompts need one)")
    return tok


# ------------------------------------------------------------------ roofline bytes
def bytes_per_token(cfg: dict[str, Any], weight_bytes: int, storage_bytes: int | None = None) -> dict[str, int]:
    """Bytes one batch-1 decode step must read: every linear weight and the lm_head (in the dtype
    the decode path reads them: the C kernel reads bf16 copies of a bf16 checkpoint served in
    float32), norms, biases and one embedding row (in the model's dtype, `storage_bytes`)."""
    from inflight.models.llama import ArchSpec

    storage_bytes = storage_bytes or weight_bytes
    spec = ArchSpec(cfg)
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    attn = spec.hidden * (q + 2 * kv) + q * spec.hidden
    biases = (q + 2 * kv) * spec.qkv_bias + spec.hidden * spec.o_bias
    biases += (2 * spec.intermediate + spec.hidden) * spec.mlp_bias
    norms = 2 * spec.hidden + 2 * spec.head_dim * spec.qk_norm
    parts = {
        "attention": spec.num_layers * attn * weight_bytes,
        "mlp": spec.num_layers * 3 * spec.hidden * spec.intermediate * weight_bytes,
        "biases": spec.num_layers * biases * storage_bytes,
        "norms": (spec.num_layers * norms + spec.hidden) * storage_bytes,
        "lm_head": spec.vocab_size * spec.hidden * weight_bytes, "embedding_row": spec.hidden * storage_bytes,
    }  # fmt: skip
    out = {f"{k}_bytes": v for k, v in parts.items()}
    out["total_bytes"] = sum(out.values())
    return out


def decode_paths(llm: Any) -> dict[str, Any]:
    """What this LLM runs with (the engine's log line) and the bytes per weight its batch-1 decode reads."""
    model = llm.engine.runner.model
    paths = model.cpu_paths
    dtype = llm.engine.config.model.dtype
    read = paths.kernel_weights if paths.kernel_weights is not None and llm.engine.runner.decode_kernel else dtype
    return {"summary": paths.summary, "dtype": str(dtype).replace("torch.", ""), "packed": paths.packed,
            "kernel": paths.kernel, "weight_bytes": read.itemsize, "storage_bytes": dtype.itemsize}


# ------------------------------------------------------------------ memory bandwidth
def _best_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm: page faults, oneDNN primitive creation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sum_bandwidth(nbytes: int, repeats: int = 5, samples: int = 8, gap_s: float = 0.25) -> float:
    """GB/s of x.sum() over an nbytes float32 tensor: the best of `samples` probes `gap_s` apart.
    A VM's read bandwidth moves with its neighbours' traffic (the Zen 4 VM of the docs read
    25.1-38.0 GB/s in four probes two seconds apart), so one probe may set a roofline a kernel
    "beats"; the best of several is the machine's capacity, the strict roofline."""
    from inflight import memory

    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    memory.huge_pages([x])  # the fastest read, as the weights are held (benchmarks/roofline.py)
    best = 0.0
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        best = max(best, x.numel() * 4 / _best_seconds(lambda: x.sum(), repeats) / 1e9)
    return best


def gemv_bandwidth(nbytes: int, shape: tuple[int, int], repeats: int = 5) -> float:
    """GB/s of bf16 GEMVs (1, K) x (N, K)^T over weights totalling ~nbytes: oneDNN-packed where
    the platform module packs bf16, else plain F.linear."""
    from inflight.models.cpu_linear import cpu_packing_available, pack_weight

    n, k = shape
    count = max(1, nbytes // (n * k * 2))
    weights = [torch.full((n, k), 0.01, dtype=torch.bfloat16) for _ in range(count)]
    x1 = torch.full((1, k), 0.5, dtype=torch.bfloat16)
    if cpu_packing_available(torch.device("cpu"), torch.bfloat16):
        packed = [pack_weight(w) for w in weights]

        def run() -> None:
            for p in packed:
                torch.ops.mkldnn._linear_pointwise(x1, p, None, "none", [], "")
    else:  # not packed on this CPU: the plain GEMV

        def run() -> None:
            for w in weights:
                torch.nn.functional.linear(x1, w)

    seconds = _best_seconds(run, repeats)
    return count * n * k * 2 / seconds / 1e9


def measure_bandwidth(sum_bytes: int, gemv_bytes: int, shape: tuple[int, int]) -> dict[str, float]:
    with torch.inference_mode():
        sums, gemv = sum_bandwidth(sum_bytes), gemv_bandwidth(gemv_bytes, shape)
    return {"sum_gbps": sums, "gemv_bf16_gbps": gemv, "max_gbps": max(sums, gemv)}


# ------------------------------------------------------------------ inflight offline
def build_llm(model: Path, args: argparse.Namespace) -> Any:
    from inflight import LLM

    return LLM(
        model=str(model), dtype=args.dtype, device="cpu", max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=False, progress=False,
    )  # fmt: skip


def offline_metrics(llm: Any, num: int, input_len: int, output_len: int, seed: int,
                    warmups: int, wait_quiet_s: float) -> tuple[dict[str, Any], Timer]:
    """inflight.bench's random workload through llm.generate; (bench metrics, timer)."""
    from inflight.bench.dataset import random_requests
    from inflight.bench.metrics import summarize
    from inflight.bench.offline import run_offline

    tok = llm.get_tokenizer()
    requests = random_requests(tok, num, input_len, output_len, 0.0, seed=seed)
    warm = random_requests(tok, warmups, input_len, output_len, 0.0, seed=seed + 1)
    quiet(wait_quiet_s)
    with Timer() as timer:
        results, duration = run_offline(llm, requests, warm, True, 0.0, False)
    return summarize(results, duration), timer


def offline_row(name: str, metrics: dict[str, Any], timer: Timer) -> Row:
    return Row(name, metrics["output_throughput"], metrics["median_ttft_ms"],
               metrics["median_tpot_ms"], timer.other_cores,
               {k: metrics[k] for k in ("completed", "failed", "total_output_tokens",
                                        "duration_s", "p90_ttft_ms", "median_itl_ms",
                                        "num_output_len_mismatch")})


def batch1_row(llm: Any, args: argparse.Namespace) -> Row:
    """One request after a warmup one; TPOT = median inter-token gap."""
    m, timer = offline_metrics(llm, 1, args.input_len, args.output_len, args.seed + 2, 1,
                               args.wait_quiet)
    tpot = m["median_itl_ms"]
    extra = {"tpot_e2e_minus_ttft_ms": m["median_tpot_ms"],
             "output_tokens": m["total_output_tokens"], "failed": m["failed"]}
    return Row("batch-1 decode", 1000.0 / tpot if tpot else float("nan"), m["median_ttft_ms"],
               tpot, timer.other_cores, extra)


def paired_batch1(llm: Any, nbytes: int, pairs: int, input_len: int) -> dict[str, Any]:
    """The strict roofline beside the decode (benchmarks/roofline.py): one request's batch-1
    engine steps, each paired with the fastest streaming read of the `nbytes` a step reads, on
    the same threads; the median of the per-pair ratios read time / step time."""
    from roofline import fastest_read, paired_roofline

    from inflight import SamplingParams

    engine = llm.engine
    name, read, best = fastest_read(nbytes, torch.get_num_threads())
    ids = torch.randint(10, 1000, (input_len,), generator=torch.Generator().manual_seed(3)).tolist()
    engine.add_request(engine.make_request({"prompt_token_ids": ids}, SamplingParams(
        max_tokens=pairs + 8, temperature=0.0, ignore_eos=True)))  # fmt: skip
    for _ in range(3):
        engine.step()  # the prefill, then warm decodes
    out = paired_roofline(engine.step, read, nbytes, pairs)
    while engine.has_unfinished_requests():
        engine.step()
    return {**out, "probe": name, "candidates": best}


def sweep(llm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    cells = []
    grid = itertools.product(args.sweep_batches, args.sweep_contexts)
    for i, (batch, ctx) in enumerate(grid):
        m, timer = offline_metrics(llm, batch, ctx, args.sweep_output_len, args.seed + 10 + 2 * i,
                                   0, args.wait_quiet)
        cells.append({"batch": batch, "prompt_len": ctx, "output_len": args.sweep_output_len,
                      "tok_per_s": m["output_throughput"], "tpot_median_ms": m["median_tpot_ms"],
                      "ttft_p50_ms": m["median_ttft_ms"], "failed": m["failed"],
                      "output_tokens": m["total_output_tokens"], "other_cores": timer.other_cores})
        print(f"  [sweep] batch {batch} x {ctx} tokens: {m['output_throughput']:.1f} tok/s",
              flush=True)
    return cells


# ------------------------------------------------------------------ served
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "inflight.cli", "serve", "--model", str(model),
           "--dtype", args.dtype, "--device", "cpu", "--port", str(port),
           "--max-seq-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           *(["--max-num-batched-tokens", str(args.max_num_batched_tokens)] if args.max_num_batched_tokens else []),
           "--no-prefix-caching", "--log-level", "warning"]
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (0.0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_client(model: Path, url: str, args: argparse.Namespace, warmups: int) -> dict[str, Any]:
    """`inflight bench` (completions, streamed) in this process; its {"config", "metrics", ...}."""
    from inflight.bench import cli as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    argv = ["--backend", "completions", "--base-url", url, "--model", str(model),
            "--dataset", "random", "--num-prompts", str(args.num_requests),
            "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--max-concurrency", str(args.max_concurrency), "--num-warmups", str(warmups),
            "--ignore-eos", "--seed", str(args.seed), "--disable-tqdm"]
    return bench_cli.run(parser.parse_args(argv))


@contextlib.contextmanager
def running_server(model: Path, args: argparse.Namespace, log: Path) -> Iterator[tuple[int, str]]:
    """`inflight serve` in a subprocess for the duration: (its pid, its URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(model, port, args, log)
    try:
        wait_healthy(proc, url, log, args.server_timeout)
        yield proc.pid, url
    finally:
        stop_server(proc)


def served_row(model: Path, server: tuple[int, str], args: argparse.Namespace, warmups: int) -> Row:
    """One `inflight bench` run against the running server."""
    pid, url = server
    quiet(args.wait_quiet)
    cpu0 = process_cpu_seconds(pid)
    with Timer() as timer:
        metrics = bench_client(model, url, args, warmups)["metrics"]
    server_cores = (process_cpu_seconds(pid) - cpu0) / timer.seconds
    other = None if timer.other_cores is None else max(0.0, timer.other_cores - server_cores)
    row = offline_row("served", metrics, timer)
    row.other_cores = other  # the server's own cores are not "other load"
    row.extra |= {"server_cores": server_cores, "url": url}
    return row


# ------------------------------------------------------------------ Hugging Face
def hf_static_row(model: Path, vocab: int, dtype: torch.dtype, args: argparse.Namespace) -> Row:
    """HF generate as one static batch of --num-requests (TTFT: a 1-token run's; TPOT: the static run's own steps)."""
    hf = legs.load_hf_model(model, dtype)
    prompts = legs.make_prompts(args.num_requests, args.input_len, vocab, args.seed)
    legs.hf_generate(hf, torch.tensor(prompts[:1]), 4)  # warmup
    name = str(dtype).replace("torch.", "")
    static = legs.bench_hf_static(hf, name, prompts, args.output_len, args.wait_quiet)
    quiet(args.wait_quiet)
    ttft = legs.hf_generate(hf, torch.tensor(prompts), 1)[1].seconds * 1e3
    del hf
    return Row("HF static", static.tok_per_s, ttft, static.extra["tpot_ms"], static.other_cores,
               {"output_tokens": static.output_tokens, "seconds": static.seconds, "dtype": name})


def hf_rows(model: Path, vocab: int, args: argparse.Namespace, dtype: torch.dtype) -> list[Row]:
    """HF generate one request at a time and as one static batch (offline_legs.py's code, offline_throughput's), in
    `dtype` (the one inflight resolved: the comparison is in the same dtype)."""
    hf = legs.load_hf_model(model, dtype)
    prompts = legs.make_prompts(args.num_requests, args.input_len, vocab, args.seed)
    legs.hf_generate(hf, torch.tensor(prompts[:1]), 4)  # warmup
    name = str(dtype).replace("torch.", "")
    single = legs.bench_hf_single(hf, name, prompts, args.output_len, args.hf_single_requests, args.wait_quiet)
    ttft_1 = legs.hf_generate(hf, torch.tensor(prompts[:1]), 1)[1].seconds * 1e3
    static = legs.bench_hf_static(hf, name, prompts, args.output_len, args.wait_quiet)
    quiet(args.wait_quiet)
    ttft_b = legs.hf_generate(hf, torch.tensor(prompts), 1)[1].seconds * 1e3
    del hf
    rows = []
    for name, res, ttft in (("HF single", single, ttft_1), ("HF static", static, ttft_b)):
        rows.append(Row(name, res.tok_per_s, ttft, res.extra["tpot_ms"], res.other_cores,
                        {"output_tokens": res.output_tokens, "seconds": res.seconds,
                         "timed_requests": res.num_requests}))
    return rows
