"""Batch-1 TPOT with the fused C decode kernel on and off, on one loaded model (A/B interleaved):

    OMP_WAIT_POLICY=PASSIVE python benchmarks/float_decode_ab.py --quantization fp8
    INFLIGHT_CPU_FEATURES=avx2 OMP_WAIT_POLICY=PASSIVE python benchmarks/float_decode_ab.py --dtypes auto,float32 \\
        --model ~/.cache/inflight/llama.cpp/models/model-f16.gguf --tokenizer ~/.cache/inflight/llama.cpp/models/tokenizer

The model loads once per `--dtypes` entry; each repeat decodes one request on each, with the
runner's decode kernel off (the eager per-layer path) and on, swapped in on the same weights. Default model: the
random bf16 Qwen2.5-0.5B-shaped checkpoint of bf16_weights_ab.py. `--quantization fp8`: f8c
layers (before the kernel took them, FP8 models decoded eagerly); a GGUF F16 file under
INFLIGHT_CPU_FEATURES=avx2: f16 weights (before: float32 copies, `--dtype float32` below).
Prints the best TPOT of the repeats and the median, with the CPU and the paths line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if (_ROOT := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402

from inflight import LLM, SamplingParams, platform  # noqa: E402
from inflight.testing import checkpoints  # noqa: E402
from inflight.testing.tokenizer import build_tiny_tokenizer  # noqa: E402

WORK = Path.home() / ".cache" / "inflight" / "bf16_ab"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(WORK / "hf"))
    ap.add_argument("--tokenizer", default=str(WORK / "tokenizer"))
    ap.add_argument("--quantization", choices=["int8", "fp8"])
    ap.add_argument("--dtypes", default="auto", help="comma-separated: one load each, interleaved")
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(min(2, len(os.sched_getaffinity(0))))
    if args.model == str(WORK / "hf") and not (WORK / "hf" / "model.safetensors").exists():
        checkpoints.make_random_checkpoint(WORK / "hf", config=checkpoints.QWEN25_05B_CONFIG, dtype=torch.bfloat16)
    if not Path(args.tokenizer).exists():
        build_tiny_tokenizer(Path(args.tokenizer))
    print(f"CPU: {platform.current().cpu.model_name}; {torch.get_num_threads()} threads")
    llms = {}
    for dtype in args.dtypes.split(","):
        llms[dtype] = LLM(model=args.model, tokenizer=args.tokenizer, dtype=dtype, quantization=args.quantization,
                          device="cpu", max_model_len=args.input_len + args.output_len + 8, num_kv_blocks=64,
                          progress=False)  # fmt: skip
        print(f"--dtype {dtype}: {llms[dtype].engine.executor.runner.model.cpu_paths.summary}", flush=True)
    prompt = [{"prompt_token_ids": torch.randint(10, 150000, (args.input_len,)).tolist()}]

    def tpot(llm: LLM) -> float:
        def run(n: int) -> float:
            t0 = time.perf_counter()
            llm.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
            return time.perf_counter() - t0

        return (run(args.output_len + 1) - run(1)) / args.output_len

    runs: dict[str, list[float]] = {}
    kernels = {dtype: llm.engine.executor.runner.decode_kernel for dtype, llm in llms.items()}
    for llm in llms.values():
        tpot(llm)  # warm: pages touched, kernels built
    for rep in range(args.reps):
        for dtype, llm in llms.items():
            runner = llm.engine.executor.runner
            for on in (False, True) if kernels[dtype] is not None else (False,):
                runner.decode_kernel = kernels[dtype] if on else None
                name = f"--dtype {dtype}, " + ("fused kernel" if on else "eager (kernel off)")
                runs.setdefault(name, []).append(tpot(llm))
                print(f"  rep {rep} {name}: {runs[name][-1] * 1e3:.1f} ms", flush=True)
            runner.decode_kernel = kernels[dtype]
    print("| path | best TPOT ms | median ms |\n|---|---:|---:|")
    for name, ts in runs.items():
        print(f"| {name} | {min(ts) * 1e3:.1f} | {statistics.median(ts) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
