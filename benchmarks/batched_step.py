"""Where a batched decode step's time goes on the eager CPU path (the steps of more than
cpu_kernel.MAX_ROWS rows: 32 x 128 -> 128 in quant_bench.py), and what each C piece beside the
quantized GEMMs saves, interleaved.

    INFLIGHT_CPU_FEATURES=avx2 OMP_WAIT_POLICY=PASSIVE python benchmarks/batched_step.py            # phases
    INFLIGHT_CPU_FEATURES=avx2 OMP_WAIT_POLICY=PASSIVE python benchmarks/batched_step.py --ab attn,silu,norm

Loads quant_bench.py's Q8_0 file (--model), prefills --batch prompts of --prompt-len random ids,
then times decode steps of all rows. Phases (median wall ms a step, perf_counter around the
callables): the quantized GEMMs (QuantLinear.apply, the lm_head included), the decode rows'
attention, the MLP activation, the RMSNorms, rotary, the sampler; "step" is LLMEngine.step.
--ab NAME[,NAME]: for each, steps alternate in groups of 4 between the piece off (A: torch's
ops) and on (B: the C kernel), order flipped each round; prints median wall and process CPU ms
a step of each side (CPU time is the steadier figure on a shared machine). Never asserts timings.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from inflight import LLM, SamplingParams, platform
from inflight.models import attention, cpu_attention, layers, llama
from inflight.quant import kernels
from inflight.quant import linear as quant_linear
from inflight.sample import sampler

MODELS = Path.home() / ".cache" / "inflight" / "llama.cpp" / "models"
# name -> (owner, attribute) of the C piece the A side switches off
PIECES = {"attn": (cpu_attention, "available"), "silu": (kernels, "silu_mul"), "norm": (kernels, "rms_norm")}


def wrap(owner: Any, name: str, key: str, spent: dict[str, float]) -> None:
    fn = getattr(owner, name)

    def call(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t

    setattr(owner, name, call)


def decoding(args: argparse.Namespace) -> Any:
    """The engine with `batch` requests past their prefill (every later step decodes all rows)."""
    torch.set_num_threads(args.threads)
    steps = args.steps + 8 * args.rounds * len(PIECES) + 8  # every step of either mode decodes all rows
    llm = LLM(model=args.model, tokenizer=args.tokenizer, dtype="float32", device="cpu", max_num_seqs=args.batch,
              max_model_len=args.prompt_len + steps + 16, progress=False, enable_prefix_caching=False)  # fmt: skip
    engine = llm.engine
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.batch):
        ids = torch.randint(10, 150000, (args.prompt_len,), generator=gen).tolist()
        engine.add_request(engine.make_request({"prompt_token_ids": ids}, SamplingParams(
            max_tokens=steps, temperature=0.0, ignore_eos=True)))  # fmt: skip
    while True:
        engine.step()
        if engine.last_step_tokens <= args.batch:
            break
    for _ in range(3):
        engine.step()
    return engine


def phases(engine: Any, args: argparse.Namespace) -> None:
    spent: dict[str, float] = {}
    wrap(quant_linear.QuantLinear, "apply", "GEMMs (lm_head included)", spent)
    wrap(attention, "_decode_attention", "decode attention", spent)
    wrap(kernels, "silu_mul", "SiLU x up (C)", spent)
    wrap(F, "silu", "SiLU (torch)", spent)
    wrap(layers.RMSNorm, "forward", "RMSNorm", spent)
    wrap(layers.RMSNorm, "add_forward", "add + RMSNorm", spent)
    wrap(layers.RotaryEmbedding, "apply", "rotary", spent)
    wrap(llama.LlamaForCausalLM, "compute_logits", "compute_logits", spent)
    wrap(sampler.Sampler, "__call__", "sampler", spent)
    rows = []
    for _ in range(args.steps):
        spent.clear()
        t = time.perf_counter()
        engine.step()
        rows.append(spent | {"step": time.perf_counter() - t})
    for key in rows[-1]:
        print(f"{key:28s} {1e3 * statistics.median(r.get(key, 0.0) for r in rows):8.1f} ms")


def ab(engine: Any, names: list[str], args: argparse.Namespace) -> None:
    for name in names:
        owner, attr = PIECES[name]
        real = getattr(owner, attr)
        off = (lambda *a, **kw: False) if name == "attn" else (lambda *a, **kw: None)
        res: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                setattr(owner, attr, real if side == "B" else off)
                for _ in range(4):
                    t, c = time.perf_counter(), time.process_time()
                    engine.step()
                    res[side].append((time.perf_counter() - t, time.process_time() - c))
        setattr(owner, attr, real)
        for side, what in (("A", "torch"), ("B", "C")):
            wall = statistics.median(x[0] for x in res[side]) * 1e3
            cpu = statistics.median(x[1] for x in res[side]) * 1e3
            print(f"{name} {side} ({what}): step {wall:.1f} ms wall, {cpu:.1f} ms CPU (median of {len(res[side])})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(MODELS / "model-Q8_0.gguf"))
    ap.add_argument("--tokenizer", default=str(MODELS / "tokenizer"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=6, help="--ab: A/B rounds of 4 steps a side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ab", default="", help="comma-separated: " + ",".join(PIECES))
    args = ap.parse_args()
    print(f"{platform.current().summary()}; quant flavour {platform.current().quant_flavour()}; {args.threads} threads")
    engine = decoding(args)
    if args.ab:
        ab(engine, args.ab.split(","), args)
    else:
        phases(engine, args)


if __name__ == "__main__":
    main()
