"""Resident memory of one model loaded from a GGUF file, quantized at load, or in float:

    python benchmarks/quant_memory.py MODEL.gguf [--tokenizer DIR] [--dtype float32]
    python benchmarks/quant_memory.py HF_DIR [int8|fp8]

Prints the load time, the peak and the steady RSS (after one short generation) and the paths the
model runs (the cpu_paths line). One model per process, so the figures do not mix. Files: see
docs/QUANTIZATION.md (make_random_checkpoint(config=QWEN25_05B_CONFIG) + hf_to_gguf).
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

from inflight import LLM, SamplingParams  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("quantization", nargs="?", choices=["int8", "fp8"])
    ap.add_argument("--tokenizer", help="a file without a vocabulary (quant_bench.py's model-f16.gguf) needs one")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    path = args.model
    kw: dict[str, str] = {"quantization": args.quantization} if args.quantization else {}
    if args.tokenizer:
        kw["tokenizer"] = args.tokenizer
    if args.dtype != "auto":
        kw["dtype"] = args.dtype
    t = time.time()
    llm = LLM(model=path, progress=False, num_kv_blocks=64, max_model_len=1024, **kw)
    load = time.time() - t
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    gc.collect()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    paths = llm.engine.executor.runner.model.cpu_paths.summary  # type: ignore[union-attr]
    print(f"{Path(path).name} {kw or ''} load {load:.1f} s, peak RSS {peak:.0f} MiB, steady RSS {rss_mib():.0f} MiB | {paths}")


if __name__ == "__main__":
    main()
