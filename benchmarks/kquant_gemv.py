"""Batch-1 GEMV over quantized weights (QuantLinear's ifl_quant_matmul, one activation row): the
blocks multiplied straight from the file (inflight/csrc/quant_gemv.h, "direct") against what ran
before, interleaved in one run, with the read bandwidth of x.sum() measured in the same run.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py                 # Llama-3-8B, 2 threads
    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py --threads 1 --flavour avx2
    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py --shape qwen05b --before main --fused
    OMP_WAIT_POLICY=PASSIVE python benchmarks/kquant_gemv.py --shape llama3-8b-k --before main --cpu --threads 1

--shape llama3-8b: one weight of each Llama-3-8B Q4_K_M tensor kind (and a Q8_0 [gate; up]).
--shape llama3-8b-k: issue 32's 8B shapes for q4_k and q6_k each (4096 x 4096, 1024 x 4096, 14336 x
4096, 4096 x 14336, 128256 x 4096), each repeated to ~64 MB so that it streams from DRAM.
--shape qwen05b: the Qwen2.5-0.5B Q4_K_M file of benchmarks/quant_bench.py, a token's worth of
each kind (llama-quantize wrote its 896-wide rows as q5_0, attn_v q8_0, ffn_down q6_k / q4_k on
alternate layers, the tied lm_head q8_0), so a line is that kind's share of a decode step.
"before": the same source built with -DIFLV_OFF (the unpack / 8-row-group paths), or with
--before REV the C sources of that git revision. --cpu: CPU seconds instead of wall time (on a loaded machine, with --threads 1: the kernel's own
cost, descheduling not counted). --ab A B: both this tree, built with
the defines A and B (e.g. --ab tree "IFLV_Q8_PF=1024"). Weights in huge pages, as the engine's. --fused: both built as the fused decode
kernel's qgemv runs one row (-DIFLG_MIN_M=2: what quant_gemv.h does not take is unpacked a row
at a time, not multiplied by the 8-row groups of QuantLinear).

Each line: the weights (qtype, N x K, how many, MB), best-of-reps ms and GB/s of quantized bytes
for a pure read of the same bytes (same threads, same static split: the line's own roofline) and
both builds, all three interleaved, the speed-up and the direct build's share of the read. Random valid blocks (speed does not depend on the values);
each line reads more than the last-level cache holds, as in decoding.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from quant_bench import cpu_name, random_weight  # noqa: E402
from report_parts import sum_bandwidth  # noqa: E402

from inflight import memory, platform  # noqa: E402
from inflight.models.cbuild import compile_cached, quant_compile_flags  # noqa: E402
from inflight.quant import kernels  # noqa: E402
from inflight.quant.weight import QTYPES, QuantWeight  # noqa: E402

# (name, qtype, N, K, count): `count` weights of N x K per token
SHAPES = {
    # Llama-3-8B (hidden 4096, intermediate 14336, vocab 128256) as a Q4_K_M file has them
    "llama3-8b": [("lm_head", "q6_k", 128256, 4096, 1), ("gate_up", "q4_k", 28672, 4096, 1),
                  ("down", "q6_k", 4096, 14336, 1), ("qkv", "q5_k", 6144, 4096, 1),
                  ("gate_up Q8_0", "q8_0", 28672, 4096, 1)],
    # issue 32's 8B shapes per K-quant type, each weight repeated to ~64 MB (twice the L3) so that
    # a line streams from DRAM as decoding does: q / o, k / v, gate / up, down, output
    "llama3-8b-k": [(f"{name}", qtype, n, k, 0) for qtype in ("q4_k", "q6_k")
                    for name, n, k in (("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096),
                                       ("down", 4096, 14336), ("output", 128256, 4096))],
    # Qwen2.5-0.5B's Q4_K_M file (24 layers): one token's weights of each kind
    "qwen05b": [("gate_up", "q5_0", 9728, 896, 24), ("q, k", "q5_0", 1024, 896, 24), ("o", "q5_0", 896, 896, 24),
                ("v", "q8_0", 128, 896, 24), ("down", "q6_k", 896, 4864, 12), ("down", "q4_k", 896, 4864, 12),
                ("lm_head", "q8_0", 151936, 896, 1)],
    # its Q8_0 file: every weight q8_0
    "qwen05b-q8": [("gate_up", "q8_0", 9728, 896, 24), ("qkv", "q8_0", 1152, 896, 24), ("o", "q8_0", 896, 896, 24),
                   ("down", "q8_0", 896, 4864, 24), ("lm_head", "q8_0", 151936, 896, 1)],
}  # fmt: skip


# The pure read of the same bytes, the same threads and the same static split: the line's roofline
# (x.sum() over 1 GiB is the machine's; this is the stream the GEMV itself could reach).
READ_SOURCE = r"""
#include <stdint.h>
uint64_t ifl_read(const uint64_t *p, long n, int nthreads) {
    uint64_t s = 0;
#pragma omp parallel for num_threads(nthreads) schedule(static) reduction(+ : s)
    for (long i = 0; i < n; ++i) s += p[i];
    return s;
}
"""


def load_read(flavour: str) -> ctypes.CDLL:
    import tempfile

    src = Path(tempfile.mkdtemp(prefix="kquant-read-")) / "read.c"
    src.write_text(READ_SOURCE)
    flags = quant_compile_flags(flavour)
    lib = ctypes.CDLL(str(compile_cached(src, f"read-{flavour}", flags)))
    lib.ifl_read.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.ifl_read.restype = ctypes.c_uint64
    return lib


def read(lib: ctypes.CDLL, qw: QuantWeight, x: torch.Tensor) -> None:
    lib.ifl_read(qw.data.data_ptr(), qw.data.numel() // 8, torch.get_num_threads())


def sources_at(rev: str) -> Path:
    """quant_kernels.c of git revision `rev`, with its headers, in a temporary directory."""
    import subprocess
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="kquant-before-"))
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "inflight/csrc"], check=True, capture_output=True)
    subprocess.run(["tar", "x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "inflight" / "csrc" / "quant_kernels.c"


def load(flavour: str, off: bool, before: str | None = None, fused: bool = False,
         defines: list[str] | None = None) -> ctypes.CDLL:  # fmt: skip
    defines = (["IFLG_MIN_M=2"] if fused else []) + (defines if defines is not None else ["IFLV_OFF"] if off and not before else [])
    source = sources_at(before) if off and before else kernels.SOURCE
    path = compile_cached(source, f"quant-{flavour}" + ("-before" if off else ""), quant_compile_flags(flavour, defines))
    lib = ctypes.CDLL(str(path))
    lib.ifl_quant_matmul.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # fmt: skip
    return lib


def gemv(lib: ctypes.CDLL, qw: QuantWeight, x: torch.Tensor) -> torch.Tensor:
    """y = x . dequantize(qw)^T of a GGML-block weight through ifl_quant_matmul, the entry point
    every revision has (a --before revision may lack kernels.matmul's newer one)."""
    y = torch.empty(x.shape[0], qw.shape[0])
    rc = lib.ifl_quant_matmul(kernels.QTYPE_IDS.index(qw.qtype), qw.shape[0], qw.shape[1], qw.group_size,
                              qw.data.data_ptr(), None, None, 0, x.data_ptr(), x.shape[0], y.data_ptr(), None,
                              torch.get_num_threads())  # fmt: skip
    assert rc == 0, rc
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flavour", default=None, help="quant kernel flavour (default: the platform's pick)")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--before", default=None, help="git revision whose C sources are the baseline")
    ap.add_argument("--fused", action="store_true", help="one row as the fused decode kernel runs it")
    ap.add_argument("--cpu", action="store_true", help="CPU seconds of the process, not wall time (a loaded machine)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ab", nargs=2, default=None, metavar=("A", "B"),
                    help="before / direct = this tree built with these defines (NAME=VALUE ..., space-separated; tree: none)")
    ap.add_argument("--qtypes", default=None, help="only these qtypes, comma-separated (q4_k,q6_k)")
    args = ap.parse_args()
    clock = time.process_time if args.cpu else time.perf_counter
    torch.set_num_threads(args.threads)
    flavour = args.flavour or platform.current().quant_flavour()
    if args.ab:
        defs = [[] if a == "tree" else a.split() for a in args.ab]
        libs = {"before": load(flavour, True, None, args.fused, defs[0]), "direct": load(flavour, False, None, args.fused, defs[1])}
    else:
        libs = {"before": load(flavour, True, args.before, args.fused), "direct": load(flavour, False, None, args.fused)}
    bw = sum_bandwidth(1 << 30)
    print(f"CPU: {cpu_name()}; flavour {flavour}; threads {args.threads}; x.sum() read {bw:.1f} GB/s; "
          f"before: {args.ab or args.before or '-DIFLV_OFF'}{' (fused: -DIFLG_MIN_M=2)' if args.fused else ''}"
          f"{'; CPU seconds' if args.cpu else ''}")
    print("| weight | qtype | N x K | count | MB | read ms (GB/s) | before ms (GB/s) | direct ms (GB/s) | speed-up "
          "| direct % of read | direct % of x.sum() |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    reader = load_read(flavour)
    runs = {"read": lambda qw, x: read(reader, qw, x)}
    runs.update({key: (lambda qw, x, lib=lib: gemv(lib, qw, x)) for key, lib in libs.items()})
    total = {key: 0.0 for key in runs}
    total_mb = 0.0
    for name, qtype, n, k, count in SHAPES[args.shape]:
        if args.qtypes and qtype not in args.qtypes.split(","):
            continue
        count = count or -(-(64 << 20) // (n * k * QTYPES[qtype][1] // QTYPES[qtype][0]))
        qws = [random_weight(qtype, n, k) for _ in range(count)]
        memory.huge_pages([qw.data for qw in qws])  # as the engine holds its weights (INFLIGHT_HUGE_PAGES)
        x = torch.randn(1, k)
        best = {key: float("inf") for key in runs}
        for _ in range(args.reps):  # interleaved: the load moves under all alike
            for key, run in runs.items():
                t0 = clock()
                for qw in qws:
                    run(qw, x)
                best[key] = min(best[key], clock() - t0)
        ys = [gemv(lib, qws[0], x) for lib in libs.values()]
        torch.testing.assert_close(ys[0], ys[1], rtol=1e-4, atol=1e-3 * ys[0].abs().max().item())
        mb = sum(qw.nbytes for qw in qws) / 1e6
        total_mb += mb
        for key in runs:
            total[key] += best[key]
        cells = " | ".join(f"{best[key] * 1e3:.2f} ({mb / 1e3 / best[key]:.1f})" for key in runs)
        print(f"| {name} | {qtype} | {n} x {k} | {count} | {mb:.0f} | {cells} | {best['before'] / best['direct']:.2f}x "
              f"| {100 * best['read'] / best['direct']:.0f} % | {100 * mb / 1e3 / best['direct'] / bw:.0f} % |", flush=True)
        del qws
    cells = " | ".join(f"{total[key] * 1e3:.2f} ({total_mb / 1e3 / total[key]:.1f})" for key in runs)
    print(f"| all | | | | {total_mb:.0f} | {cells} | {total['before'] / total['direct']:.2f}x "
          f"| {100 * total['read'] / total['direct']:.0f} % | {100 * total_mb / 1e3 / total['direct'] / bw:.0f} % |")


if __name__ == "__main__":
    main()
