/* decode_kernel.c's GEMV over plain weights (w_t: float32, bf16 or f16): gemv() in its AVX512-BF16,
 * AVX2 + FMA and portable flavours, its per-thread scratch and how it stores (store_out). Included
 * once, in place, by decode_kernel.c, after its types and phases. */
#ifndef IFL_DECODE_GEMV_H
#define IFL_DECODE_GEMV_H

/* Per-thread scratch for the GEMV input (the AVX2 path's widened, reordered copy of x). */
typedef struct {
    float *buf;
    size_t stride; /* floats per thread */
    uint64_t *tq;  /* the GEMV's tile queues (tile_queue.h) */
} Scratch;

#define GEMV_TILE 8 /* weight rows a tile of the float GEMVs' run-time balanced split */

enum { OUT_ST, OUT_F32 };

/* OUT_ST: y is st_t; OUT_F32: y is float, rounded as the model dtype would (the lm_head). */
static inline void store_out(void *y, size_t at, float v, int mode) {
    if (mode == OUT_ST)
        ((st_t *)y)[at] = ST(v);
    else
        ((float *)y)[at] = R(v);
}

/* ------------------------------------------------------------------ GEMV: AVX512-BF16
 * One weight row at a time against up to ROWS_PER_PASS rows of x: each 32 weights are loaded
 * once and multiplied into every x row (a K + 1-row verification step reads each weight once),
 * and a thread's static share of rows is one forward stream, which the prefetcher follows best.
 * Measured on a Zen 4 VM (123M-parameter model, 1 thread, CPU time): 1 row 10-12 ms where
 * 4 interleaved rows took 18 ms; 5 x rows 22 ms, 8 x rows 30 ms (vdpbf16ps at ~2 cycles per
 * zmm makes 8 rows compute-bound). Each (x row, weight row) product is one accumulator over k,
 * then one reduction, whatever M is: a row's result does not depend on the rows beside it, so a
 * verification step's logits equal the one-row steps' bit for bit. */
#ifdef IFL_AVX512BF16
#define ROWS_PER_PASS 8 /* x rows per pass over a weight row: 8 accumulators + w + x of 32 zmm */
#define PREFETCH_AHEAD 2048 /* bf16 elements (4 KB): with M > 2 rows of compute per load the */
                            /* hardware prefetcher alone left the loads waiting (perf)        */

static inline __attribute__((always_inline)) void dot_full(const bf16 *w, const bf16 *x, const int M, int K,
                                                           float *out) {
    __m512 acc[ROWS_PER_PASS];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        if (M > 2) _mm_prefetch((const char *)(w + k + PREFETCH_AHEAD), _MM_HINT_T0);
        __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
        for (int m = 0; m < M; ++m)
            acc[m] = _mm512_dpbf16_ps(acc[m], wv, (__m512bh)_mm512_loadu_si512(x + (size_t)m * K + k));
    }
    for (int m = 0; m < M; ++m) out[m] = _mm512_reduce_add_ps(acc[m]);
}

static void dot_masked(const bf16 *w, const bf16 *x, int M, int K, float *out) {
    for (int m = 0; m < M; ++m) {
        __m512 acc = _mm512_setzero_ps();
        for (int k = 0; k < K; k += 32) {
            int n = K - k < 32 ? K - k : 32;
            __mmask32 mk = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
            __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + k);
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x + (size_t)m * K + k);
            acc = _mm512_dpbf16_ps(acc, wv, xv);
        }
        out[m] = _mm512_reduce_add_ps(acc);
    }
}

/* out[m] = w . x[m], M <= ROWS_PER_PASS: M a constant in each case, so the accumulators stay in registers */
static void dot_row_m(const bf16 *w, const bf16 *x, int M, int K, float *out) {
    if (K % 32 != 0) {
        dot_masked(w, x, M, K, out);
        return;
    }
    switch (M) {
    case 1: dot_full(w, x, 1, K, out); break;
    case 2: dot_full(w, x, 2, K, out); break;
    case 3: dot_full(w, x, 3, K, out); break;
    case 4: dot_full(w, x, 4, K, out); break;
    case 5: dot_full(w, x, 5, K, out); break;
    case 6: dot_full(w, x, 6, K, out); break;
    case 7: dot_full(w, x, 7, K, out); break;
    default: dot_full(w, x, 8, K, out); break;
    }
}

/* y[m * ldy + n] = round(x[m] . W[n] + bias[n]) for n < N. Called inside a parallel region:
 * an orphaned `omp for` over weight rows, with its barrier at the end. M is any size. */
static void gemv(const w_t *W, const st_t *bias, const st_t *x, int M, int N, int K, void *y, int ldy, int mode,
                 Scratch sc) {
    TQ_FOR(sc.tq, (N + GEMV_TILE - 1) / GEMV_TILE, t)
    for (int n = t * GEMV_TILE; n < N && n < (t + 1) * GEMV_TILE; ++n) {
        float bv = bias ? bf2f(bias[n]) : 0.f;
        for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
            int mm = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
            float out[ROWS_PER_PASS];
            dot_row_m(W + (size_t)n * K, x + (size_t)m0 * K, mm, K, out);
            for (int m = 0; m < mm; ++m) store_out(y, (size_t)(m0 + m) * ldy + n, out[m] + bv, mode);
        }
    }
#pragma omp barrier
}

/* ------------------------------------------------------------------ GEMV: AVX2 + FMA */
#elif defined(IFL_AVX2)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 float32 weights, or 8 halves widened (F16C): the fp32 / f16 loops are one */
#if IFL_WEIGHTS_F16
#define WVEC8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#else
#define WVEC8(p) _mm256_loadu_ps((const float *)(p))
#endif

#if IFL_WEIGHTS_BF16
/* A 256-bit load of 16 bf16 weights holds pairs (w[2i] low, w[2i+1] high) in its 32-bit lanes:
 * a left shift makes w[2i] a float, masking the low half makes w[2i+1] one. x is reordered to
 * match once per GEMV (split_x), so no shuffle is needed per weight. */
static inline __m256 even_bf16(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
static inline __m256 odd_bf16(__m256i v) {
    return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* x (M, K) -> float, each 16-block as x[0], x[2], .., x[14], x[1], x[3], .., x[15]; the tail in order. */
static void split_x(const st_t *x, int M, int K, float *xs) {
    for (int m = 0; m < M; ++m) {
        const st_t *src = x + (size_t)m * K;
        float *dst = xs + (size_t)m * K;
        int k = 0;
        for (; k + 16 <= K; k += 16)
            for (int i = 0; i < 8; ++i) {
                dst[k + i] = LD(src[k + 2 * i]);
                dst[k + 8 + i] = LD(src[k + 2 * i + 1]);
            }
        for (; k < K; ++k) dst[k] = LD(src[k]);
    }
}
#endif

/* W[0] . x over K, one row at a time with 4 accumulators. The rows are contiguous, so a thread's
 * static share of rows is one forward stream, which the hardware prefetcher follows best: rows of
 * 896 bf16 read 4 at a time (4 interleaved 1.8 KB streams, as the AVX512-BF16 path does) reached
 * 6-8 GB/s on one Zen 3 core, one row at a time 11-13 GB/s (measured, gate_up / qkv / lm_head). */
static inline float dot_row(const w_t *w, const float *xs, int K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
#if IFL_WEIGHTS_BF16
    for (; k + 32 <= K; k += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + k));
        __m256i u = _mm256_loadu_si256((const __m256i *)(w + k + 16));
        a0 = _mm256_fmadd_ps(even_bf16(v), _mm256_loadu_ps(xs + k), a0);
        a1 = _mm256_fmadd_ps(odd_bf16(v), _mm256_loadu_ps(xs + k + 8), a1);
        a2 = _mm256_fmadd_ps(even_bf16(u), _mm256_loadu_ps(xs + k + 16), a2);
        a3 = _mm256_fmadd_ps(odd_bf16(u), _mm256_loadu_ps(xs + k + 24), a3);
    }
    for (; k + 16 <= K; k += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + k));
        a0 = _mm256_fmadd_ps(even_bf16(v), _mm256_loadu_ps(xs + k), a0);
        a1 = _mm256_fmadd_ps(odd_bf16(v), _mm256_loadu_ps(xs + k + 8), a1);
    }
#else
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(WVEC8(w + k), _mm256_loadu_ps(xs + k), a0);
        a1 = _mm256_fmadd_ps(WVEC8(w + k + 8), _mm256_loadu_ps(xs + k + 8), a1);
        a2 = _mm256_fmadd_ps(WVEC8(w + k + 16), _mm256_loadu_ps(xs + k + 16), a2);
        a3 = _mm256_fmadd_ps(WVEC8(w + k + 24), _mm256_loadu_ps(xs + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(WVEC8(w + k), _mm256_loadu_ps(xs + k), a0);
#endif
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; ++k) s += WLD(w[k]) * xs[k];
    return s;
}

/* dot_row for two x rows at once: each weight vector is loaded (and widened) once for both.
 * Every row keeps dot_row's four accumulators and order, so its result is dot_row's bit for bit. */
static inline void dot_row2(const w_t *w, const float *x0, const float *x1, int K, float out[2]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int k = 0;
#if IFL_WEIGHTS_BF16
    for (; k + 32 <= K; k += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + k));
        __m256i u = _mm256_loadu_si256((const __m256i *)(w + k + 16));
        __m256 e0 = even_bf16(v), o0 = odd_bf16(v), e1 = even_bf16(u), o1 = odd_bf16(u);
        a0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x0 + k + 8), a1);
        a2 = _mm256_fmadd_ps(e1, _mm256_loadu_ps(x0 + k + 16), a2);
        a3 = _mm256_fmadd_ps(o1, _mm256_loadu_ps(x0 + k + 24), a3);
        b0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x1 + k), b0);
        b1 = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x1 + k + 8), b1);
        b2 = _mm256_fmadd_ps(e1, _mm256_loadu_ps(x1 + k + 16), b2);
        b3 = _mm256_fmadd_ps(o1, _mm256_loadu_ps(x1 + k + 24), b3);
    }
    for (; k + 16 <= K; k += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + k));
        __m256 e0 = even_bf16(v), o0 = odd_bf16(v);
        a0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x0 + k + 8), a1);
        b0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(x1 + k), b0);
        b1 = _mm256_fmadd_ps(o0, _mm256_loadu_ps(x1 + k + 8), b1);
    }
#else
    for (; k + 32 <= K; k += 32) {
        __m256 w0 = WVEC8(w + k), w1 = WVEC8(w + k + 8);
        __m256 w2 = WVEC8(w + k + 16), w3 = WVEC8(w + k + 24);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), a1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + k + 16), a2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + k + 24), a3);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), b1);
        b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + k + 16), b2);
        b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + k + 24), b3);
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = WVEC8(w + k);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), b0);
    }
#endif
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float t = hsum256(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    for (; k < K; ++k) {
        s += WLD(w[k]) * x0[k];
        t += WLD(w[k]) * x1[k];
    }
    out[0] = s;
    out[1] = t;
}

static void gemv(const w_t *W, const st_t *bias, const st_t *x, int M, int N, int K, void *y, int ldy, int mode,
                 Scratch sc) {
#if IFL_WEIGHTS_BF16
    float *xs = sc.buf + (size_t)omp_get_thread_num() * sc.stride; /* each thread its own copy: no barrier */
    split_x(x, M, K, xs);
#else
    const float *xs = x; /* float32 model, float32 or f16 weights: x as it is */
    (void)sc;
#endif
    TQ_FOR(sc.tq, (N + GEMV_TILE - 1) / GEMV_TILE, t)
    for (int n = t * GEMV_TILE; n < N && n < (t + 1) * GEMV_TILE; ++n) {
        const w_t *w = W + (size_t)n * K;
        float bv = bias ? LD(bias[n]) : 0.f;
        int m = 0;
        for (; m + 2 <= M; m += 2) { /* pairs of x rows share each weight load (16 registers: two rows is the most) */
            float v[2];
            dot_row2(w, xs + (size_t)m * K, xs + (size_t)(m + 1) * K, K, v);
            store_out(y, (size_t)m * ldy + n, v[0] + bv, mode);
            store_out(y, (size_t)(m + 1) * ldy + n, v[1] + bv, mode);
        }
        if (m < M) store_out(y, (size_t)m * ldy + n, dot_row(w, xs + (size_t)m * K, K) + bv, mode);
    }
#pragma omp barrier
}

/* ------------------------------------------------------------------ GEMV: portable C */
#else
static void dot_rows(const w_t *W, int nr, const st_t *x, int M, int K, float out[4][4]) {
    for (int r = 0; r < nr; ++r) {
        const w_t *w = W + (size_t)r * K;
        for (int m = 0; m < M; ++m) {
            const st_t *xm = x + (size_t)m * K;
            float lane[16] = {0};
            int k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; ++l) lane[l] += WLD(w[k + l]) * LD(xm[k + l]);
            float s = 0.f;
            for (; k < K; ++k) s += WLD(w[k]) * LD(xm[k]);
            for (int l = 0; l < 16; ++l) s += lane[l];
            out[m][r] = s;
        }
    }
}

static void gemv(const w_t *W, const st_t *bias, const st_t *x, int M, int N, int K, void *y, int ldy, int mode,
                 Scratch sc) {
    TQ_FOR(sc.tq, (N + 3) / 4, b) {
        int r0 = 4 * b, nr = N - r0 < 4 ? N - r0 : 4;
        for (int m0 = 0; m0 < M; m0 += 4) {
            int mm = M - m0 < 4 ? M - m0 : 4;
            float out[4][4];
            dot_rows(W + (size_t)r0 * K, nr, x + (size_t)m0 * K, mm, K, out);
            for (int m = 0; m < mm; ++m)
                for (int r = 0; r < nr; ++r)
                    store_out(y, (size_t)(m0 + m) * ldy + r0 + r, out[m][r] + (bias ? LD(bias[r0 + r]) : 0.f), mode);
        }
    }
#pragma omp barrier
}
#endif

#endif
