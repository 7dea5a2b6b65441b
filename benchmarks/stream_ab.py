"""Builds of the fused decode kernel with other -D flags, A/B on the batch-1 step of a GGUF file in
one process, per matrix against the memory's moment.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/stream_ab.py --variants tree "IFLV_Q8_PF=1024"
    python benchmarks/stream_ab.py --model ~/.cache/inflight/llama.cpp/models/model-Q4_K_M.gguf \\
        --variants tree "IFLV_Q32_PF=768" "TQ_CHUNK=16"

Every variant is decode_kernel.c built with -DIFL_PROFILE plus its defines (`tree`: the tree as it
is); one engine loads the file, and its DecodeKernel's library is swapped between steps,
the variants taking turns step by step (the order rotating), each step followed by a read probe
(benchmarks/roofline.py's fastest) of the step's bytes on the same threads. Per variant, medians
over --steps steps: the engine step, the paired ratio (read time / step time, as roofline.py), each
GEMV phase's CPU ms (the threads' mean: descheduling left out) and its bytes over that time (GB/s
of both cores together) beside the probe's GB/s, the barriers' wall ms on thread 0, and the norms',
attention's and SiLU's CPU ms (the threads' mean). The memory's speed moves from second to second on a VM:
only the figures of one run compare. --unpacked: one more arm, a second engine of the tree's
build whose weights memory.pack_into_huge_pages left alone. --check: each variant's own greedy tokens must be the same.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from decode_breakdown import GEMV_OF, MODELS, PHASES, phase_bytes  # noqa: E402
from roofline import fastest_read, timed  # noqa: E402

from inflight.models import cpu_kernel  # noqa: E402

SMALL = ("norm", "attention", "silu")  # the step's other phases, CPU ms a thread (the threads' mean)


def defines(variant: str) -> list[str]:
    """"IFLV_Q8_PF=1024 TQ_CHUNK=8" -> ["IFLV_Q8_PF=1024", "TQ_CHUNK=8"] ("" or "tree": none)"""
    return [] if variant in ("", "tree") else variant.split()


def variant_libs(kernel: cpu_kernel.DecodeKernel, variants: list[str]) -> list[ctypes.CDLL]:
    """Each variant's build of the engine kernel's Variant, with -DIFL_PROFILE and its defines."""
    assert kernel.variant is not None, "the engine's kernel was handed a library: no variant to rebuild"
    return [cpu_kernel.load_library(kernel.variant, ("IFL_PROFILE", *defines(v))) for v in variants]


def load_engine(args: argparse.Namespace, packed: bool = True) -> Any:
    from inflight import LLM, memory

    plain = memory.pack_into_huge_pages
    if not packed:  # the small weights left where the loader put them (before 2026-11-27's packing)
        memory.pack_into_huge_pages = lambda *a, **k: 0  # type: ignore[assignment]
    try:
        llm = LLM(model=args.model, tokenizer=args.tokenizer, dtype="float32", device="cpu", max_num_seqs=1,
                  max_model_len=args.prompt_len + (len(args.variants) + 1) * args.steps + 96, progress=False)  # fmt: skip
    finally:
        memory.pack_into_huge_pages = plain  # type: ignore[assignment]
    kernel = llm.engine.executor.runner.decode_kernel
    assert kernel is not None and kernel.quant, "the fused quantized step did not build"
    return llm


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from inflight import SamplingParams

    torch.set_num_threads(args.threads)
    llms = [load_engine(args)]
    libs = variant_libs(llms[0].engine.executor.runner.decode_kernel, args.variants)
    arms = [(llms[0].engine, lib) for lib in libs]  # (engine, library) a variant
    if args.unpacked:
        llms.append(load_engine(args, packed=False))
        arms.append((llms[1].engine, libs[0]))
    prof = torch.zeros(2, args.threads, len(PHASES), dtype=torch.float64)
    for lib in libs:
        lib.ifl_profile.argtypes = [ctypes.c_void_p, ctypes.c_int]
    nbytes = llms[0].engine.executor.runner.decode_kernel.quant_bytes
    _, read, _ = fastest_read(nbytes, args.threads)
    vocab = llms[0].engine.config.model.vocab_size
    ids = torch.randint(10, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    for llm in llms:
        llm.engine.add_request(llm.engine.make_request({"prompt_token_ids": ids}, SamplingParams(
            max_tokens=len(arms) * args.steps + 8, temperature=0.0, ignore_eos=True)))  # fmt: skip
        for _ in range(3):
            llm.engine.step()
    rows: list[list[dict[str, float]]] = [[] for _ in arms]
    for i in range(args.steps):
        for j in range(len(arms)):
            v = (i + j) % len(arms)  # the order rotates: no variant always follows the probe
            engine, lib = arms[v]
            kernel = engine.executor.runner.decode_kernel
            kernel.lib = lib
            assert lib.ifl_profile(prof.data_ptr(), args.threads) == len(PHASES), "not a profiling build"
            step = timed(engine.step)
            lib.ifl_profile(prof.data_ptr(), args.threads)
            probe = timed(read)
            row = {name: float(prof[0, 0, p]) * 1e3 for p, name in enumerate(PHASES)}
            row.update({f"{name}%": float(prof[1, :, p].mean()) * 1e3 for p, name in enumerate(PHASES)})
            row.update(engine=step * 1e3, probe=nbytes / probe / 1e9, ratio=100 * probe / step)
            rows[v].append(row)
    for llm in llms:
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
    med = [{k: statistics.median(r[k] for r in rs) for k in rs[0]} for rs in rows]
    same = None
    if args.check:
        got = {tuple(greedy_tokens(e, e.executor.runner.decode_kernel, lib, ids[:32], 24)) for e, lib in arms}
        same = len(got) == 1
    return {"med": med, "bytes": phase_bytes(llms[0].engine.executor.runner.model), "total": nbytes, "same": same,
            "labels": [*args.variants, *(["tree, weights unpacked"] if args.unpacked else [])]}  # fmt: skip


def greedy_tokens(engine: Any, kernel: Any, lib: ctypes.CDLL, ids: list[int], n: int) -> list[int]:
    """The greedy continuation of `ids` (n tokens) with every step on `lib`."""
    from inflight import SamplingParams

    kernel.lib = lib
    req = engine.make_request({"prompt_token_ids": ids}, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    engine.add_request(req)
    done: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done = list(out.outputs[0].token_ids)
    return done


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    from quant_bench import cpu_name

    print(f"CPU: {cpu_name()}; {args.threads} threads; {Path(args.model).name}; {args.steps} steps a variant "
          f"(medians), interleaved; load average {os.getloadavg()[0]:.1f}; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; {res['total'] / 1e6:.0f} MB a step")  # fmt: skip
    gemvs = [p for p in GEMV_OF if res["bytes"][p]]
    print("| variant | engine step ms | paired % | probe GB/s | " + " | ".join(f"{p} ms (GB/s)" for p in gemvs)
          + " | barrier ms | GEMVs CPU ms | " + " | ".join(f"{p} CPU ms" for p in SMALL) + " |")  # fmt: skip
    print("|---|" + "---:|" * (5 + len(gemvs) + len(SMALL)))
    for flags, m in zip(res["labels"], res["med"]):
        cells = " | ".join(f"{m[p + '%']:.2f} ({res['bytes'][p] / m[p + '%'] / 1e6:.1f})" for p in gemvs)
        small = " | ".join(f"{m[p + '%']:.2f}" for p in SMALL)
        print(f"| `{flags or 'tree'}` | {m['engine']:.2f} | {m['ratio']:.0f} | {m['probe']:.1f} | {cells} "
              f"| {m['barrier']:.2f} | {sum(m[p + '%'] for p in gemvs):.2f} | {small} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODELS / "model-Q8_0.gguf"))
    ap.add_argument("--tokenizer", default=str(MODELS / "tokenizer"))
    ap.add_argument("--variants", nargs="+", default=[""], help="each build's -D defines, space-separated (NAME=VALUE ...; tree: none)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--unpacked", action="store_true",
                    help="also a second engine whose small weights are not packed into huge pages (tree build)")
    ap.add_argument("--check", action="store_true", help="also compare the variants' greedy tokens")
    args = ap.parse_args()
    res = measure(args)
    report(res, args)
    if args.check:
        print("every variant's greedy tokens (24 from a 32-token prompt) the same:", res["same"])


if __name__ == "__main__":
    main()
