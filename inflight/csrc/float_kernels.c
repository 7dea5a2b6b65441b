/* inflight narrow-float weight kernels: y (M, N) = x (M, K) . (s[n] * w)^T (+ bias), float32 in and out,
 * for weights kept in a 16- or 8-bit float format (inflight/quant/weight.py's f16, bf16 and f8c):
 *   HT_F16   IEEE half                         widened by F16C (vcvtph2ps)
 *   HT_BF16  bfloat16 (the top half of a float) widened by a 16-bit shift
 *   HT_F8    FP8 e4m3fn with a float scale per output row (or one for the tensor): its bits moved
 *            into a half ((b & 0x80) << 8 | (b & 0x7f) << 7, exponent bias 7 instead of 15, which
 *            holds e4m3's subnormals too) and the 2^8 bias difference folded into the row scale.
 *            e4m3fn's NaN (0x7f / 0xff) reads as 480: checkpoints hold none.
 * Weights are widened in registers, never into a float copy; activations stay float32, so y equals
 * dequantize(w) @ x up to float32 summation order (no activation rounding, unlike quant_kernels.c).
 * Up to 7 activation rows (batch-1 decode: bandwidth-bound), a dot-product loop: 2 weight rows x up
 * to 4 activation rows (8 accumulators: each widened weight vector feeds 4 FMAs, each activation
 * load 2), the output rows split statically over the threads. From 8 rows (batched decode), a
 * panel GEMM (below), FMA-bound: measured on the Zen 4 with the AVX2 flavour at 32 rows, 20 ms for
 * Qwen2.5-0.5B's [gate; up] against 30 ms for the dot loop and 21 ms for oneDNN's float32 GEMM
 * limited to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) on a prepacked float32 copy; at 512 rows (prefill)
 * 266 vs 243 ms ([gate; up]) and 128 vs 146 ms (down), where dequantized tiles + F.linear took 404 / 188.
 * Built per instruction-set flavour like quant_kernels.c (platform.QUANT_FLAVOURS' flags).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define IFLF_AVX2 1
#endif
#if defined(IFLF_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__)
#define IFLF_AVX512 1
#endif

enum { HT_F16, HT_BF16, HT_F8, HT_N }; /* the order of inflight/quant/float_kernels.py WTYPES */
#define IFLF_MC 64                     /* activation rows per chunk (64 x K=4096 floats: 1 MiB) */

int ifl_float_abi_version(void) { return 1; }

/* 0 portable C, 1 AVX2 + FMA + F16C (8 lanes), 2 AVX-512 (16 lanes) */
int ifl_float_path(void) {
#if defined(IFLF_AVX512)
    return 2;
#elif defined(IFLF_AVX2)
    return 1;
#else
    return 0;
#endif
}

static inline float iflf_h2f(uint16_t h) { /* IEEE half -> float, subnormals included */
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; --exp; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* element k of a weight row, widened (f8: without its 2^8 factor, see the top) */
static inline float iflf_elem(int wt, const uint8_t *row, int k) {
    if (wt == HT_F8) {
        uint8_t b = row[k];
        return iflf_h2f((uint16_t)(((b & 0x80) << 8) | ((b & 0x7f) << 7)));
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)k, 2);
    if (wt == HT_F16) return iflf_h2f(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(IFLF_AVX2)
/* 8 elements widened into a ymm (both SIMD flavours: the panel packing works in 8 x 8 tiles) */
static inline __attribute__((always_inline)) __m256 iflf_widen8(int wt, const uint8_t *row, int k) {
    if (wt == HT_F8) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
        return _mm256_cvtph_ps(h);
    }
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (wt == HT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) void iflf_transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
#endif

#if defined(IFLF_AVX512)
#define VL 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VBCAST(p) _mm512_set1_ps(*(p))
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
static inline __attribute__((always_inline)) vf iflf_widen(int wt, const uint8_t *row, int k) {
    if (wt == HT_F8) {
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + k)));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7));
        return _mm512_cvtph_ps(h);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)k));
    if (wt == HT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#elif defined(IFLF_AVX2)
#define VL 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VBCAST(p) _mm256_broadcast_ss(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
static inline float VSUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline __attribute__((always_inline)) vf iflf_widen(int wt, const uint8_t *row, int k) {
    if (wt == HT_F8) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
        return _mm256_cvtph_ps(h);
    }
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (wt == HT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#else
/* portable: 8 float lanes in an array; the compiler vectorises what the target has */
#define VL 8
typedef struct { float v[8]; } vf;
static inline vf VZERO(void) { vf r; memset(&r, 0, sizeof r); return r; }
static inline vf VLOAD(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
static inline vf VFMA(vf a, vf b, vf c) { for (int l = 0; l < 8; ++l) c.v[l] += a.v[l] * b.v[l]; return c; }
static inline float VSUM(vf a) { float s = 0.f; for (int l = 0; l < 8; ++l) s += a.v[l]; return s; }
static inline vf VBCAST(const float *p) { vf r; for (int l = 0; l < 8; ++l) r.v[l] = *p; return r; }
static inline void VSTORE(float *p, vf a) { memcpy(p, a.v, sizeof a.v); }
static inline vf iflf_widen(int wt, const uint8_t *row, int k) {
    vf r;
    for (int l = 0; l < 8; ++l) r.v[l] = iflf_elem(wt, row, k + l);
    return r;
}
#endif

/* out[r][m] = w_r . x_m for R (1-2) weight rows and MR (1-4) activation rows of stride K */
static inline __attribute__((always_inline)) void iflf_block(int wt, const uint8_t *const *rows, const int R,
                                                             const float *x, int K, const int MR, float out[2][4]) {
    vf acc[2][4];
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < MR; ++m) acc[r][m] = VZERO();
    int k = 0;
    for (; k + VL <= K; k += VL) {
        vf w[2];
        for (int r = 0; r < R; ++r) w[r] = iflf_widen(wt, rows[r], k);
        for (int m = 0; m < MR; ++m) {
            vf xv = VLOAD(x + (size_t)m * K + k);
            for (int r = 0; r < R; ++r) acc[r][m] = VFMA(w[r], xv, acc[r][m]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < MR; ++m) {
            float s = VSUM(acc[r][m]);
            for (int kk = k; kk < K; ++kk) s += iflf_elem(wt, rows[r], kk) * x[(size_t)m * K + kk];
            out[r][m] = s;
        }
}

/* a constant (R, MR) per call keeps the accumulators in registers */
static inline __attribute__((always_inline)) void iflf_dispatch(int wt, const uint8_t *const *rows, int R,
                                                                const float *x, int K, int MR, float out[2][4]) {
#define IFLF_CASE(r, mr) \
    if (R == r && MR == mr) { iflf_block(wt, rows, r, x, K, mr, out); return; }
    IFLF_CASE(2, 4) IFLF_CASE(2, 3) IFLF_CASE(2, 2) IFLF_CASE(2, 1)
    IFLF_CASE(1, 4) IFLF_CASE(1, 3) IFLF_CASE(1, 2) IFLF_CASE(1, 1)
#undef IFLF_CASE
}

/* output rows [n0, n1) for activation rows [m0, m1) */
static inline __attribute__((always_inline)) void iflf_rows(int wt, const uint8_t *data, size_t row_bytes,
                                                            const float *scales, int scales_per_row, float fold,
                                                            int n0, int n1, const float *x, int K, int m0, int m1,
                                                            float *y, int N, const float *bias) {
    for (int n = n0; n < n1; n += 2) {
        const int R = n1 - n < 2 ? n1 - n : 2;
        const uint8_t *rows[2] = {data + (size_t)n * row_bytes, data + (size_t)(n + R - 1) * row_bytes};
        for (int m = m0; m < m1; m += 4) {
            const int MR = m1 - m < 4 ? m1 - m : 4;
            float out[2][4];
            iflf_dispatch(wt, rows, R, x + (size_t)m * K, K, MR, out);
            for (int r = 0; r < R; ++r) {
                float s = fold * (scales ? scales[scales_per_row ? n + r : 0] : 1.f), b = bias ? bias[n + r] : 0.f;
                for (int mm = 0; mm < MR; ++mm) y[(size_t)(m + mm) * N + n + r] = s * out[r][mm] + b;
            }
        }
    }
}

/* ------------------------------------------------------------------ multi-row GEMM (M >= IFLF_PANEL_MIN)
 * The dot-product loop above loads 6 vectors per 8 FMAs; a batch of rows is FMA-bound instead with
 * the classic GEMM shape: NR = 2 vectors of weight rows are widened once per KC columns into a
 * k-major float panel (8 x 8 transposes; 16 KB, L1), and each of MR = 6 activation rows broadcasts
 * one x per k against the panel: 12 FMAs per 2 panel loads + 6 broadcasts, 12 accumulators. */
#define IFLF_NR (2 * VL)
#define IFLF_MR 6
#define IFLF_KC 256
#define IFLF_PANEL_MC 96 /* activation rows per pass over the weights (prefill): 96 x 256 floats stay in L2 */
#ifndef IFLF_PANEL_MIN
#define IFLF_PANEL_MIN 8
#endif

/* rows [n0, n0 + NR) (zeros past N), columns [k0, k0 + kc) -> panel[k * NR + j] */
static inline __attribute__((always_inline)) void iflf_pack(int wt, const uint8_t *data, size_t row_bytes, int N,
                                                            int n0, int k0, int kc, float *panel) {
    int k = 0;
#if defined(IFLF_AVX2)
    for (; k + 8 <= kc; k += 8)
        for (int j0 = 0; j0 < IFLF_NR; j0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j)
                r[j] = n0 + j0 + j < N ? iflf_widen8(wt, data + (size_t)(n0 + j0 + j) * row_bytes, k0 + k)
                                       : _mm256_setzero_ps();
            iflf_transpose8(r);
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (size_t)(k + i) * IFLF_NR + j0, r[i]);
        }
#endif
    for (; k < kc; ++k)
        for (int j = 0; j < IFLF_NR; ++j)
            panel[(size_t)k * IFLF_NR + j] =
                n0 + j < N ? iflf_elem(wt, data + (size_t)(n0 + j) * row_bytes, k0 + k) : 0.f;
}

/* y rows [m, m + MR), columns [n0, n0 + NR) (+)= s * (x . panel) (+ b); ncols < NR at the last panel */
static inline __attribute__((always_inline)) void iflf_micro(const float *panel, int kc, const float *x, int K,
                                                             const int MR, float *y, int N, int n0, int ncols,
                                                             const float *s, const float *b, int first) {
    /* named accumulators: an array of them is kept on the stack by gcc (a store per FMA) */
    vf c00 = VZERO(), c01 = VZERO(), c10 = VZERO(), c11 = VZERO(), c20 = VZERO(), c21 = VZERO();
    vf c30 = VZERO(), c31 = VZERO(), c40 = VZERO(), c41 = VZERO(), c50 = VZERO(), c51 = VZERO();
    for (int k = 0; k < kc; ++k) {
        const vf w0 = VLOAD(panel + (size_t)k * IFLF_NR), w1 = VLOAD(panel + (size_t)k * IFLF_NR + VL);
        const float *xk = x + k;
#define IFLF_ROW(m, a0, a1) \
    if (MR > m) { vf xb = VBCAST(xk + (size_t)m * K); a0 = VFMA(w0, xb, a0); a1 = VFMA(w1, xb, a1); }
        IFLF_ROW(0, c00, c01) IFLF_ROW(1, c10, c11) IFLF_ROW(2, c20, c21)
        IFLF_ROW(3, c30, c31) IFLF_ROW(4, c40, c41) IFLF_ROW(5, c50, c51)
#undef IFLF_ROW
    }
    vf acc[IFLF_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int m = 0; m < MR; ++m) {
        float out[IFLF_NR];
        VSTORE(out, acc[m][0]);
        VSTORE(out + VL, acc[m][1]);
        float *row = y + (size_t)m * N + n0;
        for (int j = 0; j < ncols; ++j) row[j] = s[j] * out[j] + (first ? b[j] : row[j]);
    }
}

static inline __attribute__((always_inline)) void iflf_panels(int wt, const uint8_t *data, size_t row_bytes,
                                                              const float *scales, int scales_per_row, float fold,
                                                              int p0, int p1, const float *x, int K, int M,
                                                              float *y, int N, const float *bias, float *panel) {
    for (int mc = 0; mc < M; mc += IFLF_PANEL_MC)
    for (int p = p0; p < p1; ++p) {
        const int n0 = p * IFLF_NR, ncols = N - n0 < IFLF_NR ? N - n0 : IFLF_NR;
        const int m1 = M - mc < IFLF_PANEL_MC ? M : mc + IFLF_PANEL_MC;
        float s[IFLF_NR], b[IFLF_NR];
        for (int j = 0; j < ncols; ++j) {
            s[j] = fold * (scales ? scales[scales_per_row ? n0 + j : 0] : 1.f);
            b[j] = bias ? bias[n0 + j] : 0.f;
        }
        for (int k0 = 0; k0 < K; k0 += IFLF_KC) {
            const int kc = K - k0 < IFLF_KC ? K - k0 : IFLF_KC;
            iflf_pack(wt, data, row_bytes, N, n0, k0, kc, panel);
            for (int m = mc; m < m1; m += IFLF_MR) {
                const int mr = m1 - m < IFLF_MR ? m1 - m : IFLF_MR;
                const float *xm = x + (size_t)m * K + k0;
                float *ym = y + (size_t)m * N;
                switch (mr) { /* a constant MR keeps the accumulators in registers */
                case 6: iflf_micro(panel, kc, xm, K, 6, ym, N, n0, ncols, s, b, k0 == 0); break;
                case 5: iflf_micro(panel, kc, xm, K, 5, ym, N, n0, ncols, s, b, k0 == 0); break;
                case 4: iflf_micro(panel, kc, xm, K, 4, ym, N, n0, ncols, s, b, k0 == 0); break;
                case 3: iflf_micro(panel, kc, xm, K, 3, ym, N, n0, ncols, s, b, k0 == 0); break;
                case 2: iflf_micro(panel, kc, xm, K, 2, ym, N, n0, ncols, s, b, k0 == 0); break;
                default: iflf_micro(panel, kc, xm, K, 1, ym, N, n0, ncols, s, b, k0 == 0); break;
                }
            }
        }
    }
}

static int iflf_gemm(int wtype, int N, int K, const uint8_t *data, size_t row_bytes, const float *scales,
                     int scales_per_row, float fold, const float *x, int M, float *y, const float *bias,
                     int nthreads) {
    const int panels = (N + IFLF_NR - 1) / IFLF_NR;
    if (nthreads > panels) nthreads = panels;
    float *bufs = malloc(sizeof(float) * (size_t)IFLF_KC * IFLF_NR * (size_t)nthreads);
    if (!bufs) return -2;
#pragma omp parallel num_threads(nthreads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int p0 = (int)((long)panels * t / nt), p1 = (int)((long)panels * (t + 1) / nt);
        float *panel = bufs + (size_t)IFLF_KC * IFLF_NR * (size_t)t;
        switch (wtype) {
        case HT_F16:
            iflf_panels(HT_F16, data, row_bytes, scales, scales_per_row, fold, p0, p1, x, K, M, y, N, bias, panel);
            break;
        case HT_BF16:
            iflf_panels(HT_BF16, data, row_bytes, scales, scales_per_row, fold, p0, p1, x, K, M, y, N, bias, panel);
            break;
        default:
            iflf_panels(HT_F8, data, row_bytes, scales, scales_per_row, fold, p0, p1, x, K, M, y, N, bias, panel);
            break;
        }
    }
    free(bufs);
    return 0;
}

/* y = x . (scales * w)^T + bias. data: (N, K) elements of wtype (row stride K elements);
 * scales: float (N,) (scales_per_row) or (1,), or NULL. Returns 0, -1 on a bad argument, -2 out of memory. */
int ifl_float_matmul(int wtype, int N, int K, const void *data, const float *scales, int scales_per_row,
                     const float *x, int M, float *y, const float *bias, int nthreads) {
    if (wtype < 0 || wtype >= HT_N || N <= 0 || K <= 0 || M <= 0 || nthreads <= 0 || !data) return -1;
    const size_t row_bytes = (size_t)K * (wtype == HT_F8 ? 1 : 2);
    const float fold = wtype == HT_F8 ? 256.f : 1.f;
    if (M >= IFLF_PANEL_MIN)
        return iflf_gemm(wtype, N, K, data, row_bytes, scales, scales_per_row, fold, x, M, y, bias, nthreads);
    const int pairs = (N + 1) / 2;
    if (nthreads > pairs) nthreads = pairs;
#pragma omp parallel num_threads(nthreads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int n0 = 2 * (int)((long)pairs * t / nt), n1e = 2 * (int)((long)pairs * (t + 1) / nt);
        const int n1 = n1e < N ? n1e : N;
        for (int m0 = 0; m0 < M; m0 += IFLF_MC) {
            const int m1 = M - m0 < IFLF_MC ? M : m0 + IFLF_MC;
            switch (wtype) { /* a constant type per instantiation: the widening inlines */
            case HT_F16:
                iflf_rows(HT_F16, data, row_bytes, scales, scales_per_row, fold, n0, n1, x, K, m0, m1, y, N, bias);
                break;
            case HT_BF16:
                iflf_rows(HT_BF16, data, row_bytes, scales, scales_per_row, fold, n0, n1, x, K, m0, m1, y, N, bias);
                break;
            default:
                iflf_rows(HT_F8, data, row_bytes, scales, scales_per_row, fold, n0, n1, x, K, m0, m1, y, N, bias);
                break;
            }
        }
    }
    return 0;
}
