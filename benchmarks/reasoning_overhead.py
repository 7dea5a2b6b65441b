"""What a reasoning model's handling costs: the text splitter and the runner's thinking state.

1. The splitter (inflight/reasoning): feeding a generation one token's text at a time through the
   `<think>` splitter and, behind it, the hermes tool-call parser, against the tool parser alone
   (the chat path without a reasoning parser). Microseconds per token.
2. The runner: decode time per output token (TPOT) with `SamplingParams.thinking` set (a budget
   that never runs out, so every step checks the state and no token is forced) against the same
   requests without it, batch 1 and 8, on a tiny random Qwen2 checkpoint (where a per-step cost
   shows most; `--full`: the random Qwen2.5-0.5B-shaped one). The two alternate run by run, so
   a busy machine's drift falls on both.

It prints both against their baselines, measured in the same run; it never asserts timings.

    python benchmarks/reasoning_overhead.py
    python benchmarks/reasoning_overhead.py --batches 1 8 16 --tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def splitter_us(tokens: list[str], with_reasoning: bool, repeat: int = 5) -> float:
    from inflight.reasoning.stream import ReasoningStreamer
    from inflight.tools import get_parser

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        calls = get_parser("hermes").streamer()
        split = ReasoningStreamer("<think>", "</think>", False)
        for t in tokens:
            text = split.feed(t)[1] if with_reasoning else t
            calls.feed(text)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6 / len(tokens)


def tpot_ms(llm, batch: int, tokens: int, thinking: bool) -> float:  # type: ignore[no-untyped-def]
    from inflight import SamplingParams
    from inflight.structured.thinking import ThinkingParams

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=1.0, seed=1, ignore_eos=True,
                            thinking=ThinkingParams(1, 2, "thinking", budget=10**9) if thinking else None)  # fmt: skip
    prompts = [[100 + i, 200 + i, 300 + i, 400 + i] * 8 for i in range(batch)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return statistics.median(statistics.mean(o.metrics.decode_times_ms) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-root", type=Path, default=Path("/tmp/inflight-bench"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--full", action="store_true", help="the Qwen2.5-0.5B-shaped checkpoint (bf16) instead of the tiny one")
    args = p.parse_args()
    from inflight import LLM, platform

    cpu = platform.current().cpu
    print(f"cpu={cpu.model_name or cpu.name} cores={cpu.num_cores} threads={torch.get_num_threads()}")
    words = ["<think>", *(f" w{i}" for i in range(2000)), "</think>", *(f" a{i}" for i in range(2000))]
    plain, split = splitter_us(words, False), splitter_us(words, True)
    print(f"splitter: tool parser alone {plain:.2f} us/token, with the reasoning split {split:.2f} us/token (+{split - plain:.2f})")

    if args.full:
        from structured_overhead import (
            checkpoint,  # benchmarks/ is on the path when run as a script
        )

        llm = LLM(str(checkpoint(args.cache_root)), dtype="bfloat16", device="cpu", progress=False)
    else:
        from inflight.testing import make_tiny_checkpoint

        path = args.cache_root / "tiny-qwen2"
        if not (path / "model.safetensors").exists():
            make_tiny_checkpoint("qwen2", path)
        llm = LLM(str(path), dtype="float32", device="cpu", progress=False)
    tpot_ms(llm, 2, 8, True)  # warm up
    print(f"{'batch':>5} {'TPOT ms':>9} {'with thinking state':>20} {'overhead':>9}")
    for batch in args.batches:
        free, with_state = [], []
        for _ in range(args.repeat):  # alternating: drift on a busy machine falls on both
            free.append(tpot_ms(llm, batch, args.tokens, False))
            with_state.append(tpot_ms(llm, batch, args.tokens, True))
        a, b = statistics.median(free), statistics.median(with_state)
        print(f"{batch:>5} {a:>9.3f} {b:>20.3f} {100 * (b / a - 1):>8.1f}%")


if __name__ == "__main__":
    main()
