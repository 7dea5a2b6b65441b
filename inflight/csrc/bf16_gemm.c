/* inflight bf16 GEMM on plain weights: y (M, N) = x (M, K) . w (N, K)^T (+ bias), bf16 in and out,
 * float32 accumulation, with vdpbf16ps (AVX512_BF16: 16 lanes, each adding the products of a pair
 * of bf16 elements). Its point is memory: it reads the very (N, K) row-major bf16 weights the batch-1
 * decode kernel reads, so a bf16 model on an AVX-512 BF16 CPU holds its linear weights once, not
 * beside oneDNN's opaque packed copy (inflight/models/cpu_linear.py, docs/QUANTIZATION.md "One copy").
 *
 * The weights stay as they are; the activations are repacked once per call into k-pair-interleaved
 * panels of 16 rows (word kp of row m at panel[kp * 16 + m], zeros past M), so one vector holds 16
 * activation rows' pair kp and each weight row's pair kp is a 32-bit broadcast: a register tile of
 * NR = 8 weight rows x 2 panels (32 activation rows) is 16 accumulators, fed per pair by 2 panel
 * loads and 8 broadcasts, and no horizontal sums (a dot-product prototype lost at K = 896 on them).
 * Below 16 rows, where most lanes would idle (4.3 x oneDNN at 2 rows), 32-element dot products of
 * 4 weight rows x 4 activation rows instead (iflb_dots). Both prefetch the weight rows ahead.
 * Measured on a Zen 4, 2 threads (benchmarks/bf16_gemm_ab.py): 0.86-1.03 x oneDNN's packed GEMM
 * on the Qwen2.5-0.5B shapes at 16-128 rows, 0.88-1.38 at 2-8. The output is rounded once to bf16
 * (to nearest even, as torch); vdpbf16ps itself treats bf16 denormal inputs as zero, as oneDNN's
 * bf16 GEMM on these CPUs does. Threads split the weight rows (N) statically. K must be even.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define IFLB_NR 8  /* weight rows per register tile */
#ifndef IFLB_PF
#define IFLB_PF 8 /* weight rows prefetched ahead (2-3 x faster at 1-8 rows from memory, [gate; up]) */
#endif
#define IFLB_MC 64 /* activation rows per pass over a thread's weights: 64 x K=4864 bf16 = 608 KiB, L2 */

int ifl_bf16_abi_version(void) { return 1; }

static inline uint16_t iflb_round(float f) { /* float -> bf16, round to nearest even (as torch) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float iflb_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t iflb_word(const uint16_t *row, int kp) {
    uint32_t u;
    memcpy(&u, row + 2 * (size_t)kp, 4);
    return u;
}

/* tile[j][v * 16 + i] = w row j . x row (16 v + i) over all K2 pairs; MV (1-2) panels p[v] */
static inline __attribute__((always_inline)) void iflb_micro(const uint16_t *const *w, const uint32_t *p0,
                                                             const uint32_t *p1, const int MV, int K2, const float *bias,
                                                             uint16_t *tile) {
    /* named accumulators: gcc keeps an array of them on the stack (see float_kernels.c) */
    __m512 a00 = _mm512_setzero_ps(), a10 = a00, a20 = a00, a30 = a00, a40 = a00, a50 = a00, a60 = a00, a70 = a00;
    __m512 a01 = a00, a11 = a00, a21 = a00, a31 = a00, a41 = a00, a51 = a00, a61 = a00, a71 = a00;
    for (int kp = 0; kp < K2; ++kp) {
        if (!(kp & 15)) /* the next tile's rows, a line at a time (the hardware's prefetch lags 8 streams) */
            for (int j = 0; j < IFLB_NR; ++j) _mm_prefetch((const char *)(w[j] + (size_t)IFLB_PF * 2 * K2 + 2 * kp), _MM_HINT_T0);
        const __m512bh x0 = (__m512bh)_mm512_loadu_si512(p0 + (size_t)kp * 16);
        const __m512bh x1 = MV > 1 ? (__m512bh)_mm512_loadu_si512(p1 + (size_t)kp * 16) : x0;
#define IFLB_STEP(j)                                                              \
    {                                                                             \
        const __m512bh wb = (__m512bh)_mm512_set1_epi32((int)iflb_word(w[j], kp)); \
        a##j##0 = _mm512_dpbf16_ps(a##j##0, x0, wb);                              \
        if (MV > 1) a##j##1 = _mm512_dpbf16_ps(a##j##1, x1, wb);                  \
    }
        IFLB_STEP(0) IFLB_STEP(1) IFLB_STEP(2) IFLB_STEP(3) IFLB_STEP(4) IFLB_STEP(5) IFLB_STEP(6) IFLB_STEP(7)
#undef IFLB_STEP
    }
    const __m512 acc[IFLB_NR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31},
                                    {a40, a41}, {a50, a51}, {a60, a61}, {a70, a71}};
    for (int j = 0; j < IFLB_NR; ++j) /* + bias, rounded to bf16 (to nearest even, as torch) in the vector */
        for (int v = 0; v < MV; ++v)
            _mm256_storeu_si256((__m256i *)(tile + j * 32 + v * 16),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[j][v], _mm512_set1_ps(bias[j]))));
}

/* x (M, K) -> panels of 16 rows, pair-interleaved; the pairs split over the team */
static void iflb_pack(const uint16_t *x, int M, int K2, int blocks, uint32_t *panel) {
#pragma omp for schedule(static)
    for (int kp = 0; kp < K2; ++kp)
        for (int b = 0; b < blocks; ++b)
            for (int i = 0; i < 16; ++i) {
                const int m = b * 16 + i;
                panel[((size_t)b * K2 + kp) * 16 + i] = m < M ? iflb_word(x + (size_t)m * 2 * K2, kp) : 0u;
            }
}

/* weight rows [t0, t1) in tiles of 8 (the last tile's missing rows repeat its last row, not stored) */
static void iflb_rows(const uint16_t *w, int N, int K2, const uint32_t *panel, int M, int blocks, int t0, int t1,
                      uint16_t *y, const uint16_t *bias) {
    uint16_t tile[IFLB_NR * 32];
    for (int mc = 0; mc < blocks; mc += IFLB_MC / 16) {
        const int mc1 = blocks - mc < IFLB_MC / 16 ? blocks : mc + IFLB_MC / 16;
        for (int t = t0; t < t1; ++t) {
            const int n0 = t * IFLB_NR, nr = N - n0 < IFLB_NR ? N - n0 : IFLB_NR;
            const uint16_t *rows[IFLB_NR];
            float bj[IFLB_NR];
            for (int j = 0; j < IFLB_NR; ++j) {
                rows[j] = w + (size_t)(n0 + (j < nr ? j : nr - 1)) * 2 * K2;
                bj[j] = bias && j < nr ? iflb_widen(bias[n0 + j]) : 0.f;
            }
            for (int b = mc; b < mc1; b += 2) {
                const int mv = mc1 - b < 2 ? 1 : 2;
                const uint32_t *p0 = panel + (size_t)b * K2 * 16, *p1 = p0 + (size_t)K2 * 16;
                if (mv == 2)
                    iflb_micro(rows, p0, p1, 2, K2, bj, tile);
                else
                    iflb_micro(rows, p0, p0, 1, K2, bj, tile);
                const int m0 = b * 16, m1 = M < m0 + mv * 16 ? M : m0 + mv * 16;
                for (int m = m0; m < m1; ++m)
                    for (int j = 0; j < nr; ++j) y[(size_t)m * N + n0 + j] = tile[j * 32 + (m - m0)];
            }
        }
    }
}

/* ---- M < IFLB_PANEL_MIN: lanes over k instead (an activation panel of 16 rows would leave most
 * lanes idle: 4.3 x oneDNN at 2 rows, measured): 4 weight rows x up to 4 activation rows of
 * 32-element dots, 16 accumulators summed across their lanes once per tile. */
#ifndef IFLB_PANEL_MIN
#define IFLB_PANEL_MIN 16
#endif

static inline __attribute__((always_inline)) void iflb_dots(const uint16_t *const *w, const uint16_t *x, int K,
                                                            const int MR, float out[4][4]) {
    __m512 c[4][4];
    for (int j = 0; j < 4; ++j)
        for (int m = 0; m < MR; ++m) c[j][m] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? 0xffffffffu : (1u << (K - k)) - 1u;
        __m512bh wv[4], xv[4];
        for (int j = 0; j < 4; ++j) {
            _mm_prefetch((const char *)(w[j] + (size_t)IFLB_PF * K + k), _MM_HINT_T0);
            wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[j] + k);
        }
        for (int m = 0; m < MR; ++m) xv[m] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (size_t)m * K + k);
        for (int j = 0; j < 4; ++j)
            for (int m = 0; m < MR; ++m) c[j][m] = _mm512_dpbf16_ps(c[j][m], wv[j], xv[m]);
    }
    for (int j = 0; j < 4; ++j)
        for (int m = 0; m < MR; ++m) out[j][m] = _mm512_reduce_add_ps(c[j][m]);
}

static void iflb_dot_rows(const uint16_t *w, int N, int K, const uint16_t *x, int M, int n0, int n1, uint16_t *y,
                          const uint16_t *bias) {
    for (int n = n0; n < n1; n += 4) {
        const int nr = n1 - n < 4 ? n1 - n : 4;
        const uint16_t *rows[4];
        for (int j = 0; j < 4; ++j) rows[j] = w + (size_t)(n + (j < nr ? j : nr - 1)) * K;
        for (int m0 = 0; m0 < M; m0 += 4) {
            const int mr = M - m0 < 4 ? M - m0 : 4;
            float out[4][4];
            const uint16_t *xm = x + (size_t)m0 * K;
            switch (mr) { /* a constant MR keeps the accumulators in registers */
            case 4: iflb_dots(rows, xm, K, 4, out); break;
            case 3: iflb_dots(rows, xm, K, 3, out); break;
            case 2: iflb_dots(rows, xm, K, 2, out); break;
            default: iflb_dots(rows, xm, K, 1, out); break;
            }
            for (int j = 0; j < nr; ++j) {
                const float bj = bias ? iflb_widen(bias[n + j]) : 0.f;
                for (int m = 0; m < mr; ++m) y[(size_t)(m0 + m) * N + n + j] = iflb_round(out[j][m] + bj);
            }
        }
    }
}

/* y (M, N) = x (M, K) . w (N, K)^T + bias, all bf16 (bias may be NULL). Returns 0, -1 on a bad
 * argument (K odd), -2 out of memory. */
int ifl_bf16_gemm(int N, int K, const void *w, const void *x, int M, void *y, const void *bias, int nthreads) {
    if (N <= 0 || K <= 0 || (K & 1) || M <= 0 || nthreads <= 0 || !w || !x || !y) return -1;
    if (M < IFLB_PANEL_MIN) {
        const int quads = (N + 3) / 4;
        if (nthreads > quads) nthreads = quads;
#pragma omp parallel num_threads(nthreads)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int n0 = 4 * (int)((long)quads * t / nt), n1 = 4 * (int)((long)quads * (t + 1) / nt);
            iflb_dot_rows(w, N, K, x, M, n0, n1 < N ? n1 : N, y, bias);
        }
        return 0;
    }
    const int K2 = K / 2, blocks = (M + 15) / 16, tiles = (N + IFLB_NR - 1) / IFLB_NR;
    uint32_t *panel = aligned_alloc(64, ((size_t)blocks * K2 * 16 * 4 + 63) / 64 * 64);
    if (!panel) return -2;
    if (nthreads > tiles) nthreads = tiles;
#pragma omp parallel num_threads(nthreads)
    {
        iflb_pack(x, M, K2, blocks, panel); /* ends in the omp for's barrier */
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int t0 = (int)((long)tiles * t / nt), t1 = (int)((long)tiles * (t + 1) / nt);
        iflb_rows(w, N, K2, panel, M, blocks, t0, t1, y, bias);
    }
    free(panel);
    return 0;
}
