"""The quantized 1-row GEMV's own cost: one core, weights in L2, ns per block (a K-quant's 256
elements, q4_0 .. q5_1's 32), ours (inflight/csrc/quant_gemv.h's iflv_dots, this tree and a --before
revision) beside llama.cpp's ggml_vec_dot_q4_K_q8_K / q6_K_q8_K / q5_0_q8_0 / q4_0_q8_0 on the same
bytes, rounds interleaved.

    python benchmarks/kquant_l2.py                       # avx512vnni here, before = main
    python benchmarks/kquant_l2.py --before 9ebcc04 --flavour avx2
    python benchmarks/kquant_l2.py --qtypes q5_0,q4_0,q4_1,q5_1 --before 12a92da

Small C drivers (built here, run as processes: no Python in the timed loop), each a best-of-reps
pass over N rows of random blocks (f16 scales 0.01) in tiles of 8 rows as the callers run them.
Decode streams its weights from DRAM; a kernel slower than the memory here is slower there too, and
this figure does not move with the neighbours' memory traffic that DRAM figures do on a shared VM.
llama.cpp: the static libraries of quant_bench.py's build (GGML_NATIVE: for q4_K / q6_K its AVX2
code; its activations are q8_K, int8 per 256 with one float scale, ours per 32). Our block count
also covers llama.cpp's repacked q4_K (8 rows interleaved, what its CPU backend runs for Q4_K
weights on AVX2) only in that both read the same bytes: that path is not called here.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from kquant_gemv import sources_at  # noqa: E402
from llamacpp import llama_build_dir  # noqa: E402
from quant_bench import cpu_name  # noqa: E402

from inflight import platform  # noqa: E402
from inflight.quant import kernels  # noqa: E402

# qtype ids of quant_kernels.h's enum, block bytes, the f16 scales' offsets, elements a block
TYPES = {"q8_0": (0, 34, (0,), 32), "q4_k": (2, 144, (0, 2), 256), "q5_k": (3, 176, (0, 2), 256), "q6_k": (4, 210, (208,), 256), "q4_0": (1, 18, (0,), 32),
         "q4_1": (7, 20, (0, 2), 32), "q5_0": (8, 22, (0,), 32), "q5_1": (9, 24, (0, 2), 32)}
# (qtype, N, K): ~150-450 KB, in L2; the 32-element formats at Qwen2.5-0.5B's K (its q5_0 rows)
SHAPES = [("q4_k", 128, 4096), ("q4_k", 64, 14336), ("q5_k", 128, 4096), ("q6_k", 128, 4096), ("q6_k", 64, 14336),
          ("q8_0", 256, 896), ("q8_0", 64, 4864), ("q5_0", 256, 896), ("q4_0", 256, 896), ("q4_1", 256, 896), ("q5_1", 256, 896)]
LLAMA_FNS = {"q4_k": 2, "q6_k": 4, "q5_0": 8, "q4_0": 1, "q8_0": 0}  # llama.cpp's dot for these (q4_1 / q5_1: q8_1 activations)

COMMON = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static uint8_t *blocks(int bb, int nblk, int h0, int h1) { /* random bytes, f16 scales 0.01 */
    uint8_t *d = malloc((size_t)bb * nblk);
    srand(1);
    for (size_t i = 0; i < (size_t)bb * nblk; ++i) d[i] = (uint8_t)rand();
    const uint16_t h = 0x211e;
    for (int b = 0; b < nblk; ++b) { memcpy(d + (size_t)b * bb + h0, &h, 2); if (h1 >= 0) memcpy(d + (size_t)b * bb + h1, &h, 2); }
    return d;
}
"""

OURS = COMMON + r"""
#include "quant_kernels.h"
int main(int argc, char **argv) {
    int qt = atoi(argv[1]), bb = atoi(argv[2]), h0 = atoi(argv[3]), h1 = atoi(argv[4]), N = atoi(argv[5]), K = atoi(argv[6]), reps = atoi(argv[7]), qk = atoi(argv[8]);
    uint8_t *d = blocks(bb, N * (K / qk), h0, h1);
    QWeight w = {qt, N, K, 0, d, NULL, NULL, 0};
    float *x = malloc(4 * K), *dx = malloc(4 * K / 32), *xb = malloc(4 * K / 16), y[8];
    int8_t *xq = malloc(K);
    for (int k = 0; k < K; ++k) x[k] = (float)rand() / RAND_MAX - 0.5f;
    iflq_quantize_row(x, K, xq, dx, xb);
    double best = 1e9, sum = 0;
    for (int r = 0; r < reps; ++r) {
        double t0 = now();
        for (int n = 0; n < N; n += 8) { iflv_dots(&w, n, N - n < 8 ? N - n : 8, xq, dx, xb, y); sum += y[0]; }
        if (now() - t0 < best) best = now() - t0;
    }
    printf("%.4f %g\n", best * 1e9 / (N * ((double)K / qk)), sum);
    return 0;
}
"""

LLAMA = COMMON + r"""
void ggml_cpu_init(void);
void quantize_row_q8_K(const float *x, void *y, int64_t k);
void ggml_vec_dot_q4_K_q8_K(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_vec_dot_q6_K_q8_K(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void quantize_row_q8_0(const float *x, void *y, int64_t k);
void ggml_vec_dot_q5_0_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_vec_dot_q4_0_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void ggml_vec_dot_q8_0_q8_0(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
int main(int argc, char **argv) {
    int qt = atoi(argv[1]), bb = atoi(argv[2]), h0 = atoi(argv[3]), h1 = atoi(argv[4]), N = atoi(argv[5]), K = atoi(argv[6]), reps = atoi(argv[7]), qk = atoi(argv[8]);
    ggml_cpu_init();
    uint8_t *d = blocks(bb, N * (K / qk), h0, h1);
    float *x = malloc(4 * K), y;
    for (int k = 0; k < K; ++k) x[k] = (float)rand() / RAND_MAX - 0.5f;
    void *xq = malloc((size_t)K / 32 * 40); /* q8_K: 292 bytes a 256, q8_0: 34 a 32 */
    if (qk == 256) quantize_row_q8_K(x, xq, K);
    else quantize_row_q8_0(x, xq, K);
    double best = 1e9, sum = 0;
    const size_t rb = (size_t)bb * (K / qk);
    for (int r = 0; r < reps; ++r) {
        double t0 = now();
        for (int n = 0; n < N; ++n) {
            if (qt == 4) ggml_vec_dot_q6_K_q8_K(K, &y, 0, d + rb * n, 0, xq, 0, 1);
            else if (qt == 8) ggml_vec_dot_q5_0_q8_0(K, &y, 0, d + rb * n, 0, xq, 0, 1);
            else if (qt == 1) ggml_vec_dot_q4_0_q8_0(K, &y, 0, d + rb * n, 0, xq, 0, 1);
            else if (qt == 0) ggml_vec_dot_q8_0_q8_0(K, &y, 0, d + rb * n, 0, xq, 0, 1);
            else ggml_vec_dot_q4_K_q8_K(K, &y, 0, d + rb * n, 0, xq, 0, 1);
            sum += y;
        }
        if (now() - t0 < best) best = now() - t0;
    }
    printf("%.4f %g\n", best * 1e9 / (N * ((double)K / qk)), sum);
    return 0;
}
"""


def build(csrc: Path | None, flags: list[str], out: Path, source: str, libs: list[str]) -> Path:
    work = Path(tempfile.mkdtemp(prefix="kquant-l2-"))
    if csrc is not None:
        for h in csrc.glob("*.h"):
            shutil.copy(h, work)
    (work / "driver.c").write_text(source)
    subprocess.run(["gcc", "-O3", *flags, str(work / "driver.c"), "-o", str(out), *libs, "-lm"], check=True)
    return out


def run(exe: Path, qtype: str, n: int, k: int, reps: int) -> float:
    qt, bb, halves, qk = TYPES[qtype]
    h1 = halves[1] if len(halves) > 1 else -1
    out = subprocess.run([str(exe), str(qt), str(bb), str(halves[0]), str(h1), str(n), str(k), str(reps), str(qk)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return float(re.split(r"\s+", out.strip())[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="main", help="git revision whose C sources are the baseline")
    ap.add_argument("--flavour", default=None, help="quant kernel flavour (default: the platform's pick)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--qtypes", default="q4_k,q6_k", help="comma-separated, of " + ",".join(TYPES))
    args = ap.parse_args()
    qtypes = args.qtypes.split(",")
    flavour = args.flavour or platform.current().quant_flavour()
    flags = platform.current().quant_flags(flavour)
    work = Path(tempfile.mkdtemp(prefix="kquant-l2-bin-"))
    exes = {"before": build(sources_at(args.before).parent, flags, work / "before", OURS, []),
            "now": build(kernels.SOURCE.parent, flags, work / "now", OURS, [])}  # fmt: skip
    ggml = llama_build_dir() / "ggml" / "src"
    if (ggml / "libggml-cpu.a").exists():
        libs = [str(ggml / "libggml-cpu.a"), str(ggml / "libggml-base.a"), "-lstdc++", "-fopenmp"]
        exes["llama.cpp"] = build(None, [], work / "llama", LLAMA, libs)
    print(f"CPU: {cpu_name()}; flavour {flavour}; one core, in L2; before: {args.before}; best of {args.rounds} "
          f"interleaved rounds")  # fmt: skip
    print("| qtype | N x K | KB | " + " | ".join(f"{key} ns/block (GB/s)" for key in exes) + " | now / before |")
    print("|---|---|---:|" + "---:|" * (len(exes) + 1))
    for qtype, n, k in (shape for shape in SHAPES if shape[0] in qtypes):
        keys = [key for key in exes if key != "llama.cpp" or qtype in LLAMA_FNS]
        best = {key: float("inf") for key in keys}
        for _ in range(args.rounds):
            for key in keys:
                best[key] = min(best[key], run(exes[key], qtype, n, k, 100))
        bb = TYPES[qtype][1]
        cells = " | ".join(f"{best[key]:.2f} ({bb / best[key]:.1f})" if key in best else "-" for key in exes)
        print(f"| {qtype} | {n} x {k} | {n * k // TYPES[qtype][3] * bb / 1e3:.0f} | {cells} | {best['before'] / best['now']:.2f}x |")


if __name__ == "__main__":
    main()
