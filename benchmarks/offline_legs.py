"""The offline benchmark's two legs (benchmarks/offline_throughput.py runs them, report_parts.py
reuses the Hugging Face one): inflight's `LLM.generate` over every request, and HF `generate` one
request at a time and as one static batch; each returns a `BenchResult`. The workload's prompts
and the dtype names are here too, shared by both."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
import bench_timing
from bench_timing import Timer, fmt_other, median_run, wait_until_quiet

# Prompt ids are drawn below Qwen2.5's first special token so they stay ordinary text ids.
MAX_PROMPT_TOKEN_ID = 151643


@dataclass
class BenchResult:
    engine: str  # "inflight" | "hf-single" | "hf-static"
    dtype: str
    num_requests: int  # requests actually timed
    output_tokens: int
    seconds: float
    other_cores: float | None = None  # cores kept busy by other processes meanwhile
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else float("nan")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"unknown dtype {name!r}")
    return dtype


def make_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    high = min(vocab_size, MAX_PROMPT_TOKEN_ID)
    return torch.randint(0, high, (num, length), generator=gen).tolist()


def read_vocab_size(ckpt: Path) -> int:
    config = json.loads((ckpt / "config.json").read_text())
    return int(config.get("text_config", config)["vocab_size"])


# ------------------------------------------------------------------ inflight
def bench_inflight(ckpt: Path, dtype_name: str, prompts: list[list[int]],
                   output_len: int, args: argparse.Namespace) -> BenchResult:
    from inflight import LLM, SamplingParams

    llm = LLM(model=str(ckpt), dtype=dtype_name, device="cpu", max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens)
    # Warm up on other prompts so the timed run gets no prefix-cache hits from the warmup.
    warm_prompts = make_prompts(2, len(prompts[0]), read_vocab_size(ckpt), args.seed + 1)
    warm = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": ids} for ids in warm_prompts], warm, use_tqdm=False)

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    runs: list[Timer] = []
    for rep in range(max(1, args.repeat)):
        # fresh prompts per repeat: the prefix cache must not serve a repeat from the last one
        batch = prompts if rep == 0 else make_prompts(
            len(prompts), len(prompts[0]), read_vocab_size(ckpt), args.seed + 100 + rep)
        wait_until_quiet(args.wait_quiet)
        with Timer() as t:
            outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params,
                                use_tqdm=False)
        runs.append(t)
    timer = median_run(runs)

    lengths = [len(o.outputs[0].token_ids) for o in outs]
    _warn_lengths("inflight", lengths, output_len)
    ttfts = [t for o in outs
             if (t := getattr(getattr(o, "metrics", None), "time_to_first_token_ms", None))
             is not None]
    extra = {"mean_ttft_ms": sum(ttfts) / len(ttfts) if ttfts else None,
             "runs_seconds": [round(t.seconds, 3) for t in runs]}
    del llm, outs
    gc.collect()
    return BenchResult("inflight", dtype_name, len(prompts), sum(lengths), timer.seconds,
                       timer.other_cores, extra)


def _warn_lengths(engine: str, lengths: list[int], expected: int) -> None:
    bad = [n for n in lengths if n != expected]
    if bad:
        print(f"[warn] {engine}: {len(bad)} request(s) did not generate exactly {expected} "
              f"tokens (got e.g. {bad[:4]})")


# ------------------------------------------------------------------ Hugging Face
def load_hf_model(ckpt: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def hf_generate(model: torch.nn.Module, input_ids: torch.Tensor,
                output_len: int) -> tuple[torch.Tensor, Timer]:
    """Greedy-generate exactly `output_len` tokens per row; returns (new tokens, timer).

    transformers 5.x merges the checkpoint's generation_config under the call's kwargs,
    so eos is disabled with an explicit `eos_token_id=None` kwarg (it overrides; a passed
    GenerationConfig would be back-filled from the checkpoint's eos instead). Without an
    eos the only stopping criterion is max_new_tokens.
    """
    attention_mask = torch.ones_like(input_ids)
    clock = bench_timing.TokenClock()
    with Timer() as timer, torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                             do_sample=False, max_new_tokens=output_len,
                             min_new_tokens=output_len, eos_token_id=None, pad_token_id=0,
                             streamer=clock)
    timer.tpot_ms = clock.tpot_ms()  # type: ignore[attr-defined]
    return out[:, input_ids.shape[1]:], timer


def bench_hf_single(model: torch.nn.Module, dtype_name: str, prompts: list[list[int]],
                    output_len: int, num_timed: int, wait_quiet_s: float) -> BenchResult:
    timed = prompts[:max(1, min(num_timed, len(prompts)))]
    tokens, seconds, other, tpots = 0, 0.0, 0.0, []
    for i, ids in enumerate(timed):
        wait_until_quiet(wait_quiet_s)
        new, timer = hf_generate(model, torch.tensor([ids]), output_len)
        _warn_lengths("hf-single", [new.shape[1]], output_len)
        tokens += new.numel()
        seconds += timer.seconds
        other += (timer.other_cores or 0.0) * timer.seconds
        if (tpot := timer.tpot_ms) is not None:  # type: ignore[attr-defined]
            tpots.append(tpot)
        print(f"  [hf-single {dtype_name}] request {i + 1}/{len(timed)}: {new.numel()} tokens "
              f"in {timer.seconds:.2f}s ({new.numel() / timer.seconds:.2f} tok/s)"
              f"{fmt_other(timer.other_cores)}", flush=True)
    extra = {"timed_requests": len(timed), "total_requests": len(prompts),
             "extrapolated_seconds_all": seconds / len(timed) * len(prompts),
             "tpot_ms": sum(tpots) / len(tpots) if tpots else None}
    return BenchResult("hf-single", dtype_name, len(timed), tokens, seconds,
                       other / seconds if timer.other_cores is not None else None, extra)


def bench_hf_static(model: torch.nn.Module, dtype_name: str, prompts: list[list[int]],
                    output_len: int, wait_quiet_s: float, repeat: int = 1) -> BenchResult:
    runs: list[Timer] = []
    for _ in range(max(1, repeat)):
        wait_until_quiet(wait_quiet_s)
        new, t = hf_generate(model, torch.tensor(prompts), output_len)
        _warn_lengths("hf-static", [row.numel() for row in new], output_len)
        runs.append(t)
    timer = median_run(runs)
    extra = {"batch_size": len(prompts), "tpot_ms": timer.tpot_ms,  # type: ignore[attr-defined]
             "runs_seconds": [round(t.seconds, 3) for t in runs]}
    return BenchResult("hf-static", dtype_name, len(prompts), new.numel(), timer.seconds, timer.other_cores, extra)


def bench_hf(ckpt: Path, dtype_name: str, prompts: list[list[int]],
             args: argparse.Namespace) -> list[BenchResult]:
    t0 = time.perf_counter()
    model = load_hf_model(ckpt, torch_dtype(dtype_name))
    print(f"[hf] loaded {dtype_name} model in {time.perf_counter() - t0:.1f}s", flush=True)
    hf_generate(model, torch.tensor(prompts[:1]), 4)  # warmup
    results = [bench_hf_single(model, dtype_name, prompts, args.output_len,
                               args.hf_single_requests, args.wait_quiet)]
    print(f"  [hf-single {dtype_name}] {results[-1].tok_per_s:.2f} tok/s"
          f"{fmt_other(results[-1].other_cores)}", flush=True)
    results.append(bench_hf_static(model, dtype_name, prompts, args.output_len,
                                   args.wait_quiet, args.repeat))
    print(f"  [hf-static {dtype_name}] {results[-1].output_tokens} tokens in "
          f"{results[-1].seconds:.2f}s ({results[-1].tok_per_s:.2f} tok/s)"
          f"{fmt_other(results[-1].other_cores)}", flush=True)
    del model
    gc.collect()
    return results
