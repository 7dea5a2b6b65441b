"""Where a batch-1 decode step's time goes, on a GGUF file: engine vs the fused C step, and inside
the C step the GEMVs against attention, norms, rope, the activations' int8 rounding, the OpenMP
barriers and the lm_head.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_breakdown.py --model ~/.cache/inflight/llama.cpp/models/model-Q8_0.gguf

The decode kernel is built with -DIFL_PROFILE (inflight/csrc/decode_kernel.c: each thread adds
the wall time since its previous mark to the phase it finished; the step's barriers are explicit,
so a thread's wait at one is `barrier`, not the work before it), the engine's steps are timed
around it (as benchmarks/engine_overhead.py: engine = step wall time, kernel = forward + logits).
Per step, medians of --steps steps: one row a phase, each thread's wall and CPU ms (the CPU time
leaves out descheduling on a loaded machine; each mark costs ~0.5 us of it) and a GEMV's bytes
over its threads' summed CPU time (the rate of one core while it runs); the read bandwidth of the fastest probe (benchmarks/roofline.py) is
measured between the steps, so the GB/s compare with what the memory gave meanwhile.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from roofline import fastest_read, timed  # noqa: E402

MODELS = Path.home() / ".cache/inflight/llama.cpp/models"  # benchmarks/quant_bench.py writes them
# the C enum PH_* (decode_kernel.c); GEMV phases name the fused layer whose bytes they read
PHASES = ("norm", "quant x", "qkv", "rope", "attention", "o", "gate_up", "silu", "down", "barrier", "lm_head", "step")
GEMV_OF = {"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj", "lm_head": "lm_head"}


def profiled(kernel: Any) -> ctypes.CDLL:
    """The engine's DecodeKernel switched to its variant built with -DIFL_PROFILE (its own cache
    entry); that library."""
    from inflight.models import cpu_kernel

    assert kernel.variant is not None, "the engine's kernel was handed a library: no variant to rebuild"
    kernel.lib = cpu_kernel.load_library(kernel.variant, ("IFL_PROFILE",))
    return kernel.lib  # type: ignore[no-any-return]


def phase_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Quantized bytes each GEMV phase reads per step (every layer's fused module of that name)."""
    out = dict.fromkeys(GEMV_OF, 0)
    for name, mod in model.named_modules():
        weights = getattr(getattr(mod, "method", None), "weights", None) or []
        for phase, suffix in GEMV_OF.items():
            if name.endswith(suffix):
                out[phase] += sum(w.nbytes for w in weights)
    return out


def _timer(fn: Any, spent: list[float]) -> Any:
    def call(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t)

    return call


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from inflight import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, tokenizer=args.tokenizer, dtype="float32", device="cpu", max_num_seqs=1,
              max_model_len=args.prompt_len + args.steps + 32, progress=False)  # fmt: skip
    engine = llm.engine
    kernel = engine.executor.runner.decode_kernel
    assert kernel is not None and kernel.quant, "the fused quantized step did not build"
    lib = profiled(kernel)
    lib.ifl_profile.argtypes = [ctypes.c_void_p, ctypes.c_int]
    prof = torch.zeros(2, args.threads, len(PHASES), dtype=torch.float64)  # wall, CPU
    fwd: list[float] = []
    head: list[float] = []
    kernel.forward = _timer(kernel.forward, fwd)
    try:  # a lone greedy stream's step: one C call, its lm_head included (worker/one_decode.py)
        from inflight.worker.one_decode import OneDecode

        OneDecode.__call__ = _timer(OneDecode.__call__, fwd)  # type: ignore[method-assign]
    except ImportError:  # a tree from before it
        pass
    kernel.logits = _timer(kernel.logits, head)
    _, read, _ = fastest_read(kernel.quant_bytes, args.threads)
    vocab = engine.config.model.vocab_size  # the file's own (Llama-3's 128256, Qwen2's 151936)
    ids = torch.randint(10, vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.add_request(engine.make_request({"prompt_token_ids": ids}, SamplingParams(
        max_tokens=args.steps + 8, temperature=0.0, ignore_eos=True)))  # fmt: skip
    for _ in range(3):
        engine.step()  # the prefill, then warm decodes
    rows: list[dict[str, float]] = []
    probes = []
    for _ in range(args.steps):
        assert lib.ifl_profile(prof.data_ptr(), args.threads) == len(PHASES), "not a profiling build"
        fwd.clear()
        head.clear()
        step_s = timed(engine.step)
        lib.ifl_profile(prof.data_ptr(), args.threads)
        row = {f"{PHASES[p]}{'@' if k == 0 else '%'}{t}": float(prof[k, t, p]) * 1e3
               for k in range(2) for t in range(args.threads) for p in range(len(PHASES))}  # fmt: skip
        row.update(engine=step_s * 1e3, forward=sum(fwd) * 1e3, logits=sum(head) * 1e3)
        rows.append(row)
        probes.append(kernel.quant_bytes / timed(read) / 1e9)
    while engine.has_unfinished_requests():
        engine.step()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"med": med, "bytes": phase_bytes(engine.executor.runner.model), "total": kernel.quant_bytes,
            "probe": statistics.median(probes)}  # fmt: skip


def report(res: dict[str, Any], args: argparse.Namespace) -> None:
    from quant_bench import cpu_name

    med, nbytes, th = res["med"], res["bytes"], range(args.threads)
    print(f"CPU: {cpu_name()}; {args.threads} threads; {Path(args.model).name}; prompt {args.prompt_len}, {args.steps} "
          f"decode steps (medians); load average {os.getloadavg()[0]:.1f}; OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; read probe between steps {res['probe']:.1f} GB/s (median)")  # fmt: skip
    print("| phase | " + " | ".join(f"thread {t} wall ms" for t in th) + " | " + " | ".join(f"thread {t} CPU ms" for t in th)
          + " | MB | GB/s a core (CPU time) |")  # fmt: skip
    print("|---|" + "---:|" * (2 * args.threads + 2))
    for name in PHASES[:-1]:
        ms = [med[f"{name}@{t}"] for t in th] + [med[f"{name}%{t}"] for t in th]
        cpu = sum(ms[args.threads :])
        mb = f"{nbytes[name] / 1e6:.0f} | {nbytes[name] / cpu / 1e6:.1f}" if name in nbytes and cpu > 0 else " | "
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in ms) + f" | {mb} |")
    inside = med["step@0"]
    print(f"C step (ifl_decode_step, thread 0) {inside:.2f} ms; DecodeKernel.forward {med['forward']:.2f} ms (its "
          f"Python and ctypes: {med['forward'] - inside:.2f}); logits {med['logits']:.2f} ms (C lm_head "
          f"{med['lm_head@0']:.2f}); engine step {med['engine']:.2f} ms, of which outside the kernel "
          f"{med['engine'] - med['forward'] - med['logits']:.2f} ms")  # fmt: skip
    roof = res["total"] / res["probe"] / 1e6
    print(f"{res['total'] / 1e6:.0f} MB a step: at the probe's {res['probe']:.1f} GB/s {roof:.2f} ms = "
          f"{100 * roof / med['engine']:.0f} % of the engine step, {100 * roof / (med['forward'] + med['logits']):.0f} % "
          "of the kernel's")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(MODELS / "model-Q8_0.gguf"))
    ap.add_argument("--tokenizer", default=str(MODELS / "tokenizer"))
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    args = ap.parse_args()
    report(measure(args), args)


if __name__ == "__main__":
    main()
