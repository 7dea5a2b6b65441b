/* The q5_0 1-row GEMV on the file's blocks (quant_gemv_q32_pair.h's iflv_dot_pair) against the same
 * weights regrouped as the engine does at load on AVX-512 VNNI (q5_0g, quant_gemv_q5g.h), both through
 * iflv_dots, on the same random blocks (not built by inflight; the probe that led to q5_0g, docs/
 * quant_history.md "2026-11-27 (lead, 13:00-14:00 UTC)"). Build and run from the repo root:
 *
 *   gcc -O3 $(python -c "from inflight import platform as p; c = p.current(); print(' '.join(c.quant_flags(c.quant_flavour())))") \
 *       -fopenmp -Iinflight/csrc benchmarks/csrc/q5_0_groups_probe.c -o /tmp/q5g -lm && /tmp/q5g
 *
 * AVX-512 VNNI only. Layout per 4 blocks (88 bytes, as the 4 x 22 of the file): qs of blocks 0-3 (64:
 * one 512-bit load, each 128-bit lane a block), the low halves of their 32-bit qh (8: one k-mask
 * for elements 0-15 of all four), the high halves (8: elements 16-31), their f16 d (8). The file's
 * layout needs an insert a block for the quants, two GPR -> k-mask moves a pair and a two-source
 * permute for the d's: all on the shuffle port, which bounds it (~11 of its uops per 4 blocks). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "quant_kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void regroup(const uint8_t *src, uint8_t *dst, size_t nblocks) {
    for (size_t g = 0; g + 4 <= nblocks; g += 4)
        for (int k = 0; k < 4; ++k) {
            const uint8_t *s = src + (g + k) * 22;
            uint8_t *d = dst + g * 22;
            uint32_t qh;
            memcpy(&qh, s + 2, 4);
            const uint16_t lo = (uint16_t)qh, hi = (uint16_t)(qh >> 16);
            memcpy(d + 16 * k, s + 6, 16);
            memcpy(d + 64 + 2 * k, &lo, 2);
            memcpy(d + 72 + 2 * k, &hi, 2);
            memcpy(d + 80 + 2 * k, s, 2);
        }
}

static uint8_t *huge(size_t bytes) {
    uint8_t *p = mmap(NULL, bytes + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = (uint8_t *)(((uintptr_t)p + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static uint64_t read_all(const uint8_t *p, size_t lo, size_t hi) { /* the pure read: 8 vectors OR'd */
    __m256i a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_si256();
    for (size_t c = lo; c + 256 <= hi; c += 256)
        for (int i = 0; i < 8; ++i) a[i] = _mm256_or_si256(a[i], _mm256_loadu_si256((const __m256i *)(p + c + 32 * i)));
    for (int i = 1; i < 8; ++i) a[0] = _mm256_or_si256(a[0], a[i]);
    return (uint64_t)_mm256_extract_epi64(a[0], 0);
}

/* kind 0: the engine's q5_0 dot; 1: the regrouped one; 2: the read. `rows` rows of K = 896 in `chunks`
 * (each split in halves over 2 threads, a barrier after each), in tiles of 32 rows as qgemv's */
static double pass(int kind, int threads, const uint8_t *w, const uint8_t *wg, int rows, int chunks, const int8_t *xq,
                   const float *dx, const float *xb, float *y) {
    const int K = 896;
    const size_t rowb = 22 * (size_t)(K / 32);
    volatile uint64_t sink = 0;
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), nth = omp_get_num_threads(), per = rows / chunks;
        const QWeight qw = {QT_Q5_0, rows, K, 0, w, NULL, NULL, 0}, gw = {QT_Q5_0G, rows, K, 0, wg, NULL, NULL, 0};
        for (int c = 0; c < chunks; ++c) {
            const int lo = c * per + per * me / nth, hi = c * per + per * (me + 1) / nth;
            for (int n = lo; n < hi && kind < 2; n += 32)
                iflv_dots(kind ? &gw : &qw, n, hi - n < 32 ? hi - n : 32, xq, dx, xb, y + n);
            if (kind == 2) sink |= read_all(w, (size_t)lo * rowb, (size_t)hi * rowb);
#pragma omp barrier
        }
    }
    return now() - t0;
}

int main(void) {
    const int K = 896, big = (int)(533e6 / (22.0 * 28)) / 256 * 256, small = 256;
    const size_t rowb = 22 * (size_t)(K / 32), bytes = rowb * (size_t)big;
    uint8_t *w = huge(bytes), *wg = huge(bytes);
    srand(1);
    for (size_t i = 0; i < bytes; ++i) w[i] = (uint8_t)rand();
    const uint16_t h = 0x211e; /* d = 0.01 */
    for (size_t b = 0; b < bytes / 22; ++b) memcpy(w + 22 * b, &h, 2);
    regroup(w, wg, bytes / 22);
    float x[896], dx[28], xb[56], *y0 = malloc(4 * (size_t)big), *y1 = malloc(4 * (size_t)big);
    int8_t xq[896];
    for (int k = 0; k < K; ++k) x[k] = (float)rand() / RAND_MAX - 0.5f;
    iflq_quantize_row(x, K, xq, dx, xb);
    pass(0, 1, w, wg, small, 1, xq, dx, xb, y0);
    pass(1, 1, w, wg, small, 1, xq, dx, xb, y1);
    double diff = 0, top = 0;
    for (int n = 0; n < small; ++n) diff = fmax(diff, fabs(y0[n] - y1[n])), top = fmax(top, fabs(y0[n]));
    printf("256 x 896 q5_0: max |q5_0 - q5_0g| %.2g of max |y| %.2g\n", diff, top);
    double l2[2] = {1e9, 1e9};
    for (int r = 0; r < 300; ++r)
        for (int k = 0; k < 2; ++k) l2[k] = fmin(l2[k], pass(k, 1, w, wg, small, 1, xq, dx, xb, y0));
    printf("one core, in L2: q5_0 %.3f ns a block, q5_0g %.3f (%.2fx)\n", l2[0] * 1e9 / (small * 28.0),
           l2[1] * 1e9 / (small * 28.0), l2[0] / l2[1]);
    for (int r = 0; r < 5; ++r) {
        double t[3];
        for (int k = 0; k < 3; ++k) t[k] = pass(k, 2, w, wg, big, 24, xq, dx, xb, y0);
        printf("2 threads, %.0f MB from DRAM: q5_0 %.1f GB/s (%.0f %% of the read), q5_0g %.1f (%.0f %%), read %.1f\n",
               bytes / 1e6, bytes / t[0] / 1e9, 100 * t[2] / t[0], bytes / t[1] / 1e9, 100 * t[2] / t[1], bytes / t[2] / 1e9);
    }
    return 0;
}
