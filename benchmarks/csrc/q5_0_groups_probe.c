/* Design probe (not built by inflight): the q5_0 1-row GEMV on a load-time regrouped layout against
 * the engine's own (quant_gemv_q32_pair.h's iflv_dot_pair, through iflv_dots), on the same random
 * blocks; docs/quant_history.md "2026-11-27 (lead, 13:00-14:00 UTC)". Build and run from the repo root:
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

/* activations for 4 blocks: [x 0-15 of blocks 0-3 | x 16-31 of 0-3]; offsets -16 x their sums per 4 lanes */
static void group_acts(int K, const int8_t *xq, int8_t *xp, int32_t *xs) {
    for (int b = 0; b + 4 <= K / 32; b += 4)
        for (int k = 0; k < 4; ++k) {
            memcpy(xp + 32 * b + 16 * k, xq + 32 * (b + k), 16);
            memcpy(xp + 32 * b + 64 + 16 * k, xq + 32 * (b + k) + 16, 16);
            for (int j = 0; j < 4; ++j) {
                int s = 0;
                for (int i = 0; i < 4; ++i) s += xq[32 * (b + k) + 4 * j + i] + xq[32 * (b + k) + 16 + 4 * j + i];
                xs[4 * b + 4 * k + j] = -16 * s;
            }
        }
}

static inline __m256 group_row(const uint8_t *row, int nb, const int8_t *xp, const int32_t *xs, const float *dx) {
    __m512 acc = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0xF), b16 = _mm512_set1_epi8(0x10);
    const __m512i fsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int b = 0; b + 4 <= nb; b += 4) {
        const uint8_t *g = row + (size_t)b * 22;
        _mm_prefetch((const char *)g + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)g + 2048 + 64, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(g);
        uint64_t ka, kc;
        memcpy(&ka, g + 64, 8);
        memcpy(&kc, g + 72, 8);
        const __m512i qa = _mm512_ternarylogic_epi32(v, _mm512_maskz_mov_epi8(_cvtu64_mask64(ka), b16), low, 0xEC);
        const __m512i qc = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), _mm512_maskz_mov_epi8(_cvtu64_mask64(kc), b16),
                                                     low, 0xEC);
        __m512i p = _mm512_dpbusd_epi32(_mm512_loadu_si512(xs + 4 * b), qa, _mm512_loadu_si512(xp + 32 * b));
        p = _mm512_dpbusd_epi32(p, qc, _mm512_loadu_si512(xp + 32 * b + 64));
        const __m128 f = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + 80))), _mm_loadu_ps(dx + b));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(fsel, _mm512_castps128_ps512(f)), acc);
    }
    return _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
}

static void group_range(const uint8_t *w, int K, int n0, int nt, const int8_t *xp, const int32_t *xs, const float *dx,
                        float *out) {
    for (int c = 0; c < nt; c += 8) {
        __m256 v[8];
        for (int r = 0; r < 8; ++r)
            v[r] = r < nt - c ? group_row(w + (size_t)(n0 + c + r) * 22 * (K / 32), K / 32, xp, xs, dx) : _mm256_setzero_ps();
        float s[8];
        _mm256_storeu_ps(s, iflv_hsum8(v));
        memcpy(out + c, s, sizeof(float) * (size_t)(nt - c < 8 ? nt - c : 8));
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
                   const float *dx, const float *xb, const int8_t *xp, const int32_t *xs, float *y) {
    const int K = 896;
    const size_t rowb = 22 * (size_t)(K / 32);
    volatile uint64_t sink = 0;
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), nth = omp_get_num_threads(), per = rows / chunks;
        const QWeight qw = {QT_Q5_0, rows, K, 0, w, NULL, NULL, 0};
        for (int c = 0; c < chunks; ++c) {
            const int lo = c * per + per * me / nth, hi = c * per + per * (me + 1) / nth;
            for (int n = lo; n < hi && kind < 2; n += 32) {
                if (kind == 0) iflv_dots(&qw, n, hi - n < 32 ? hi - n : 32, xq, dx, xb, y + n);
                else group_range(wg, K, n, hi - n < 32 ? hi - n : 32, xp, xs, dx, y + n);
            }
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
    int8_t xq[896], xp[896];
    int32_t xs[112];
    for (int k = 0; k < K; ++k) x[k] = (float)rand() / RAND_MAX - 0.5f;
    iflq_quantize_row(x, K, xq, dx, xb);
    group_acts(K, xq, xp, xs);
    pass(0, 1, w, wg, small, 1, xq, dx, xb, xp, xs, y0);
    pass(1, 1, w, wg, small, 1, xq, dx, xb, xp, xs, y1);
    double diff = 0, top = 0;
    for (int n = 0; n < small; ++n) diff = fmax(diff, fabs(y0[n] - y1[n])), top = fmax(top, fabs(y0[n]));
    printf("256 x 896 q5_0: max |engine - regrouped| %.2g of max |y| %.2g\n", diff, top);
    double l2[2] = {1e9, 1e9};
    for (int r = 0; r < 300; ++r)
        for (int k = 0; k < 2; ++k) l2[k] = fmin(l2[k], pass(k, 1, w, wg, small, 1, xq, dx, xb, xp, xs, y0));
    printf("one core, in L2: engine %.3f ns a block, regrouped %.3f (%.2fx)\n", l2[0] * 1e9 / (small * 28.0),
           l2[1] * 1e9 / (small * 28.0), l2[0] / l2[1]);
    for (int r = 0; r < 5; ++r) {
        double t[3];
        for (int k = 0; k < 3; ++k) t[k] = pass(k, 2, w, wg, big, 24, xq, dx, xb, xp, xs, y0);
        printf("2 threads, %.0f MB from DRAM: engine %.1f GB/s (%.0f %% of the read), regrouped %.1f (%.0f %%), read %.1f\n",
               bytes / 1e6, bytes / t[0] / 1e9, 100 * t[2] / t[0], bytes / t[1] / 1e9, 100 * t[2] / t[1], bytes / t[2] / 1e9);
    }
    return 0;
}
