/* The decode step's attention alone: decode_kernel.c's attend() (one key head's G query heads over n
 * positions of a paged K / V cache), hot (K / V in cache from the previous call) and cold (a 256 MB
 * read between calls evicts them, as a step's GEMVs do), on random bf16 rows; the Qwen2.5-0.5B shape
 * (14 query heads, 2 key heads, head_dim 64, 16-position blocks). Build and run from the repo root
 * (the decode kernel's AVX-512 flags; AVX2: -mavx2 -mfma -mf16c only):
 *
 *   gcc -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 \
 *       -DIFL_STORAGE_BF16=1 -DIFL_WEIGHTS_BF16=1 -DIFL_WEIGHTS_F16=0 -fopenmp -std=gnu11 \
 *       -Iinflight/csrc benchmarks/csrc/attend_probe.c -o /tmp/attend_probe -lm
 *   /tmp/attend_probe 2048 cold      # positions, hot | cold [, reps]; CONTIG=1: blocks in order
 *
 * Per call it prints the best and mean microseconds and ns a (query head, position). */
#include <stdio.h>
#include <time.h>

#include "decode_kernel.c"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 2048, cold = argc > 2 && !strcmp(argv[2], "cold");
    const int reps = argc > 3 ? atoi(argv[3]) : 30;
    Dims d = {0};
    d.M = 1, d.NH = 14, d.KV = 2, d.HD = 64, d.bs = 16, d.slots = 65536, d.scale = 0.125f;
    d.QKVN = (d.NH + 2 * d.KV) * d.HD;
    const int G = d.NH / d.KV, nblk = (n + d.bs - 1) / d.bs;
    const size_t kv_n = 2 * (size_t)d.KV * d.slots * d.HD;
    st_t *kv = malloc(sizeof(st_t) * kv_n), *qkv = malloc(sizeof(st_t) * d.QKVN), out[16 * 64];
    for (size_t i = 0; i < kv_n; ++i) kv[i] = ST((float)((i * 2654435761u) % 1000) / 1000.f - 0.5f);
    for (int i = 0; i < d.QKVN; ++i) qkv[i] = ST((float)(i % 17) / 17.f - 0.5f);
    int64_t *table = malloc(sizeof(int64_t) * nblk);
    for (int b = 0; b < nblk; ++b) table[b] = getenv("CONTIG") ? b : b * 3 % (d.slots / d.bs); /* scattered */
    float *scores = malloc(sizeof(float) * G * n);
    const size_t big = (size_t)256 << 20;
    char *flush = cold ? malloc(big) : NULL;
    if (cold) memset(flush, 1, big);
    double best = 1e9, total = 0;
    for (int r = 0; r < reps; ++r) {
        if (cold) {
            volatile char sink = 0;
            for (size_t i = 0; i < big; i += 64) sink += flush[i];
        }
        const double t0 = now();
        attend(&d, qkv, kv, table, nblk, 0, n - 1, 0, G, scores, out);
        const double t = now() - t0;
        total += t;
        best = t < best ? t : best;
    }
    printf("n=%d G=%d %s: best %.1f us, mean %.1f us, %.2f ns a (head, position)\n", n, G, cold ? "cold" : "hot",
           best * 1e6, total / reps * 1e6, best * 1e9 / ((double)G * n));
    return 0;
}
