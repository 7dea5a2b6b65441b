"""Per-step overhead of constrained decoding (xgrammar bitmask) against free decoding.

Same prompts, same number of generated tokens (min_tokens = max_tokens), batch 1 and 16, on the
random Qwen2.5-0.5B-shaped checkpoint (vocabulary 151936, so the mask is applied over the real
logits width) with the tiny test tokenizer attached (1000 tokens: mask *filling* is measured over
that vocabulary; a real 151k tokenizer fills more, which this script cannot show offline).
Constrained rows follow an EBNF grammar of JSON objects ({id, name, tags}) in an open array. It prints time per
output token for both and the overhead; it never asserts timings.

    python benchmarks/structured_overhead.py                   # bf16, batch 1 and 16
    python benchmarks/structured_overhead.py --batches 1 4 16 --tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

# JSON objects in an array that never has to close, so every request runs exactly --tokens steps
# (EOS stays banned by min_tokens; a grammar that could only end would finish the request early)
GRAMMAR = r"""
root ::= "[" item ("," item)*
item ::= "{\"id\": " [0-9]+ ", \"name\": \"" [a-z ]* "\", \"tags\": [" tag ("," tag)* "]}"
tag ::= "\"a\"" | "\"b\"" | "\"c\""
"""


def checkpoint(root: Path) -> Path:
    from inflight.testing import QWEN25_05B_CONFIG, build_tiny_tokenizer, make_random_checkpoint

    path = root / "qwen05b-bf16-tok"
    if not (path / "model.safetensors").exists():
        make_random_checkpoint(path, config=QWEN25_05B_CONFIG, dtype=torch.bfloat16, seed=0)
        build_tiny_tokenizer(path)
    return path


def tpot_ms(llm, batch: int, tokens: int, constrained: bool) -> float:  # type: ignore[no-untyped-def]
    from inflight import SamplingParams

    params = SamplingParams(
        max_tokens=tokens, min_tokens=tokens, temperature=1.0, seed=1, ignore_eos=not constrained,
        structured_outputs={"grammar": GRAMMAR} if constrained else None,
    )  # fmt: skip
    prompts = [[100 + i, 200 + i, 300 + i, 400 + i] * 8 for i in range(batch)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    steps = [statistics.mean(o.metrics.decode_times_ms) for o in outs if o.metrics.decode_times_ms]
    assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
    return statistics.median(steps) if steps else wall * 1e3 / tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="checkpoint with a tokenizer (default: random Qwen2.5-0.5B shape)")
    p.add_argument("--cache-root", type=Path, default=Path("/tmp/inflight-bench"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    from inflight import LLM

    path = args.model or checkpoint(args.cache_root)
    llm = LLM(str(path), dtype="bfloat16", device="cpu", progress=False)
    tpot_ms(llm, 2, 8, True)  # warm up: compile the grammar (cached), first steps
    tpot_ms(llm, 2, 8, False)
    print(f"threads={torch.get_num_threads()} tokens={args.tokens} model={path}")
    print(f"{'batch':>5} {'free TPOT ms':>13} {'constrained TPOT ms':>20} {'overhead':>9}")
    for batch in args.batches:
        free = statistics.median(tpot_ms(llm, batch, args.tokens, False) for _ in range(args.repeat))
        cons = statistics.median(tpot_ms(llm, batch, args.tokens, True) for _ in range(args.repeat))
        print(f"{batch:>5} {free:>13.2f} {cons:>20.2f} {100 * (cons / free - 1):>8.1f}%")


if __name__ == "__main__":
    main()
