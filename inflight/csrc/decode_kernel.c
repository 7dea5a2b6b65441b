/* inflight CPU decode kernel: one whole small-batch decode step of a Llama-family model.
 *
 * Why: at batch 1 a decode step is a chain of GEMVs (memory-bound) and ~20 small ops per
 * layer. Through PyTorch the small ops cost ~230 us per layer (dispatch, allocation, Python)
 * and each oneDNN GEMV call has a fixed cost; here the whole step is one C call and one OpenMP
 * parallel region, with barriers between phases.
 *
 * One source, built per variant by inflight/models/cpu_kernel.py with flags from
 * inflight/platform.py (never -march=native: the platform module picks the instruction set):
 *   IFL_STORAGE_BF16  1: a bfloat16 model (activations, norms, embeddings, KV cache in bf16);
 *                     0: a float32 model.
 *   IFL_WEIGHTS_BF16  1: the GEMV weights are bf16 (a bf16 model's, or a float32 model's whose
 *                     values are all exact in bf16, e.g. a bf16 checkpoint served in float32:
 *                     half the bytes per token, the same products); 0: float32 weights.
 *   IFL_WEIGHTS_F16   1: the GEMV weights of a float32 model are IEEE halves (an f16 checkpoint or
 *                     a GGUF F16 file served in float32 on AVX2), widened by F16C.
 * GEMV flavours, by the instruction set the compiler targets:
 *   AVX512-BF16  bf16 model: dot products of bf16 pairs (vdpbf16ps), float32 accumulation.
 *   AVX2 + FMA   float32 activations; bf16 weights widened on the fly (a shift or a mask of each
 *                32-bit lane gives its even or odd bf16 as a float), float32 weights as they are.
 *   portable C   everything else (ARM included), auto-vectorized by the compiler.
 *
 * Numerics follow the PyTorch path of inflight/models (which follows Hugging Face): in a bf16
 * model every intermediate that the eager model holds in bfloat16 is rounded to bfloat16 here
 * at the same point (RMSNorm, rotary products and sum, activations, residual adds); attention
 * follows PyTorch's CPU flash attention (see attend()); products are accumulated in float32
 * (summation order may differ). A float32 model rounds nowhere.
 *
 * Quantized models (cfg[C_QUANT] = 1): each GEMV weight pointer is a descriptor of its QuantWeights
 * (see qgemv), multiplied by the kernels
 * of quant_kernels.h (int8 activations per 32, integer dots, dequantized in registers): the
 * batch-1 step reads the quantized bytes and nothing else per weight.
 *
 * Linked to the libgomp that torch already loaded, so it shares torch's thread team.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_kernels.h"
#include "tile_queue.h"

/* Where a step's time goes (benchmarks/decode_breakdown.py builds with -DIFL_PROFILE; the
 * production build compiles every PROF_* to nothing). Each thread adds the wall time since its
 * previous mark to the phase it just finished; the barriers of the step are explicit (`nowait`
 * loops, then SYNC), so that a thread's wait at each one counts as PH_BARRIER, not as the work
 * before it. ifl_profile() hands the sums out and clears them. */
/* PH_STEP: ifl_decode_step's whole call (thread 0's row only: allocation, embedding, the region) */
enum { PH_NORM, PH_QUANT, PH_QKV, PH_ROPE, PH_ATTN, PH_O, PH_GU, PH_SILU, PH_DOWN, PH_BARRIER, PH_HEAD, PH_STEP, PH_N };
#define PROF_THREADS 64
#ifdef IFL_PROFILE
#include <time.h>
/* [0]: wall seconds; [1]: the thread's CPU seconds (what a loaded machine's descheduling leaves
 * out; a mark costs a clock_gettime system call, ~0.5 us, ~0.2 ms a 24-layer step) */
static double prof_sum[2][PROF_THREADS][PH_N];
static double prof_last[2][PROF_THREADS];
static inline void prof_mark(int ph) {
    const int t = omp_get_thread_num() % PROF_THREADS;
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    const double now[2] = {omp_get_wtime(), (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec};
    for (int k = 0; k < 2; ++k) {
        if (ph >= 0) prof_sum[k][t][ph] += now[k] - prof_last[k][t];
        prof_last[k][t] = now[k];
    }
}
#else
static inline void prof_mark(int ph) { (void)ph; }
#endif
/* the end of a parallel loop or single (`nowait`) whose results the next phase reads */
/* (PF_BARRIER: OpenMP's barrier, or prefetch_ahead.h's own under IFL_SPIN_BARRIER) */
#define SYNC(ph) do { prof_mark(ph); PF_BARRIER(); prof_mark(PH_BARRIER); } while (0)

/* Copies the per-thread phase seconds (2 x nthreads x PH_N, row-major: wall, then CPU) into out
 * and clears them; returns PH_N, or 0 in a build without IFL_PROFILE. */
int ifl_profile(double *out, int nthreads) {
#ifdef IFL_PROFILE
    for (int k = 0; k < 2; ++k)
        for (int t = 0; t < nthreads && t < PROF_THREADS; ++t)
            for (int p = 0; p < PH_N; ++p) {
                out[(k * nthreads + t) * PH_N + p] = prof_sum[k][t][p];
                prof_sum[k][t][p] = 0.0;
            }
    return PH_N;
#else
    (void)out; (void)nthreads;
    return 0;
#endif
}

#ifndef IFL_STORAGE_BF16
#define IFL_STORAGE_BF16 1
#endif
#ifndef IFL_WEIGHTS_BF16
#define IFL_WEIGHTS_BF16 1
#endif
#ifndef IFL_WEIGHTS_F16
#define IFL_WEIGHTS_F16 0
#endif
#if IFL_STORAGE_BF16 && !IFL_WEIGHTS_BF16
#error "a bfloat16 model has bfloat16 weights"
#endif
#if IFL_WEIGHTS_F16 && (IFL_STORAGE_BF16 || IFL_WEIGHTS_BF16)
#error "f16 weights are a float32 model's"
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && IFL_STORAGE_BF16
#include <immintrin.h>
#define IFL_AVX512BF16 1
#define IFL_GEMV_PATH 2
#elif defined(__AVX2__) && defined(__FMA__) && (defined(__F16C__) || !IFL_WEIGHTS_F16)
#include <immintrin.h>
#define IFL_AVX2 1
#define IFL_GEMV_PATH 1
#else
#define IFL_GEMV_PATH 0
#endif

typedef uint16_t bf16;

static inline float bf2f(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline bf16 f2bf(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

static inline float rbf(float f) { return bf2f(f2bf(f)); }

static inline float h2f(uint16_t h) { /* IEEE half -> float, subnormals included */
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

/* st_t: how the model stores activations and its small tensors. LD/ST convert to and from
 * float; R rounds a float where the eager model would hold the value in the model dtype. */
#if IFL_STORAGE_BF16
typedef bf16 st_t;
static inline float LD(st_t v) { return bf2f(v); }
static inline st_t ST(float f) { return f2bf(f); }
static inline float R(float f) { return rbf(f); }
#else
typedef float st_t;
static inline float LD(st_t v) { return v; }
static inline st_t ST(float f) { return f; }
static inline float R(float f) { return f; }
#endif
#if IFL_WEIGHTS_BF16
typedef bf16 w_t;
static inline float WLD(w_t v) { return bf2f(v); }
#elif IFL_WEIGHTS_F16
typedef uint16_t w_t;
static inline float WLD(w_t v) { return h2f(v); }
#else
typedef float w_t;
static inline float WLD(w_t v) { return v; }
#endif

/* ------------------------------------------------------------------ config layout
 * cfg (int64): the indices below. lp (int64): LP_N pointers per layer. gp (int64): G_N pointers. */
enum { C_HIDDEN, C_HEADS, C_KV_HEADS, C_HEAD_DIM, C_ROT_DIM, C_INTER, C_LAYERS, C_QK_NORM,
       C_BLOCK_SIZE, C_SLOTS, C_WINDOW, C_VOCAB, C_QUANT, C_N };
enum { L_IN_NORM, L_QKV_W, L_QKV_B, L_Q_NORM, L_K_NORM, L_O_W, L_O_B, L_POST_NORM, L_GU_W, L_GU_B,
       L_DOWN_W, L_DOWN_B, L_KV, L_N };
enum { G_EMBED, G_FINAL_NORM, G_COS, G_SIN, G_N };

/* SiLU x / (1 + e^-x) of n floats in place, 16 / 8 lanes at a time: the decode step's 24 x 4864
 * (0.5B) a token cost 0.27-0.5 ms a thread as scalar expf (Zen 4). e^y is Cephes' expf (llama.cpp's
 * and Sleef's scheme): y = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, times 2^n; within
 * 2 ulp of e^y (vec_exp.h; tests/model/test_decode_kernel.py checks SiLU against float64 and torch's silu).
 * y is clamped to [-104, 88.8]: below, e^y is 0 in float32; above, it overflows to inf as expf
 * does (SiLU -0 for x < -88.8, as the scalar x / (1 + expf(-x))). The portable build keeps expf. */
#include "vec_exp.h" /* ifl_exp8 / ifl_exp16, shared with the attention and SiLU x up kernels */
static void silu_inplace(float *x, int n) {
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i), one = _mm512_set1_ps(1.f);
        _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(one, ifl_exp16(_mm512_sub_ps(_mm512_setzero_ps(), v)))));
    }
#endif
#if defined(IFLQ_AVX2)
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), one = _mm256_set1_ps(1.f);
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(one, ifl_exp8(_mm256_sub_ps(_mm256_setzero_ps(), v)))));
    }
#endif
    for (; i < n; ++i) x[i] = x[i] / (1.0f + expf(-x[i]));
}

#include "row_stats.h" /* the greedy token beside the logits (ifl_logits, the step's lm_head) */

/* The SiLU above, for the tests: out[i] = silu(x[i]), i < n. */
int ifl_silu(const float *x, int n, float *out) {
    if (n < 0) return -1;
    memcpy(out, x, sizeof(float) * (size_t)n);
    silu_inplace(out, n);
    return 0;
}

int ifl_abi_version(void) { return 8; }

/* What this build is: GEMV path (0 portable, 1 AVX2+FMA, 2 AVX512-BF16) and the element bits of
 * the model's tensors and of the GEMV weights. The loader checks them against what it asked for. */
int ifl_gemv_path(void) { return IFL_GEMV_PATH; }
int ifl_storage_bits(void) { return IFL_STORAGE_BF16 ? 16 : 32; }
int ifl_weight_bits(void) { return IFL_WEIGHTS_BF16 || IFL_WEIGHTS_F16 ? 16 : 32; }
int ifl_weight_f16(void) { return IFL_WEIGHTS_F16; }

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

/* ------------------------------------------------------------------ float-format parts
 * f16, bf16 and f8c QuantWeights (inflight/quant/float_kernels.py's layouts: a GGUF's F16 / BF16
 * layers beside quantized ones, `--quantization fp8`) in a quantized layer: each weight row widened
 * in registers and dotted with the float32 activations, as float_kernels.c does (no activation
 * rounding). f8c: e4m3's bits moved into a half (exponent bias 7 instead of 15), the 2^8 folded
 * into the row scale. */
/* qtype ids (cpu_kernel_quant.FLOAT_QTYPES); FT_F32: a float32 model's float lm_head beside float layers */
enum { FT_BASE = 64, FT_F16 = FT_BASE, FT_BF16, FT_F8, FT_F32 };

static inline float ft_elem(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) {
        float f;
        memcpy(&f, row + 4 * (size_t)k, 4);
        return f;
    }
    if (t == FT_F8) {
        uint8_t b = row[k];
        return h2f((uint16_t)(((b & 0x80) << 8) | ((b & 0x7f) << 7)));
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)k, 2);
    return t == FT_F16 ? h2f(h) : bf2f(h);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define FT_VL 16
typedef __m512 ftv;
static inline __attribute__((always_inline)) ftv ft_widen(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) return _mm512_loadu_ps((const float *)row + k);
    if (t == FT_F8) {
        __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + k)));
        __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7));
        return _mm512_cvtph_ps(h);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * (size_t)k));
    if (t == FT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#define FT_ZERO() _mm512_setzero_ps()
#define FT_FMA(w, p, a) _mm512_fmadd_ps(w, _mm512_loadu_ps(p), a)
#define FT_ADD(a, b) _mm512_add_ps(a, b)
#define FT_SUM(v) _mm512_reduce_add_ps(v)
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FT_VL 8
typedef __m256 ftv;
static inline __attribute__((always_inline)) ftv ft_widen(const int t, const uint8_t *row, int k) {
    if (t == FT_F32) return _mm256_loadu_ps((const float *)row + k);
    if (t == FT_F8) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + k)));
        __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                 _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7));
        return _mm256_cvtph_ps(h);
    }
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (t == FT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#define FT_ZERO() _mm256_setzero_ps()
#define FT_FMA(w, p, a) _mm256_fmadd_ps(w, _mm256_loadu_ps(p), a)
#define FT_ADD(a, b) _mm256_add_ps(a, b)
static inline float FT_SUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* out[m] = row . x[m] (m < M, x rows of stride K); 4 accumulators per x row over the vector lanes */
static inline __attribute__((always_inline)) void ft_dot_t(const int t, const uint8_t *row, const float *x, int M,
                                                           int K, float *out) {
    for (int m = 0; m < M; ++m) {
        const float *xm = x + (size_t)m * K;
        int k = 0;
        float s = 0.f;
#ifdef FT_VL
        ftv a0 = FT_ZERO(), a1 = a0, a2 = a0, a3 = a0;
        for (; k + 4 * FT_VL <= K; k += 4 * FT_VL) {
            a0 = FT_FMA(ft_widen(t, row, k), xm + k, a0);
            a1 = FT_FMA(ft_widen(t, row, k + FT_VL), xm + k + FT_VL, a1);
            a2 = FT_FMA(ft_widen(t, row, k + 2 * FT_VL), xm + k + 2 * FT_VL, a2);
            a3 = FT_FMA(ft_widen(t, row, k + 3 * FT_VL), xm + k + 3 * FT_VL, a3);
        }
        for (; k + FT_VL <= K; k += FT_VL) a0 = FT_FMA(ft_widen(t, row, k), xm + k, a0);
        s = FT_SUM(FT_ADD(FT_ADD(a0, a1), FT_ADD(a2, a3)));
#else
        float lane[16] = {0};
        for (; k + 16 <= K; k += 16)
            for (int l = 0; l < 16; ++l) lane[l] += ft_elem(t, row, k + l) * xm[k + l];
        for (int l = 0; l < 16; ++l) s += lane[l];
#endif
        for (; k < K; ++k) s += ft_elem(t, row, k) * xm[k];
        out[m] = s;
    }
}

/* a constant type per instantiation: the widening inlines */
static void ft_dot(int t, const uint8_t *row, const float *x, int M, int K, float *out) {
    if (t == FT_F16)
        ft_dot_t(FT_F16, row, x, M, K, out);
    else if (t == FT_BF16)
        ft_dot_t(FT_BF16, row, x, M, K, out);
    else if (t == FT_F8)
        ft_dot_t(FT_F8, row, x, M, K, out);
    else
        ft_dot_t(FT_F32, row, x, M, K, out);
}

/* ------------------------------------------------------------------ quantized GEMV */
/* Scratch of the quantized path: the activation rows as int8 blocks and as float32 (the float
 * parts'; both shared), each thread's unpack buffer (IFLQ_RT rows); for iflv_q8_rows (VNNI) the
 * int8 rows + 128 (xu). */
typedef struct {
    int8_t *xq;
    uint8_t *xu;
    float *dx, *xb, *xf;
    uint8_t *ubuf;
    size_t ustride;
    uint64_t *tq;  /* each thread's tile queue (tq_claim), a cache line apart */
} QScratch;

static int qscratch_alloc(QScratch *qs, int nthreads, int M, int K) {
    qs->xf = malloc(sizeof(float) * (size_t)M * K);
    qs->xq = malloc((size_t)M * K);
    qs->xu = malloc((size_t)M * K);
    qs->dx = malloc(sizeof(float) * ((size_t)M * (K / 32) + (size_t)M * (K / 16)));
    qs->ustride = iflq_unpack_bytes(IFLQ_RT, K);
    qs->ubuf = malloc(qs->ustride * (size_t)nthreads);
    qs->xb = qs->dx ? qs->dx + (size_t)M * (K / 32) : NULL;
    qs->tq = tq_alloc(nthreads);
    return qs->xq && qs->dx && qs->ubuf && qs->xf && qs->xu && qs->tq;
}

static void qscratch_free(QScratch *qs) {
    free(qs->xq); free(qs->dx); free(qs->ubuf); free(qs->xf); free(qs->xu); free(qs->tq);
}

static QWeight qweight(const int64_t *desc) {
    QWeight w = {(int)desc[0], (int)desc[1], (int)desc[2], (int)desc[3], (const uint8_t *)desc[4],
                 (const uint16_t *)desc[5], (const uint8_t *)desc[6], (int)desc[7]};
    return w;
}

#if defined(IFLQ_AVX2) && !defined(IFLV_OFF)
/* q8_0 at several activation rows: quant_gemv_q8.h's iflv_q8_rows, whose sums are the one-row
 * step's bit for bit, the weights streamed once per IFLV_Q8_ROWS rows */
#define HAVE_ROWS_Q8 1
#define RQ8_MAX IFLV_Q8_ROWS
#endif

#define IFLQ_MAX_PARTS 4
#ifndef QG_RT
/* Weight rows a tile of qgemv: the 1-row dots set their activation's lanes up once a call (q8_0's
 * offsets, q5_0's pairs, q4_k's factors), and a thief's run starts on tile bounds; 8 -> 32 rows:
 * the 0.5B step's GEMVs, 2 threads, Zen 4, CPU time (stream_ab.py --variants "QG_RT=8" tree) */
#define QG_RT 32
#endif
#ifndef QG_TILE_BYTES
/* A tile's weight bytes at most, down to 8 rows: 32 rows of the 0.5B down projection (K = 4864,
 * 165 KB of q8_0) were ~11 us of one core's stream, which the other waited for at the barrier when
 * that tile came last (0: QG_RT rows whatever their bytes; docs/quant_history.md, "Tiles by bytes") */
#define QG_TILE_BYTES (48 * 1024)
#endif
/* rows a qgemv tile of a descriptor (its parts share K): QG_RT, halved while 8 rows or more of the
 * widest part's rows exceed QG_TILE_BYTES (a multiple of 8 rows: the 1-row dots sum 8 rows at once) */
static inline int qg_rows(const int64_t *desc) {
    const int K = (int)desc[1 + 2];
    size_t rb = 0;
    for (int p = 0; p < (int)desc[0]; ++p) {
        const int qt = (int)desc[1 + 8 * p];
        const size_t b = qt >= FT_BASE ? (size_t)K * (qt == FT_F8 ? 1 : qt == FT_F32 ? 4 : 2) : iflq_row_bytes(qt, K);
        rb = b > rb ? b : rb;
    }
    int rt = QG_RT;
    while (QG_TILE_BYTES && rt > 8 && (size_t)rt * rb > (size_t)QG_TILE_BYTES) rt /= 2;
    return rt;
}
#include "prefetch_ahead.h" /* the next GEMV's first rows while the phases between compute */
/* Block b (32 elements, fewer at a row's end) of activation row m of x (M x K) in every form qgemv
 * reads: float32 (xf, the float parts'), int8 with its scale and per-16 sums (xq, dx, xb), + 128
 * (xu; iflv_q8_rows). The step calls it where the block is produced
 * (the norms, attention, SiLU: `preq`), which saves qgemv its own pass and barrier.
 * quant_x_ints: the int8 forms of a whole block from its float32 one (xf), which the SiLU task's
 * silu_mul_block writes itself. */
static inline void quant_x_ints(const QScratch *qs, int K, int m, int b) {
    const float *xf = qs->xf + (size_t)m * K + 32 * b;
    int8_t *xq = qs->xq + (size_t)m * K + 32 * b;
    iflq_quantize_row(xf, 32, xq, qs->dx + (size_t)m * (K / 32) + b, qs->xb + (size_t)m * (K / 16) + 2 * b);
    for (int i = 0; i < 32; ++i) qs->xu[(size_t)m * K + 32 * b + i] = (uint8_t)(xq[i] ^ 0x80);
}

static inline void quant_x_block(const QScratch *qs, const st_t *x, int K, int m, int b, int ints) {
    const int n = K - 32 * b < 32 ? K - 32 * b : 32;
    float *xf = qs->xf + (size_t)m * K + 32 * b;
    for (int i = 0; i < n; ++i) xf[i] = LD(x[(size_t)m * K + 32 * b + i]);
    if (ints && n == 32) quant_x_ints(qs, K, m, b);
}

/* every block of rows 0..M-1 (from a single: the norms) */
static void quant_x_rows(const QScratch *qs, const st_t *x, int M, int K) {
    for (int m = 0; m < M; ++m)
        for (int b = 0; b < (K + 31) / 32; ++b) {
            quant_x_block(qs, x, K, m, b, 1);
            PF_TICK(IFL_PF_NORM);
        }
}

/* As gemv() for a quantized weight. desc: the number of parts P (a fused layer's runs of one
 * layout: q / k / v of a Q4_K_M file may be q5_0, q5_0, q8_0), then 8 int64 per part (qtype, N, K,
 * group, data, scales, zeros, scales_per_row), stacked along N. The M rows of x are quantized
 * once (the threads share the blocks), then the tiles of qg_rows() output rows of every part are
 * split statically over the threads, each unpacking into its own buffer. */
static void qgemv(const int64_t *desc, const st_t *bias, const st_t *x, int M, void *y, int ldy, int mode,
                  QScratch qs, int ph, int preq) {
    const int P = (int)desc[0], K = (int)desc[1 + 2], nb = K / 32, nbc = (K + 31) / 32, rt = qg_rows(desc);
    int first_tile[IFLQ_MAX_PARTS + 1], first_row[IFLQ_MAX_PARTS], ints = 0;
    first_tile[0] = 0;
    for (int p = 0, row = 0; p < P; ++p) {
        int n = (int)desc[1 + 8 * p + 1];
        first_row[p] = row;
        row += n;
        first_tile[p + 1] = first_tile[p] + (n + rt - 1) / rt;
        ints |= desc[1 + 8 * p] < FT_BASE;
    }
    if (!preq) { /* x as float32 (float parts), and int8 per 32 (integer parts) */
#pragma omp for schedule(static) nowait
        for (int t = 0; t < M * nbc; ++t) quant_x_block(&qs, x, K, t / nbc, t % nbc, ints);
        SYNC(PH_QUANT);
    }
    uint8_t *q = qs.ubuf + qs.ustride * (size_t)omp_get_thread_num();
    float *ws = (float *)(q + (size_t)IFLQ_RT * K), *wm = ws + (size_t)IFLQ_RT * (K / 16);
    TQ_FOR(qs.tq, first_tile[P], t) {
        int p = 0;
        while (t >= first_tile[p + 1]) ++p;
        const QWeight w = qweight(desc + 1 + 8 * p);
        int n0 = (t - first_tile[p]) * rt, nt = w.N - n0 < rt ? w.N - n0 : rt, o0 = first_row[p] + n0;
        if (w.qtype >= FT_BASE) { /* f16 / bf16 / f8c rows, widened against float32 x */
            const size_t rb = (size_t)K * (w.qtype == FT_F8 ? 1 : w.qtype == FT_F32 ? 4 : 2);
            const float *fs = (const float *)w.scales;
            for (int r = 0; r < nt; ++r) {
                float s = w.qtype == FT_F8 ? 256.f * fs[w.scales_per_row ? n0 + r : 0] : 1.f;
                float bv = bias ? LD(bias[o0 + r]) : 0.f;
                for (int m0 = 0; m0 < M; m0 += 8) {
                    int mm = M - m0 < 8 ? M - m0 : 8;
                    float out[8];
                    ft_dot(w.qtype, w.data + (size_t)(n0 + r) * rb, qs.xf + (size_t)m0 * K, mm, K, out);
                    for (int m = 0; m < mm; ++m) store_out(y, (size_t)(m0 + m) * ldy + o0 + r, s * out[m] + bv, mode);
                }
            }
            continue;
        }
        const int sgn = iflq_signed(w.qtype);
#ifdef HAVE_ROWS_Q8
        /* several rows: iflv_q8_rows, whose sums are iflv_q8_range's bit for bit; one row:
         * iflv_q8_range itself, 12 % faster there (Zen 4, 1 thread, the 123M spec model: 8.5 vs 9.8 ms) */
        if (w.qtype == QT_Q8_0 && M > 1) {
            for (int r = 0; r < nt; ++r)
                for (int m0 = 0; m0 < M; m0 += RQ8_MAX) {
                    float out[RQ8_MAX];
                    int mm = M - m0 < RQ8_MAX ? M - m0 : RQ8_MAX;
                    iflv_q8_rows(&w, n0 + r, qs.xq + (size_t)m0 * K, qs.dx + (size_t)m0 * nb, qs.xu + (size_t)m0 * K,
                                 mm, out);
                    for (int m = 0; m < mm; ++m)
                        store_out(y, (size_t)(m0 + m) * ldy + o0 + r, out[m] + (bias ? LD(bias[o0 + r]) : 0.f), mode);
                }
            continue;
        }
#endif
        /* straight from the blocks (quant_gemv.h) at every row count where a one-row step is: a
         * verification's K + 1 rows then equal K + 1 one-row steps bit for bit (the unpack path sums
         * in another order: a greedy token of a near-tie changed with speculation) */
        if (iflv_use(w.qtype, 1)) {
            for (int m = 0; m < M; ++m) {
                float out[QG_RT];
                iflv_dots(&w, n0, nt, qs.xq + (size_t)m * K, qs.dx + (size_t)m * nb, qs.xb + (size_t)m * (K / 16), out);
                for (int r = 0; r < nt; ++r)
                    store_out(y, (size_t)m * ldy + o0 + r, out[r] + (bias ? LD(bias[o0 + r]) : 0.f), mode);
            }
            continue;
        }
        for (int s0 = 0; s0 < nt; s0 += IFLQ_RT) { /* the unpack buffer holds IFLQ_RT rows */
            const int st = nt - s0 < IFLQ_RT ? nt - s0 : IFLQ_RT;
            for (int r = 0; r < st; ++r)
                iflq_unpack_row(&w, n0 + s0 + r, q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16));
            for (int m0 = 0; m0 < M; m0 += 4) {
                int mm = M - m0 < 4 ? M - m0 : 4;
                for (int r = 0; r < st; ++r) {
                    float out[4];
                    iflq_dot(q + (size_t)r * K, ws + (size_t)r * (K / 16), wm + (size_t)r * (K / 16), sgn,
                             qs.xq + (size_t)m0 * K, qs.dx + (size_t)m0 * nb, qs.xb + (size_t)m0 * (K / 16), K, mm, out);
                    float bv = bias ? LD(bias[o0 + s0 + r]) : 0.f;
                    for (int m = 0; m < mm; ++m) store_out(y, (size_t)(m0 + m) * ldy + o0 + s0 + r, out[m] + bv, mode);
                }
            }
        }
    }
    SYNC(ph);
}

/* A layer's GEMV: plain (w_t weights) or quantized (W is a descriptor). */
static inline void any_gemv(int quant, const void *W, const st_t *bias, const st_t *x, int M, int N, int K, void *y,
                            int ldy, int mode, Scratch sc, QScratch qs, int ph, int preq) {
    if (quant) {
        qgemv((const int64_t *)W, bias, x, M, y, ldy, mode, qs, ph, preq);
    } else {
        gemv((const w_t *)W, bias, x, M, N, K, y, ldy, mode, sc);
        prof_mark(ph);
    }
}

/* ------------------------------------------------------------------ small ops */
/* out = w * R(x * rsqrt(mean(x^2) + eps)), as HF's RMSNorm (a bf16 input rounds once inside). */
static void rms_norm(const st_t *x, const st_t *w, int n, float eps, st_t *out) {
    float lane[16] = {0}, ss = 0.f;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) lane[l] += LD(x[i + l]) * LD(x[i + l]);
    for (; i < n; ++i) ss += LD(x[i]) * LD(x[i]);
    for (int l = 0; l < 16; ++l) ss += lane[l];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (i = 0; i < n; ++i) out[i] = ST(LD(w[i]) * R(LD(x[i]) * inv));
}

/* x[:rot] = x * cos + rotate_half(x) * sin, each product and the sum rounded to the model dtype.
 * sin_signed carries rotate_half's sign (the model's table), so rotate_half(x) * sin ==
 * roll(x, rot / 2) * sin_signed. */
static void rotary(st_t *x, const st_t *cos_row, const st_t *sin_row, int rot) {
    st_t tmp[1024];
    int half = rot / 2;
    memcpy(tmp, x, (size_t)rot * sizeof(st_t));
    for (int i = 0; i < rot; ++i) {
        float rolled = LD(tmp[i < half ? i + half : i - half]);
        float a = R(LD(tmp[i]) * LD(cos_row[i]));
        float b = R(rolled * LD(sin_row[i]));
        x[i] = ST(a + b);
    }
}

static inline float dot_q(const float *q, const st_t *k, int n) {
    float lane[16] = {0}, s = 0.f;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) lane[l] += q[i + l] * LD(k[i + l]);
    for (; i < n; ++i) s += q[i] * LD(k[i]);
    for (int l = 0; l < 16; ++l) s += lane[l];
    return s;
}

#include "attend_vec.h" /* attend()'s scores and P.V across vector lanes, the same operations */
#include "silu_vec.h"   /* the SiLU task's block in one pass of vectors, the same operations */

/* ------------------------------------------------------------------ the step */
typedef struct {
    int M, H, NH, KV, HD, ROT, I, QKVN, qk_norm, bs, window, quant;
    long slots;
    float eps, scale;
} Dims;

/* Position p's K / V row offset in the pool (from `row`, the sequence's block table) and in *end
 * the end of p's block: positions a block at a time, one division per block, not a / and a % per
 * position and pass (Qwen2.5-0.5B shape, 130-160 positions, Zen 4: the step's attention 0.62 -> 0.46
 * ms a thread) */
static inline long block_base(const int64_t *row, int p, int bs, int len, int *end) {
    const int blk = p / bs;
    *end = (blk + 1) * bs < len ? (blk + 1) * bs : len;
    return (long)row[blk] * bs - (long)blk * bs;
}

/* The scalar loops attend_vec.h's att_scores_heads / att_pv_heads run several positions at a time
 * (the reference for their bits: -DIFL_ATTN_REF builds these alone). Scores of nh heads (q: nh x
 * hd) over positions start .. len - 1, each head's max in mx */
static void scores_scalar(const float *q, int nh, int hd, float scale, const st_t *K, const int64_t *row, int bs,
                          int start, int len, float *scores, float *mx) {
    const int n = len - start;
    for (int p = start, end; p < len;)
        for (const long base = block_base(row, p, bs, len, &end); p < end; ++p)
            for (int g = 0; g < nh; ++g) {
                float s = dot_q(q + (size_t)g * hd, K + (base + p) * hd, hd) * scale;
                scores[(size_t)g * n + p - start] = s;
                if (s > mx[g]) mx[g] = s;
            }
}

/* o (nh x hd, zeroed) += R(pr) . V over the same positions (pr: nh x n probabilities) */
static void pv_scalar(const st_t *V, const int64_t *row, int start, int len, int bs, int hd, int nh, const float *pr,
                      int n, float *o) {
    for (int p = start, end; p < len;)
        for (const long base = block_base(row, p, bs, len, &end); p < end; ++p)
            for (int g = 0; g < nh; ++g) {
                const st_t *v = V + (base + p) * hd;
                const float w = R(pr[(size_t)g * n + p - start]);
                for (int i = 0; i < hd; ++i) o[(size_t)g * hd + i] += w * LD(v[i]);
            }
}

/* Query heads h0 .. h0 + nh - 1 of row m (all of one key head's group) over its context, as
 * PyTorch's CPU flash attention (what Hugging Face runs through SDPA) computes a decode: scores
 * q.k * scale and the softmax in float32; in a bf16 model the unnormalised probabilities are
 * rounded to bf16 for the P.V product; one division at the end. Each K and V row is read once for
 * all nh heads (a batch-1 step passes a key head's whole group: 7 heads on Qwen2.5-0.5B), and each
 * head's scores, max, sum and P.V run in the same order whatever nh: the same bits one head at a
 * time. scores: nh x the context's positions; out: head h0's output, the others after it.
 * attend_vec.h runs the same operations several positions / outputs at a time (0.5B Q8_0 step, 2
 * threads, Zen 4: 0.51 -> 0.43 ms a thread; hot in cache 0.33 -> 0.16; test_decode_kernel_bits.py). */
static void attend(const Dims *d, const st_t *qkv_row, const st_t *kv, const int64_t *table, int max_blocks,
                   int m, int pos, int h0, int nh, float *scores, st_t *out) {
    const int hd = d->HD, kvh = h0 / (d->NH / d->KV);
    float q[nh][hd], o[nh][hd], mx[nh], sum[nh]; /* <= 16 x 256 x 2 floats (32 KB) on these models */
    for (int g = 0; g < nh; ++g) {
        for (int i = 0; i < hd; ++i) q[g][i] = LD(qkv_row[(h0 + g) * hd + i]);
        mx[g] = -INFINITY;
    }
    const st_t *K = kv + (size_t)kvh * d->slots * hd;
    const st_t *V = kv + ((size_t)d->KV + kvh) * d->slots * hd;
    int len = pos + 1, start = 0;
    if (d->window > 0 && len > d->window) start = len - d->window;
    const int n = len - start, bs = d->bs;
    const int64_t *row = table + (size_t)m * max_blocks;
#if defined(ATT_VEC) && !defined(IFL_ATTN_REF)
    const int vec = hd % 16 == 0;
    if (vec) att_scores_heads(&q[0][0], nh, hd, d->scale, K, row, bs, start, len, scores, mx);
#else
    const int vec = 0;
#endif
    if (!vec) scores_scalar(&q[0][0], nh, hd, d->scale, K, row, bs, start, len, scores, mx);
    /* e^(s - max) 16 / 8 at a time (vec_exp.h): scalar expf was ~15 % of the step's attention */
    for (int g = 0; g < nh; ++g) {
        sum[g] = ifl_exp_shifted(scores + (size_t)g * n, n, mx[g]);
        for (int i = 0; i < hd; ++i) o[g][i] = 0.f;
    }
#if defined(ATT_VEC) && !defined(IFL_ATTN_REF)
    if (vec) {
        att_round(scores, nh * n);
        att_pv_heads(V, row, start, len, bs, hd, nh, scores, n, &o[0][0]);
    }
#endif
    if (!vec) pv_scalar(V, row, start, len, bs, hd, nh, scores, n, &o[0][0]);
    for (int g = 0; g < nh; ++g) {
        float inv = 1.0f / sum[g];
        for (int i = 0; i < hd; ++i) out[(size_t)g * hd + i] = ST(o[g][i] * inv);
    }
}

/* Head `head` of row m (query heads 0..NH-1, then key heads): (q/k norm), rotary; a key head also
 * writes its K and V at the row's slot. */
static void rope_head(const Dims *d, const int64_t *P, st_t *qkv, int m, int head, const st_t *cos_t,
                      const st_t *sin_t, const int64_t *pos, const int64_t *slots, st_t *kv) {
    st_t *vec = qkv + (size_t)m * d->QKVN + (size_t)head * d->HD;
    if (d->qk_norm) {
        const st_t *w = (const st_t *)P[head < d->NH ? L_Q_NORM : L_K_NORM];
        st_t normed[1024];
        rms_norm(vec, w, d->HD, d->eps, normed);
        memcpy(vec, normed, sizeof(st_t) * d->HD);
    }
    rotary(vec, cos_t + (size_t)pos[m] * d->ROT, sin_t + (size_t)pos[m] * d->ROT, d->ROT);
    if (head >= d->NH) {
        int kvh = head - d->NH;
        const st_t *v = qkv + (size_t)m * d->QKVN + (size_t)(d->NH + d->KV + kvh) * d->HD;
        memcpy(kv + ((size_t)kvh * d->slots + slots[m]) * d->HD, vec, sizeof(st_t) * d->HD);
        memcpy(kv + ((size_t)(d->KV + kvh) * d->slots + slots[m]) * d->HD, v, sizeof(st_t) * d->HD);
    }
}

/* Query head `head` of row m attended into attn; with qs, the head's blocks of the o projection's
 * input rounded to int8 there too (quant_x_block). */
static void attend_head(const Dims *d, const st_t *qkv, const st_t *kv, const int64_t *table, int max_blocks, int m,
                        const int64_t *pos, int head, float *scores, st_t *attn, const QScratch *qs) {
    attend(d, qkv + (size_t)m * d->QKVN, kv, table, max_blocks, m, (int)pos[m], head, 1, scores,
           attn + (size_t)m * d->NH * d->HD + (size_t)head * d->HD);
    if (qs)
        for (int b = head * d->HD / 32; b < (head + 1) * d->HD / 32; ++b)
            quant_x_block(qs, attn, d->NH * d->HD, m, b, 1);
}

static void add_into(st_t *x, const st_t *y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = ST(LD(x[i]) + LD(y[i]));
}

/* h = RMSNorm(x) row by row (w: its weight); q (not NULL): h's blocks rounded to int8 there too */
static void norm_rows(const st_t *x, const st_t *w, const Dims *d, st_t *h, const QScratch *q) {
    for (int m = 0; m < d->M; ++m) rms_norm(x + (size_t)m * d->H, w, d->H, d->eps, h + (size_t)m * d->H);
    if (q) quant_x_rows(q, h, d->M, d->H);
}

/* aux[i] = x (n elements) for every i with aux_layers[i] == l (a layer may be named twice) */
static void capture_aux(const int64_t *aux_layers, int n_aux, int l, const st_t *x, size_t n, st_t *aux) {
    for (int i = 0; i < n_aux; ++i)
        if (aux_layers[i] == l) memcpy(aux + (size_t)i * n, x, sizeof(st_t) * n);
}

/* Private norms: every thread keeps its own copy of the residual stream and
 * computes each RMSNorm (and its int8 rounding) of all M rows itself, instead of one thread in a
 * `single` followed by a barrier. Correct without a barrier because each thread reads only (a) its
 * own copy and (b) the GEMV output `tmp`, which is complete at the GEMV's closing barrier and is
 * rewritten only by the next o / down GEMV, which starts after at least one more barrier (attention's
 * or SiLU's) that every thread reaches after its norm. The same code on the same values: every
 * copy holds the bits the shared one did. 9 -> 7 barriers a layer (M == 1 with KV >= threads: 8 -> 6),
 * for ~1 us a norm redone per thread (896 wide). */

typedef struct {
    st_t *x, *h;  /* the residual stream (M, H), the norm's output (M, H) */
    QScratch q;   /* the shared QScratch with the activation buffers this thread's own */
} Priv;

static size_t al64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t priv_bytes(int M, int H) {
    const size_t mh = (size_t)M * H;
    return 2 * al64(sizeof(st_t) * mh) + al64(sizeof(float) * mh) + 2 * al64(mh) +
           al64(sizeof(float) * ((size_t)M * (H / 32) + (size_t)M * (H / 16)));
}

/* thread t's Priv in arena (nthreads * priv_bytes, 64-aligned) */
static Priv priv_at(char *arena, int t, int M, int H, QScratch qs) {
    const size_t mh = (size_t)M * H;
    char *c = arena + (size_t)t * priv_bytes(M, H);
    Priv p;
    p.x = (st_t *)c; c += al64(sizeof(st_t) * mh);
    p.h = (st_t *)c; c += al64(sizeof(st_t) * mh);
    p.q = qs;
    p.q.xf = (float *)c; c += al64(sizeof(float) * mh);
    p.q.xq = (int8_t *)c; c += al64(mh);
    p.q.xu = (uint8_t *)c; c += al64(mh);
    p.q.dx = (float *)c;
    p.q.xb = p.q.dx + (size_t)M * (H / 32);
    return p;
}

static int scratch_alloc(Scratch *sc, int nthreads, int M, int K) {
    sc->stride = (size_t)M * K + 16;
    sc->buf = malloc(sizeof(float) * sc->stride * (size_t)nthreads);
    sc->tq = tq_alloc(nthreads);
    return sc->buf != NULL && sc->tq != NULL;
}

/* A step of M rows, each one token at its position, attending to positions 0..pos (rows of one
 * sequence: causally among themselves, since every row's K/V is written before any row attends).
 * out: (M, hidden) final-normed hidden states. aux: (n_aux, M, hidden), the input of layer
 * aux_layers[i] (the residual stream, Hugging Face's hidden_states[l]: 0 the embeddings, `layers`
 * the last layer's output before the final norm; what EAGLE heads read); n_aux 0: none.
 * ids/pos/slots: (M,); table: (M, max_blocks) block ids.
 * head (not NULL): the lm_head (ifl_logits's W, or ifl_logits_q's descriptor), run in the same
 * parallel region into logits (M, vocab) float32, with argmax / logprob as ifl_logits's: one
 * region a step, not two, and no Python between (0.1-0.15 ms a batch-1 step, Zen 4).
 * Returns 0, or -1 on a bad argument. */
int ifl_decode_step(const int64_t *cfg, const double *fcfg, const int64_t *lp, const int64_t *gp, int M,
                    const int64_t *ids, const int64_t *pos, const int64_t *slots, const int64_t *table,
                    int max_blocks, st_t *out, const int64_t *aux_layers, int n_aux, st_t *aux, const void *head,
                    float *logits, int64_t *argmax, double *logprob, int nthreads) {
#ifdef IFL_PROFILE
    const double step_t0 = omp_get_wtime();
#endif
    Dims d;
    d.M = M;
    d.H = (int)cfg[C_HIDDEN];
    d.NH = (int)cfg[C_HEADS];
    d.KV = (int)cfg[C_KV_HEADS];
    d.HD = (int)cfg[C_HEAD_DIM];
    d.ROT = (int)cfg[C_ROT_DIM];
    d.I = (int)cfg[C_INTER];
    d.qk_norm = (int)cfg[C_QK_NORM];
    d.bs = (int)cfg[C_BLOCK_SIZE];
    d.slots = (long)cfg[C_SLOTS];
    d.window = (int)cfg[C_WINDOW];
    d.quant = (int)cfg[C_QUANT];
    d.eps = (float)fcfg[0];
    d.scale = (float)fcfg[1];
    d.QKVN = (d.NH + 2 * d.KV) * d.HD;
    int layers = (int)cfg[C_LAYERS];
    const int vocab = (int)cfg[C_VOCAB];
    if (M <= 0 || d.HD > 1024 || d.ROT > 1024 || d.ROT > d.HD || nthreads <= 0 || n_aux < 0 || (n_aux && !aux) ||
        (head && (!logits || vocab <= 0)) || (!head && argmax))
        return -1;
    int max_len = 0;
    for (int m = 0; m < M; ++m) max_len = pos[m] + 1 > max_len ? (int)pos[m] + 1 : max_len;

    size_t wide = (size_t)(d.I > d.QKVN ? d.I : d.QKVN);
    int max_k = d.H > d.I ? d.H : d.I;
    if (d.NH * d.HD > max_k) max_k = d.NH * d.HD;
    st_t *x = malloc(sizeof(st_t) * M * d.H);            /* residual stream */
    st_t *qkv = malloc(sizeof(st_t) * M * wide);         /* qkv, then SiLU(gate) * up */
    st_t *attn = malloc(sizeof(st_t) * M * d.NH * d.HD);
    st_t *gu = malloc(sizeof(st_t) * M * 2 * (size_t)d.I);
    st_t *tmp = malloc(sizeof(st_t) * M * d.H);
    float *scores = malloc(sizeof(float) * (size_t)nthreads * (d.NH / d.KV) * max_len); /* attend: a key head's G rows */
    Scratch sc = {0};
    QScratch qs = {0};
    int ok = scratch_alloc(&sc, nthreads, M, max_k) && (!d.quant || qscratch_alloc(&qs, nthreads, M, max_k));
    SliceStat *st = argmax ? malloc(sizeof(SliceStat) * (size_t)M * nthreads) : NULL;
    char *arena = aligned_alloc(64, priv_bytes(M, d.H) * (size_t)nthreads); /* each thread's Priv */
    if (!x || !qkv || !attn || !gu || !tmp || !scores || !ok || (argmax && !st) || !arena) {
        free(x); free(qkv); free(attn); free(gu); free(tmp); free(scores); free(sc.buf); free(sc.tq); free(st);
        free(arena);
        qscratch_free(&qs);
        return -2;
    }
    const st_t *embed = (const st_t *)gp[G_EMBED];
    for (int m = 0; m < M; ++m) memcpy(x + (size_t)m * d.H, embed + (size_t)ids[m] * d.H, sizeof(st_t) * d.H);
    const st_t *cos_t = (const st_t *)gp[G_COS], *sin_t = (const st_t *)gp[G_SIN];
    /* the GEMV inputs rounded to int8 where they are made (quant_x_block), not in a pass of their
     * own: 14 -> 9 barriers a layer */
    const int o_preq = d.quant && d.HD % 32 == 0, nbi = (d.I + 31) / 32;
    PfBarrier bar = {0, 0, 0, 0};
    (void)bar;

#pragma omp parallel num_threads(nthreads)
    {
        float *my_scores = scores + (size_t)omp_get_thread_num() * (d.NH / d.KV) * max_len;
        PF_START(&bar);
        PF_NEXT(d.quant, layers ? (const void *)lp[L_QKV_W] : head);
        Priv pv = priv_at(arena, omp_get_thread_num(), M, d.H, qs);
        memcpy(pv.x, x, sizeof(st_t) * M * d.H);
        prof_mark(-1);
        for (int l = 0; l < layers; ++l) {
            const int64_t *P = lp + (size_t)l * L_N;
            st_t *kv = (st_t *)P[L_KV];
            if (l) add_into(pv.x, tmp, (size_t)M * d.H); /* the previous layer's down projection */
            if (omp_get_thread_num() == 0) capture_aux(aux_layers, n_aux, l, pv.x, (size_t)M * d.H, aux);
            norm_rows(pv.x, (const st_t *)P[L_IN_NORM], &d, pv.h, d.quant ? &pv.q : NULL);
            prof_mark(PH_NORM);
            PF_NEXT(d.quant, P[L_O_W]); /* ticked by the barrier waits (IFL_SPIN_BARRIER) */
            PF_ALSO(d.quant, P[L_GU_W]);
            any_gemv(d.quant, (const void *)P[L_QKV_W], (const st_t *)P[L_QKV_B], pv.h, M, d.QKVN, d.H, qkv, d.QKVN,
                     OUT_ST, sc, pv.q, PH_QKV, 1);
            if (M == 1 && d.KV >= omp_get_num_threads()) {
                /* one row, a task per KV head: its key head's rotary and K / V, then its query heads'
                 * rotary and attention, with no barrier between (no other row's K / V to wait for;
                 * the same operations per head as below, so the same bits) */
#pragma omp for schedule(static) nowait
                for (int kvh = 0; kvh < d.KV; ++kvh) {
                    const int G = d.NH / d.KV;
                    rope_head(&d, P, qkv, 0, d.NH + kvh, cos_t, sin_t, pos, slots, kv);
                    for (int hq = kvh * G; hq < (kvh + 1) * G; ++hq) rope_head(&d, P, qkv, 0, hq, cos_t, sin_t, pos, slots, kv);
                    attend(&d, qkv, kv, table, max_blocks, 0, (int)pos[0], kvh * G, G, my_scores, attn + (size_t)kvh * G * d.HD);
                    if (o_preq)
                        for (int b = kvh * G * d.HD / 32; b < (kvh + 1) * G * d.HD / 32; ++b) quant_x_block(&qs, attn, d.NH * d.HD, 0, b, 1);
                }
            } else {
#pragma omp for schedule(static) nowait
                for (int t = 0; t < M * (d.NH + d.KV); ++t)
                    rope_head(&d, P, qkv, t / (d.NH + d.KV), t % (d.NH + d.KV), cos_t, sin_t, pos, slots, kv);
                SYNC(PH_ROPE); /* rows of one sequence attend to each other's K / V */
#pragma omp for schedule(static) nowait
                for (int t = 0; t < M * d.NH; ++t)
                    attend_head(&d, qkv, kv, table, max_blocks, t / d.NH, pos, t % d.NH, my_scores, attn,
                                o_preq ? &qs : NULL);
            }
            SYNC(PH_ATTN);
            PF_NEXT(d.quant, P[L_GU_W]); /* ticked by the post-attention norm and barriers */
            any_gemv(d.quant, (const void *)P[L_O_W], (const st_t *)P[L_O_B], attn, M, d.H, d.NH * d.HD, tmp, d.H,
                     OUT_ST, sc, qs, PH_O, o_preq);
            add_into(pv.x, tmp, (size_t)M * d.H);
            norm_rows(pv.x, (const st_t *)P[L_POST_NORM], &d, pv.h, d.quant ? &pv.q : NULL);
            prof_mark(PH_NORM);
            PF_NEXT(d.quant, P[L_DOWN_W]); /* ticked by the SiLU loop and its barriers */
            any_gemv(d.quant, (const void *)P[L_GU_W], (const st_t *)P[L_GU_B], pv.h, M, 2 * d.I, d.H, gu, 2 * d.I,
                     OUT_ST, sc, pv.q, PH_GU, 1);
            /* SiLU(gate) * up, 32 elements a task: each block of the down projection's input rounded
             * to int8 as it is made */
#pragma omp for schedule(static) nowait
            for (int t = 0; t < M * nbi; ++t) {
                const int m = t / nbi, b = t % nbi, end = 32 * b + 32 < d.I ? 32 * b + 32 : d.I;
                float s[32];
                const st_t *g = gu + (size_t)m * 2 * d.I + 32 * b, *u = g + d.I;
                PF_TICK(IFL_PF_SILU); /* prefetch_ahead.h: down's first rows (default off) */
#if defined(SILU_VEC) && !defined(IFL_SILU_REF) /* silu_vec.h: the same bits in one pass */
                if (end - 32 * b == 32) {
                    /* quantized: down (preq) reads qs's forms only, so no y (a store miss a line) */
                    silu_mul_block(g, u, d.quant ? NULL : qkv + (size_t)m * d.I + 32 * b,
                                   d.quant ? qs.xf + (size_t)m * d.I + 32 * b : s);
                    if (d.quant) quant_x_ints(&qs, d.I, m, b);
                    continue;
                }
#endif
                for (int i = 0; i < end - 32 * b; ++i) s[i] = LD(g[i]);
                silu_inplace(s, end - 32 * b);
                for (int i = 0; i < end - 32 * b; ++i) qkv[(size_t)m * d.I + 32 * b + i] = ST(R(s[i]) * LD(u[i]));
                if (d.quant) quant_x_block(&qs, qkv, d.I, m, b, 1);
            }
            SYNC(PH_SILU);
            /* its output joins each thread's copy of the residual stream before the next (or the final) norm */
            PF_NEXT(d.quant, l + 1 < layers ? (const void *)lp[(size_t)(l + 1) * L_N + L_QKV_W] : head);
            any_gemv(d.quant, (const void *)P[L_DOWN_W], (const st_t *)P[L_DOWN_B], qkv, M, d.H, d.I, tmp, d.H, OUT_ST,
                     sc, qs, PH_DOWN, 1);
        }
        /* the lm_head reads the thread's own copy; thread 0 hands out and aux back (read after the region) */
        if (layers) add_into(pv.x, tmp, (size_t)M * d.H);
        norm_rows(pv.x, (const st_t *)gp[G_FINAL_NORM], &d, pv.h, head && d.quant ? &pv.q : NULL);
        if (omp_get_thread_num() == 0) {
            capture_aux(aux_layers, n_aux, layers, pv.x, (size_t)M * d.H, aux);
            memcpy(out, pv.h, sizeof(st_t) * M * d.H);
        }
        prof_mark(PH_NORM);
        if (head) {
            any_gemv(d.quant, head, NULL, pv.h, M, vocab, d.H, logits, vocab, OUT_F32, sc, pv.q, PH_HEAD, 1);
            if (st) row_stats_slices(logits, M, vocab, nthreads, logprob != NULL, st);
        }
        if (layers) PF_TAIL(d.quant, lp[L_QKV_W], lp[L_O_W], lp[L_GU_W]); /* the next step's first rows */
        PF_END();
    }
    if (st) row_stats_merge(st, M, nthreads, argmax, logprob);
    free(x); free(qkv); free(attn); free(gu); free(tmp); free(scores); free(sc.buf); free(sc.tq); free(st);
    free(arena);
    qscratch_free(&qs);
#ifdef IFL_PROFILE
    prof_sum[0][0][PH_STEP] += omp_get_wtime() - step_t0;
#endif
    return 0;
}

/* logits (M, N) float32 = R(hidden (M, K) . W (N, K)^T), as the eager lm_head then .float().
 * argmax (M,) int64, when not NULL: each row's greedy token; logprob (M,) float64, when not NULL
 * too: its log-softmax (see row_stats_merge). */
int ifl_logits(const w_t *W, const st_t *hidden, int M, int N, int K, float *out, int64_t *argmax, double *logprob,
               int nthreads) {
    if (M <= 0 || N <= 0 || K <= 0 || nthreads <= 0) return -1;
    Scratch sc = {0};
    SliceStat *st = argmax ? malloc(sizeof(SliceStat) * (size_t)M * nthreads) : NULL;
    if (!scratch_alloc(&sc, nthreads, M, K) || (argmax && !st)) {
        free(sc.buf); free(sc.tq); free(st);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
        gemv(W, NULL, hidden, M, N, K, out, N, OUT_F32, sc);
        if (st) row_stats_slices(out, M, N, nthreads, logprob != NULL, st);
    }
    if (st) row_stats_merge(st, M, nthreads, argmax, logprob);
    free(sc.buf); free(sc.tq); free(st);
    return 0;
}

/* As ifl_logits for a quantized lm_head (desc: its descriptor). */
int ifl_logits_q(const int64_t *desc, const st_t *hidden, int M, int N, float *out, int64_t *argmax, double *logprob,
                 int nthreads) {
    const int K = (int)desc[1 + 2];
    if (M <= 0 || N <= 0 || K <= 0 || nthreads <= 0 || desc[0] < 1 || desc[0] > IFLQ_MAX_PARTS) return -1;
    Scratch sc = {0};
    QScratch qs = {0};
    SliceStat *st = argmax ? malloc(sizeof(SliceStat) * (size_t)M * nthreads) : NULL;
    if (!qscratch_alloc(&qs, nthreads, M, K) || (argmax && !st)) {
        qscratch_free(&qs); free(st);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
        prof_mark(-1);
        any_gemv(1, desc, NULL, hidden, M, N, K, out, N, OUT_F32, sc, qs, PH_HEAD, 0);
        if (st) row_stats_slices(out, M, N, nthreads, logprob != NULL, st);
    }
    if (st) row_stats_merge(st, M, nthreads, argmax, logprob);
    qscratch_free(&qs); free(st);
    return 0;
}
