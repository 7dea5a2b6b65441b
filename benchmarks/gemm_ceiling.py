"""How fast can offline throughput be on this CPU if every linear layer ran at the best GEMM rate
measured here? A ceiling for the engine (oneDNN-packed weights, prefill in chunks) and for
Hugging Face static batching (`F.linear`, the whole batch's prompts in one prefill).

Offline decoding on a CPU is GEMM-bound (a Qwen2.5-0.5B-shaped batch-32 float32 step spends
~93 % of its time in the linear layers), so "engine >= 2x HF static" needs the engine's GEMMs
to run at twice the rate of HF's. This script measures, for each linear shape of the model
(from config.json) and each row count the two runs use, the GFLOP/s of

  packed:   torch.ops.mkldnn._linear_pointwise on a weight reordered once (what the engine runs)
  F.linear: torch.nn.functional.linear on the plain weight (what transformers runs)

and adds them up into seconds per workload (GEMMs only: attention, norms, sampling and Python
cost nothing here, so both figures are upper bounds on tok/s).

    python benchmarks/gemm_ceiling.py                       # Qwen2.5-0.5B shape, float32, 32 x (128 -> 128)
    python benchmarks/gemm_ceiling.py --dtype bfloat16 --hf-tok-s 32.8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from report_parts import _best_seconds as best_seconds  # noqa: E402

# Qwen2.5-0.5B (the shape benchmarks/report.py uses)
QWEN05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
           "num_key_value_heads": 2, "vocab_size": 151936}  # fmt: skip


def linear_shapes(cfg: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each linear layer of one decoder layer, and the lm_head."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    return {"qkv": (qkv, h), "o": (h, cfg["num_attention_heads"] * hd), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (cfg["vocab_size"], h)}  # fmt: skip


def gemm_seconds(shape: tuple[int, int], rows: int, dtype: torch.dtype, packed: bool, reps: int) -> float:
    n, k = shape
    x, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype) * 0.02
    if packed:
        p = torch.ops.mkldnn._reorder_linear_weight(w, 32)
        return best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), reps)
    return best_seconds(lambda: F.linear(x, w), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=512, help="the engine's prefill chunk (max_num_batched_tokens)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hf-tok-s", type=float, default=None, help="a measured HF static tok/s to compare with")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = linear_shapes(QWEN05B)
    layers = QWEN05B["num_hidden_layers"]
    prompt_tokens = args.batch * args.input_len
    runs = {  # name -> (packed?, prefill rows per GEMM, number of prefill GEMM calls per layer shape)
        "engine (oneDNN packed)": (True, min(args.chunk, prompt_tokens), -(-prompt_tokens // args.chunk)),
        "HF static (F.linear)": (False, prompt_tokens, 1),
    }
    report: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for name, (packed, rows, calls) in runs.items():
            rate: dict[str, float] = {}
            prefill = decode = 0.0
            for layer, shape in shapes.items():
                n_layers = 1 if layer == "lm_head" else layers
                flops_row = 2 * shape[0] * shape[1]
                if layer != "lm_head":  # prompts: every layer at `rows`; the lm_head only on each last token
                    s = gemm_seconds(shape, rows, dtype, packed, args.reps)
                    prefill += s * calls * n_layers
                    rate[f"{layer}@{rows}"] = flops_row * rows / s / 1e9
                s = gemm_seconds(shape, args.batch, dtype, packed, args.reps)
                prefill += s * (n_layers if layer == "lm_head" else 0)
                decode += s * n_layers * (args.output_len - 1)
                rate[f"{layer}@{args.batch}"] = flops_row * args.batch / s / 1e9
            total = prefill + decode
            report[name] = {"prefill_s": prefill, "decode_s": decode,
                            "ceiling_tok_s": args.batch * args.output_len / total,
                            **{f"GFLOP/s {k}": v for k, v in rate.items()}}  # fmt: skip
    eng, hf = report["engine (oneDNN packed)"], report["HF static (F.linear)"]
    print(f"threads {torch.get_num_threads()} | cores {len(os.sched_getaffinity(0))} | {args.dtype} | "
          f"{args.batch} x ({args.input_len} -> {args.output_len}), engine prefill chunk {args.chunk}")
    print("| GEMM rate (GFLOP/s) | " + " | ".join(report) + " |\n|---|---:|---:|")
    for key in [k for k in eng if k.startswith("GFLOP/s")]:
        other = hf.get(key.replace(f"@{min(args.chunk, prompt_tokens)}", f"@{prompt_tokens}"))
        print(f"| {key[8:]} | {eng[key]:.1f} | {other:.1f} |" if other else f"| {key[8:]} | {eng[key]:.1f} | |")
    for name, r in report.items():
        print(f"{name}: GEMMs alone {r['prefill_s']:.1f} s prefill + {r['decode_s']:.1f} s decode "
              f"-> ceiling {r['ceiling_tok_s']:.1f} output tok/s")
    ratio = eng["ceiling_tok_s"] / hf["ceiling_tok_s"]
    print(f"engine ceiling / HF ceiling: {ratio:.2f}x")
    if args.hf_tok_s:
        print(f"engine ceiling / HF static measured ({args.hf_tok_s:g} tok/s): {eng['ceiling_tok_s'] / args.hf_tok_s:.2f}x")
    print(json.dumps({k: {m: round(v, 2) for m, v in r.items()} for k, r in report.items()}))


if __name__ == "__main__":
    main()
