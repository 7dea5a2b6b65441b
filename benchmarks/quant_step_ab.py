"""A batched step's quantized GEMMs, a before tree's C kernels against this tree's, interleaved.

    git worktree add /tmp/before <rev>
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quant_step_ab.py --before /tmp/before            # Q4_K_M, 32 rows
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quant_step_ab.py --before /tmp/before --file Q8_0 --rows 512

Loads the GGUF file (by default quant_bench.py's llama-quantize output, ~/.cache/inflight/llama.cpp/models)
with this tree, then times every linear layer of the model (q / k / v, o, [gate; up], down of each
decoder layer and the lm_head) on `--rows` random activation rows: A = the before tree's
quant_kernels.c, called once per weight of a layer with the outputs joined by torch.cat (what
QuantLinear did before d25a599; `ifl_quant_matmul` kept its signature), B = this tree's
QuantLinear.apply. A and B alternate; best of `--reps` of each, wall and CPU time of the process
(CPU time is the steadier figure on a shared machine). Prints one line per side and whether the
outputs agree.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import torch

from inflight import LLM, platform
from inflight.models.cbuild import compile_cached, quant_compile_flags
from inflight.models.linear import linear_layers
from inflight.quant import kernels
from inflight.quant.weight import QuantWeight

MODELS = Path.home() / ".cache" / "inflight" / "llama.cpp" / "models"


def before_library(tree: Path) -> ctypes.CDLL:
    flavour = platform.current().quant_flavour()
    flags = quant_compile_flags(flavour)
    lib = ctypes.CDLL(str(compile_cached(tree / "inflight" / "csrc" / "quant_kernels.c", f"quant-{flavour}", flags)))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.ifl_quant_matmul.argtypes = [i, i, i, i, p, p, p, i, p, i, p, p, i]
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a source tree (git worktree) of the kernels before")
    ap.add_argument("--file", default="Q4_K_M", help="model-<FILE>.gguf under --models, or a path")
    ap.add_argument("--models", default=str(MODELS))
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = before_library(Path(args.before))
    path = Path(args.file) if args.file.endswith(".gguf") else Path(args.models) / f"model-{args.file}.gguf"
    llm = LLM(model=str(path), tokenizer=str(Path(args.models) / "tokenizer"), dtype="float32", device="cpu",
              max_num_seqs=32, max_model_len=256, progress=False)  # fmt: skip
    layers = [(lay, torch.randn(args.rows, lay.in_features)) for lay in linear_layers(llm.engine.executor.runner.model)]

    def old(w: QuantWeight, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], w.shape[0])
        scales = None if w.scales is None else w.scales.data_ptr()
        rc = lib.ifl_quant_matmul(kernels.QTYPE_IDS.index(w.qtype), w.shape[0], w.shape[1], w.group_size,
                                  w.data.data_ptr(), scales, None, 0, x.data_ptr(), x.shape[0], y.data_ptr(), None,
                                  args.threads)  # fmt: skip
        assert rc == 0
        return y

    def a() -> list[torch.Tensor]:
        ys = [torch.cat([old(w, x) for w in lay.method.weights], dim=-1) for lay, x in layers]
        return [y if lay.bias is None else y + lay.bias for y, (lay, _) in zip(ys, layers)]  # q / k / v of qwen2

    def b() -> list[torch.Tensor]:
        return [lay.method.apply(lay, x) for lay, x in layers]

    best = {"A before": [1e9, 1e9], "B this tree": [1e9, 1e9]}
    with torch.inference_mode():
        same = all(torch.allclose(ya, yb, rtol=1e-4, atol=1e-4) for ya, yb in zip(a(), b()))
        for _ in range(args.reps):
            for side, fn in (("A before", a), ("B this tree", b)):
                t, c = time.perf_counter(), time.process_time()
                fn()
                best[side][0] = min(best[side][0], time.perf_counter() - t)
                best[side][1] = min(best[side][1], time.process_time() - c)
    kinds = sorted({w.qtype for lay, _ in layers for w in lay.method.weights})
    print(f"{path.name} ({'/'.join(kinds)}), {len(layers)} layers, {args.rows} rows, {args.threads} threads, "
          f"kernels {platform.current().quant_flavour()}, best of {args.reps}; outputs agree: {same}")  # fmt: skip
    for side, (wall, cpu) in best.items():
        print(f"  {side}: wall {wall * 1e3:.1f} ms, CPU {cpu * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
