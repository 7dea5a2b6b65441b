/* inflight CPU decode kernel: one whole small-batch decode step of a Llama-family model.
 *
 * Why: at batch 1 a bfloat16 decode step is a chain of GEMVs (memory-bound) and ~20 small
 * ops per layer. Through PyTorch the small ops cost ~230 us per layer (dispatch, allocation,
 * Python) and each oneDNN GEMV call has a fixed cost; here the whole step is one C call and
 * one OpenMP parallel region, with barriers between phases.
 *
 * Numerics follow the PyTorch path of inflight/models (which follows Hugging Face): every
 * intermediate that the eager model holds in bfloat16 is rounded to bfloat16 here at the same
 * point (RMSNorm, rotary products and sum, activations, residual adds); attention follows
 * PyTorch's CPU flash attention (see attend()); products are accumulated in float32
 * (summation order may differ).
 *
 * Compiled at run time by inflight/models/cpu_kernel.py (gcc -O3 -march=native -fopenmp),
 * linked to the libgomp that torch already loaded, so it shares torch's thread team.
 * The AVX512-BF16 GEMV is used when the compiler targets it; otherwise portable C.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define IFL_AVX512BF16 1
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

/* ------------------------------------------------------------------ config layout
 * cfg (int64): the indices below. lp (int64): LP_N pointers per layer. gp (int64): G_N pointers. */
enum { C_HIDDEN, C_HEADS, C_KV_HEADS, C_HEAD_DIM, C_ROT_DIM, C_INTER, C_LAYERS, C_QK_NORM,
       C_BLOCK_SIZE, C_SLOTS, C_WINDOW, C_VOCAB, C_N };
enum { L_IN_NORM, L_QKV_W, L_QKV_B, L_Q_NORM, L_K_NORM, L_O_W, L_O_B, L_POST_NORM, L_GU_W, L_GU_B,
       L_DOWN_W, L_DOWN_B, L_KV, L_N };
enum { G_EMBED, G_FINAL_NORM, G_COS, G_SIN, G_N };

int ifl_abi_version(void) { return 1; }

int ifl_uses_avx512bf16(void) {
#ifdef IFL_AVX512BF16
    return 1;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------ GEMV
 * Dot products of nr <= 4 consecutive rows of W (N, K) with the M <= 4 rows of x (M, K):
 * out[m][r] float32. The full-width case (4 rows, K % 32 == 0) is specialised per M so that the
 * 16 accumulators live in registers (a runtime M spills them: 35 instead of 49 GB/s at K = 896). */
#ifdef IFL_AVX512BF16
static inline __attribute__((always_inline)) void dot4_full(const bf16 *W, const bf16 *x, const int M, int K,
                                                            float out[4][4]) {
    __m512 acc[4][4];
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < 4; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(W + k);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(W + (size_t)K + k);
        __m512bh w2 = (__m512bh)_mm512_loadu_si512(W + 2 * (size_t)K + k);
        __m512bh w3 = (__m512bh)_mm512_loadu_si512(W + 3 * (size_t)K + k);
        for (int m = 0; m < M; ++m) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)m * K + k);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, xv);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, xv);
            acc[m][2] = _mm512_dpbf16_ps(acc[m][2], w2, xv);
            acc[m][3] = _mm512_dpbf16_ps(acc[m][3], w3, xv);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int r = 0; r < 4; ++r) out[m][r] = _mm512_reduce_add_ps(acc[m][r]);
}

static void dot_rows_masked(const bf16 *W, int nr, const bf16 *x, int M, int K, float out[4][4]) {
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < M; ++m) {
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < K; k += 32) {
                int n = K - k < 32 ? K - k : 32;
                __mmask32 mk = n == 32 ? 0xffffffffu : ((1u << n) - 1u);
                __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, W + (size_t)r * K + k);
                __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mk, x + (size_t)m * K + k);
                acc = _mm512_dpbf16_ps(acc, wv, xv);
            }
            out[m][r] = _mm512_reduce_add_ps(acc);
        }
}

static inline __attribute__((always_inline)) void dot_rows(const bf16 *W, int nr, const bf16 *x, int M, int K,
                                                           float out[4][4]) {
    if (nr != 4 || K % 32 != 0) {
        dot_rows_masked(W, nr, x, M, K, out);
        return;
    }
    switch (M) {
    case 1: dot4_full(W, x, 1, K, out); break;
    case 2: dot4_full(W, x, 2, K, out); break;
    case 3: dot4_full(W, x, 3, K, out); break;
    default: dot4_full(W, x, 4, K, out); break;
    }
}
#else
static void dot_rows(const bf16 *W, int nr, const bf16 *x, int M, int K, float out[4][4]) {
    for (int r = 0; r < nr; ++r) {
        const bf16 *w = W + (size_t)r * K;
        for (int m = 0; m < M; ++m) {
            const bf16 *xm = x + (size_t)m * K;
            float lane[16] = {0};
            int k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; ++l) lane[l] += bf2f(w[k + l]) * bf2f(xm[k + l]);
            float s = 0.f;
            for (; k < K; ++k) s += bf2f(w[k]) * bf2f(xm[k]);
            for (int l = 0; l < 16; ++l) s += lane[l];
            out[m][r] = s;
        }
    }
}
#endif

#ifdef IFL_AVX512BF16
/* 4 rows x 1 input row */
static __attribute__((noinline)) void dot4_m1(const bf16 *w, const bf16 *x, int K, float v[4]) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int k = 0; k < K; k += 32) {
        __m512bh xv = (__m512bh)_mm512_loadu_si512(x + k);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), xv);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + K + k), xv);
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w + 2 * K + k), xv);
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w + 3 * K + k), xv);
    }
    v[0] = _mm512_reduce_add_ps(a0);
    v[1] = _mm512_reduce_add_ps(a1);
    v[2] = _mm512_reduce_add_ps(a2);
    v[3] = _mm512_reduce_add_ps(a3);
}
#endif

enum { OUT_BF16, OUT_F32_VIA_BF16 };

static inline void store_out(void *y, size_t at, float v, int mode) {
    if (mode == OUT_BF16)
        ((bf16 *)y)[at] = f2bf(v);
    else
        ((float *)y)[at] = rbf(v);
}

#ifdef IFL_AVX512BF16
/* Batch 1 with N % 4 == 0 and K % 32 == 0 (every real projection): kept apart from the general
 * loop nest, which gcc schedules ~20 % slower (measured 50 vs 62 GB/s on gate_up). */
static void gemv_m1(const bf16 *W, const bf16 *bias, const bf16 *x, int N, int K, void *y, int mode) {
#pragma omp for schedule(static)
    for (int b = 0; b < N / 4; ++b) {
        float v[4];
        dot4_m1(W + (size_t)4 * b * K, x, K, v);
        for (int r = 0; r < 4; ++r) store_out(y, 4 * b + r, v[r] + (bias ? bf2f(bias[4 * b + r]) : 0.f), mode);
    }
}
#endif

/* y[m * ldy + n] = round(x[m] . W[n] + bias[n]) for n < N. Called inside a parallel region:
 * an orphaned `omp for` over 4-row blocks, with its barrier at the end. M is any size. */
static void gemv(const bf16 *W, const bf16 *bias, const bf16 *x, int M, int N, int K, void *y, int ldy, int mode) {
#ifdef IFL_AVX512BF16
    if (M == 1 && N % 4 == 0 && K % 32 == 0) {
        gemv_m1(W, bias, x, N, K, y, mode);
        return;
    }
#endif
    int nblocks = (N + 3) / 4;
#pragma omp for schedule(static)
    for (int b = 0; b < nblocks; ++b) {
        int r0 = 4 * b, nr = N - r0 < 4 ? N - r0 : 4;
        for (int m0 = 0; m0 < M; m0 += 4) {
            int mm = M - m0 < 4 ? M - m0 : 4;
            float out[4][4];
            dot_rows(W + (size_t)r0 * K, nr, x + (size_t)m0 * K, mm, K, out);
            for (int m = 0; m < mm; ++m) {
                for (int r = 0; r < nr; ++r)
                    store_out(y, (size_t)(m0 + m) * ldy + r0 + r, out[m][r] + (bias ? bf2f(bias[r0 + r]) : 0.f), mode);
            }
        }
    }
}

/* ------------------------------------------------------------------ small ops */
/* out = w * bf16(x * rsqrt(mean(x^2) + eps)), as HF's RMSNorm on a bf16 input. */
static void rms_norm(const bf16 *x, const bf16 *w, int n, float eps, bf16 *out) {
    float lane[16] = {0}, ss = 0.f;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) lane[l] += bf2f(x[i + l]) * bf2f(x[i + l]);
    for (; i < n; ++i) ss += bf2f(x[i]) * bf2f(x[i]);
    for (int l = 0; l < 16; ++l) ss += lane[l];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (i = 0; i < n; ++i) out[i] = f2bf(bf2f(w[i]) * rbf(bf2f(x[i]) * inv));
}

/* x[:rot] = x * cos + rotate_half(x) * sin, each product and the sum rounded to bf16.
 * sin_signed carries rotate_half's sign (the model's table), so rotate_half(x) * sin ==
 * roll(x, rot / 2) * sin_signed. */
static void rotary(bf16 *x, const bf16 *cos_row, const bf16 *sin_row, int rot) {
    bf16 tmp[1024];
    int half = rot / 2;
    memcpy(tmp, x, (size_t)rot * sizeof(bf16));
    for (int i = 0; i < rot; ++i) {
        float rolled = bf2f(tmp[i < half ? i + half : i - half]);
        float a = rbf(bf2f(tmp[i]) * bf2f(cos_row[i]));
        float b = rbf(rolled * bf2f(sin_row[i]));
        x[i] = f2bf(a + b);
    }
}

static inline float dot_bf16_f32(const float *q, const bf16 *k, int n) {
    float lane[16] = {0}, s = 0.f;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) lane[l] += q[i + l] * bf2f(k[i + l]);
    for (; i < n; ++i) s += q[i] * bf2f(k[i]);
    for (int l = 0; l < 16; ++l) s += lane[l];
    return s;
}

/* ------------------------------------------------------------------ the step */
typedef struct {
    int M, H, NH, KV, HD, ROT, I, QKVN, qk_norm, bs, window;
    long slots;
    float eps, scale;
} Dims;

static inline long slot_of(const int64_t *table, int max_blocks, int m, int p, int bs) {
    return table[(size_t)m * max_blocks + p / bs] * bs + p % bs;
}

/* One query head of one row over its context, as PyTorch's CPU flash attention (what Hugging Face
 * runs through SDPA) computes a bf16 decode: scores q.k * scale and the softmax in float32, the
 * unnormalised probabilities rounded to bf16 for the P.V product, one division at the end. */
static void attend(const Dims *d, const bf16 *qkv_row, const bf16 *kv, const int64_t *table, int max_blocks,
                   int m, int pos, int h, float *scores, bf16 *out) {
    int g = d->NH / d->KV, kvh = h / g, hd = d->HD;
    float q[1024], o[1024];
    for (int i = 0; i < hd; ++i) q[i] = bf2f(qkv_row[h * hd + i]);
    const bf16 *K = kv + (size_t)kvh * d->slots * hd;
    const bf16 *V = kv + ((size_t)d->KV + kvh) * d->slots * hd;
    int len = pos + 1, start = 0;
    if (d->window > 0 && len > d->window) start = len - d->window;
    float mx = -INFINITY;
    for (int p = start; p < len; ++p) {
        float s = dot_bf16_f32(q, K + slot_of(table, max_blocks, m, p, d->bs) * hd, hd) * d->scale;
        scores[p - start] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.f;
    for (int i = 0; i < hd; ++i) o[i] = 0.f;
    for (int p = start; p < len; ++p) {
        float e = expf(scores[p - start] - mx);
        sum += e;
        float pr = rbf(e);
        const bf16 *v = V + slot_of(table, max_blocks, m, p, d->bs) * hd;
        for (int i = 0; i < hd; ++i) o[i] += pr * bf2f(v[i]);
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < hd; ++i) out[i] = f2bf(o[i] * inv);
}

static void add_into(bf16 *x, const bf16 *y, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = f2bf(bf2f(x[i]) + bf2f(y[i]));
}

/* A decode step for M rows (one new token each). out: (M, hidden) final-normed hidden states.
 * ids/pos/slots: (M,); table: (M, max_blocks) block ids. Returns 0, or -1 on a bad argument. */
int ifl_decode_step(const int64_t *cfg, const double *fcfg, const int64_t *lp, const int64_t *gp, int M,
                    const int64_t *ids, const int64_t *pos, const int64_t *slots, const int64_t *table,
                    int max_blocks, bf16 *out, int nthreads) {
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
    d.eps = (float)fcfg[0];
    d.scale = (float)fcfg[1];
    d.QKVN = (d.NH + 2 * d.KV) * d.HD;
    int layers = (int)cfg[C_LAYERS];
    if (M <= 0 || d.HD > 1024 || d.ROT > 1024 || d.ROT > d.HD || nthreads <= 0) return -1;
    int max_len = 0;
    for (int m = 0; m < M; ++m) max_len = pos[m] + 1 > max_len ? (int)pos[m] + 1 : max_len;

    size_t wide = (size_t)(d.I > d.QKVN ? d.I : d.QKVN);
    bf16 *x = malloc(sizeof(bf16) * M * d.H);           /* residual stream */
    bf16 *h = malloc(sizeof(bf16) * M * (d.H > d.I ? d.H : d.I)); /* GEMV input */
    bf16 *qkv = malloc(sizeof(bf16) * M * wide);        /* qkv, then SiLU(gate) * up */
    bf16 *attn = malloc(sizeof(bf16) * M * d.NH * d.HD);
    bf16 *gu = malloc(sizeof(bf16) * M * 2 * (size_t)d.I);
    bf16 *tmp = malloc(sizeof(bf16) * M * d.H);
    float *scores = malloc(sizeof(float) * (size_t)nthreads * max_len);
    if (!x || !h || !qkv || !attn || !gu || !tmp || !scores) {
        free(x); free(h); free(qkv); free(attn); free(gu); free(tmp); free(scores);
        return -2;
    }
    const bf16 *embed = (const bf16 *)gp[G_EMBED];
    for (int m = 0; m < M; ++m) memcpy(x + (size_t)m * d.H, embed + (size_t)ids[m] * d.H, sizeof(bf16) * d.H);
    const bf16 *cos_t = (const bf16 *)gp[G_COS], *sin_t = (const bf16 *)gp[G_SIN];

#pragma omp parallel num_threads(nthreads)
    {
        float *my_scores = scores + (size_t)omp_get_thread_num() * max_len;
        for (int l = 0; l < layers; ++l) {
            const int64_t *P = lp + (size_t)l * L_N;
            bf16 *kv = (bf16 *)P[L_KV];
#pragma omp single
            for (int m = 0; m < M; ++m)
                rms_norm(x + (size_t)m * d.H, (const bf16 *)P[L_IN_NORM], d.H, d.eps, h + (size_t)m * d.H);
            gemv((const bf16 *)P[L_QKV_W], (const bf16 *)P[L_QKV_B], h, M, d.QKVN, d.H, qkv, d.QKVN, OUT_BF16);
            /* q and k heads: (q/k norm), rotary; each k head also writes its K and V */
#pragma omp for schedule(static)
            for (int t = 0; t < M * (d.NH + d.KV); ++t) {
                int m = t / (d.NH + d.KV), head = t % (d.NH + d.KV);
                bf16 *vec = qkv + (size_t)m * d.QKVN + (size_t)head * d.HD;
                if (d.qk_norm) {
                    const bf16 *w = (const bf16 *)P[head < d.NH ? L_Q_NORM : L_K_NORM];
                    bf16 normed[1024];
                    rms_norm(vec, w, d.HD, d.eps, normed);
                    memcpy(vec, normed, sizeof(bf16) * d.HD);
                }
                rotary(vec, cos_t + (size_t)pos[m] * d.ROT, sin_t + (size_t)pos[m] * d.ROT, d.ROT);
                if (head >= d.NH) {
                    int kvh = head - d.NH;
                    const bf16 *v = qkv + (size_t)m * d.QKVN + (size_t)(d.NH + d.KV + kvh) * d.HD;
                    memcpy(kv + ((size_t)kvh * d.slots + slots[m]) * d.HD, vec, sizeof(bf16) * d.HD);
                    memcpy(kv + ((size_t)(d.KV + kvh) * d.slots + slots[m]) * d.HD, v, sizeof(bf16) * d.HD);
                }
            }
#pragma omp for schedule(static)
            for (int t = 0; t < M * d.NH; ++t) {
                int m = t / d.NH, head = t % d.NH;
                attend(&d, qkv + (size_t)m * d.QKVN, kv, table, max_blocks, m, (int)pos[m], head, my_scores,
                       attn + (size_t)m * d.NH * d.HD + (size_t)head * d.HD);
            }
            gemv((const bf16 *)P[L_O_W], (const bf16 *)P[L_O_B], attn, M, d.H, d.NH * d.HD, tmp, d.H, OUT_BF16);
#pragma omp single
            for (int m = 0; m < M; ++m) {
                add_into(x + (size_t)m * d.H, tmp + (size_t)m * d.H, d.H);
                rms_norm(x + (size_t)m * d.H, (const bf16 *)P[L_POST_NORM], d.H, d.eps, h + (size_t)m * d.H);
            }
            gemv((const bf16 *)P[L_GU_W], (const bf16 *)P[L_GU_B], h, M, 2 * d.I, d.H, gu, 2 * d.I, OUT_BF16);
#pragma omp for schedule(static)
            for (int t = 0; t < M * d.I; ++t) {
                int m = t / d.I, i = t % d.I;
                float g = bf2f(gu[(size_t)m * 2 * d.I + i]), u = bf2f(gu[(size_t)m * 2 * d.I + d.I + i]);
                qkv[t] = f2bf(rbf(g / (1.0f + expf(-g))) * u);
            }
            gemv((const bf16 *)P[L_DOWN_W], (const bf16 *)P[L_DOWN_B], qkv, M, d.H, d.I, tmp, d.H, OUT_BF16);
#pragma omp single
            add_into(x, tmp, (size_t)M * d.H);
        }
#pragma omp single
        for (int m = 0; m < M; ++m)
            rms_norm(x + (size_t)m * d.H, (const bf16 *)gp[G_FINAL_NORM], d.H, d.eps, out + (size_t)m * d.H);
    }
    free(x); free(h); free(qkv); free(attn); free(gu); free(tmp); free(scores);
    return 0;
}

/* logits (M, N) float32 = bf16(hidden (M, K) . W (N, K)^T), as the eager lm_head then .float(). */
int ifl_logits(const bf16 *W, const bf16 *hidden, int M, int N, int K, float *out, int nthreads) {
    if (M <= 0 || N <= 0 || K <= 0 || nthreads <= 0) return -1;
#pragma omp parallel num_threads(nthreads)
    gemv(W, NULL, hidden, M, N, K, out, N, OUT_F32_VIA_BF16);
    return 0;
}
