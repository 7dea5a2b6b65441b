"""benchmarks/gpu_report.py's baseline: Hugging Face `generate` on the same random Llama-3-8B-shaped
bf16 model, static batches (the issue's 256 x (512 -> 256)) and a single request."""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import torch


def hf_model(cfg: dict[str, Any]) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU: no 32 GB float32 copy
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


@torch.inference_mode()
def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    ids = torch.tensor(prompts, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - t0


def hf_rows(model: Any, args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, Any]:
    """HF `generate` static batching over `prompts` (halving the batch on OOM), and one request's TPOT."""
    hf_generate(model, prompts[:2], 4)  # warmup
    batch = args.hf_batch
    while True:
        try:
            seconds = sum(hf_generate(model, prompts[i : i + batch], args.output_len)
                          for i in range(0, len(prompts), batch))  # fmt: skip
            break
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
            batch //= 2
            print(f"HF static: out of memory, batch {batch}", flush=True)
    single_short = hf_generate(model, prompts[:1], 2)
    single = hf_generate(model, prompts[:1], args.batch1_output_len)
    tokens = args.num_requests * args.output_len
    return {
        "HF static": {"tok_s": tokens / seconds, "seconds": seconds, "batch": batch},
        "HF single": {"tpot_ms": (single - single_short) / (args.batch1_output_len - 2) * 1e3},
    }
