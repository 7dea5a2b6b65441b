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

#include "decode_gemv.h" /* GEMVs over plain weights */

#include "decode_ft.h" /* float-format rows */

#include "decode_qgemv.h" /* quantized GEMVs */

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

#include "decode_attend.h" /* attention, rope, norms */

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
