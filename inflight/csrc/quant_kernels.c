/* inflight quantized matmul: y (M, N) = x (M, K) . dequantize(w)^T (+ bias), float32 in and out.
 * The scheme is in quant_kernels.h; this file is the entry point QuantLinear calls through
 * inflight/quant/kernels.py (built per instruction-set flavour by inflight/platform.py's flags,
 * like decode_kernel.c). One OpenMP parallel region: the activation rows are quantized, then
 * the output rows are split statically over the threads, each unpacking IFLQ_RT rows at a time
 * into its own L1/L2 buffer and multiplying them with every activation row (4 at a time).
 */
#include <omp.h>
#include <stdlib.h>

#include "quant_kernels.h"
#include "quant_gemm.h"
#include "tile_queue.h"
#include "vec_exp.h"
#include "row_stats.h" /* after vec_exp.h: its sums use ifl_exp16 / ifl_exp8 */

#ifdef IFLQ_AVX2
/* From this many activation rows on, the GEMM of quant_gemm.h runs, else iflq_rows' one-row dot.
 * The 8-row groups win from one row on (q8_0 [gate; up], single core: 30 -> 37 GFLOP/s at 1 row,
 * 62 -> 90 at 3; AVX2 q5_0 22 -> 30 at 1 row), so every AVX2+ product takes them. */
#ifndef IFLG_MIN_M
#define IFLG_MIN_M 1
#endif
#define IFLQ_GEMM_RT IFLG_RT
#define IFLG_CONST_OFFSET(qtype) iflv_const_offset(qtype)
#else
#define IFLQ_GEMM_RT IFLQ_RT
#endif

int ifl_quant_abi_version(void) { return 3; }

/* 0 portable C, 1 AVX2 (maddubs), 2 AVX-512 VNNI (vpdpbusd on 256-bit vectors) */
int ifl_quant_path(void) {
#if defined(IFLQ_VNNI)
    return 2;
#elif defined(IFLQ_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* 1 where `M` activation rows of `qtype` multiply straight from the blocks (quant_gemv.h iflv_use),
 * 0 where the rows are unpacked first: the same numbers, the speed apart (a test pins the paths) */
int ifl_quant_gemv_direct(int qtype, int M) { return qtype >= 0 && qtype < QT_N && M > 0 ? iflv_use(qtype, M) : 0; }

#define IFL_MAX_RUNS 8 /* a fused layer's runs of one layout (q / k / v of a Q4_K_M file: 2) */

/* One weight of a product: its columns of y and its tiles among all the runs' tiles. */
typedef struct {
    QWeight w;
    int col, gemm, rt, tile0;
    int32_t *xs16, *xs32; /* the GEMM's activation sums for this layout's constant offset */
    float *xb32;
} IflRun;

static int iflq_check(const QWeight *w) {
    const int qtype = w->qtype, K = w->K;
    if (qtype < 0 || qtype >= QT_N || w->N <= 0 || K <= 0 || K % 32) return -1;
    if ((qtype == QT_Q4_K || qtype == QT_Q5_K || qtype == QT_Q6_K) && K % 256) return -1;
    if ((qtype == QT_Q5_0G || qtype == QT_Q4_0G) && K % 128) return -1;
    if (qtype == QT_I4G && (w->group <= 0 || w->group % 16 || K % w->group)) return -1;
    return 0;
}

/* y[:, run.col + n] = x . w_n (+ bias) for every run: the activations are quantized once (one
 * parallel region; before, a fused layer of two layouts quantized its input once per layout and
 * joined the outputs with torch.cat), then all the runs' tiles are split over the threads. */
static int iflq_runs(IflRun *runs, int nruns, const float *x, int M, float *y, int ldy, const float *bias,
                     int nthreads) {
    const int K = runs[0].w.K;
    size_t per = 0, sums = 0;
    int tiles = 0;
    for (int r = 0; r < nruns; ++r) {
        IflRun *u = &runs[r];
        if (iflq_check(&u->w) || u->w.K != K) return -1;
#ifdef IFLQ_AVX2
        u->gemm = M >= IFLG_MIN_M && !iflv_use(u->w.qtype, M); /* K-quants / q8_0: quant_gemv.h at a few rows */
        const size_t b = u->gemm ? iflg_buf_bytes(K) : iflq_unpack_bytes(IFLQ_RT, K);
        sums += u->gemm ? iflg_act_bytes(M, K) : 0;
#else
        u->gemm = 0;
        const size_t b = iflq_unpack_bytes(IFLQ_RT, K);
#endif
        per = b > per ? b : per;
        u->rt = u->gemm ? IFLQ_GEMM_RT : IFLQ_RT;
        u->tile0 = tiles;
        tiles += (u->w.N + u->rt - 1) / u->rt;
    }
#if defined(IFLQ_AVX2) && !defined(IFLQ_VNNI)
    int wide = 0; /* a signed layout's GEMM takes the activations as int16 (quant_gemm_s16.h) */
    for (int r = 0; r < nruns; ++r) wide |= runs[r].gemm && iflq_signed(runs[r].w.qtype);
    int16_t *x16 = wide ? malloc(sizeof(int16_t) * (size_t)M * K) : NULL;
    if (wide && !x16) return -2;
#else
    int16_t *x16 = NULL;
#endif
    int8_t *xq = malloc((size_t)M * K);
    float *dx = malloc(sizeof(float) * ((size_t)M * (K / 32) + (size_t)M * (K / 16)) + sums);
    uint8_t *bufs = malloc(per * (size_t)nthreads);
    if (!xq || !dx || !bufs) {
        free(xq); free(dx); free(bufs); free(x16);
        return -2;
    }
    float *xb = dx + (size_t)M * (K / 32);
    uint8_t *at = (uint8_t *)(xb + (size_t)M * (K / 16));
    for (int r = 0; r < nruns; ++r) {
        runs[r].xs16 = (int32_t *)at, runs[r].xs32 = runs[r].xs16 + (size_t)M * (K / 16);
        runs[r].xb32 = (float *)(runs[r].xs32 + (size_t)M * (K / 32));
#ifdef IFLQ_AVX2
        if (runs[r].gemm) at += iflg_act_bytes(M, K);
#endif
    }
    uint64_t *tq = tq_alloc(nthreads);
    if (!tq) {
        free(xq); free(dx); free(bufs); free(x16);
        return -2;
    }
#pragma omp parallel num_threads(nthreads)
    {
        const int me = omp_get_thread_num(), nth = omp_get_num_threads();
        uint8_t *buf = bufs + per * (size_t)me;
#pragma omp for schedule(static)
        for (int m = 0; m < M; ++m) {
            iflq_quantize_row(x + (size_t)m * K, K, xq + (size_t)m * K, dx + (size_t)m * (K / 32),
                              xb + (size_t)m * (K / 16));
#if defined(IFLQ_AVX2) && !defined(IFLQ_VNNI)
            if (x16)
                for (int k = 0; k < K; k += 16)
                    _mm256_storeu_si256((__m256i *)(x16 + (size_t)m * K + k),
                                        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(xq + (size_t)m * K + k))));
#endif
#ifdef IFLQ_AVX2
            for (int r = 0; r < nruns; ++r)
                if (runs[r].gemm)
                    iflg_act_sums(m, K, IFLG_CONST_OFFSET(runs[r].w.qtype), xq, xb, runs[r].xs16, runs[r].xs32, runs[r].xb32);
#endif
        }
        int cur = 0, stop = 0, victim = me; /* the tiles balanced at run time (tile_queue.h) */
        for (int t; (t = tq_next(tq, 1, tiles, nth, me, &cur, &stop, &victim)) >= 0;) {
            int r = nruns - 1;
            while (t < runs[r].tile0) --r;
            const IflRun *u = &runs[r];
            const int n0 = (t - u->tile0) * u->rt, n1 = n0 + u->rt < u->w.N ? n0 + u->rt : u->w.N;
            float *yr = y + u->col;
            const float *br = bias ? bias + u->col : NULL;
#ifdef IFLQ_AVX2
            if (u->gemm) {
                const IflgAct act = {xq, dx, xb, u->xb32, u->xs16, u->xs32, x16};
                iflg_tile_rows(&u->w, n0, n1, &act, M, yr, ldy, br, buf);
                continue;
            }
#endif
            iflq_rows(&u->w, n0, n1, xq, dx, xb, M, yr, ldy, br, buf);
        }
    }
    free(xq); free(dx); free(bufs); free(x16); free(tq);
    return 0;
}

/* Returns 0, -1 on a bad argument, -2 out of memory. */
int ifl_quant_matmul(int qtype, int N, int K, int group, const uint8_t *data, const void *scales,
                     const uint8_t *zeros, int scales_per_row, const float *x, int M, float *y, const float *bias,
                     int nthreads) {
    if (M <= 0 || nthreads <= 0) return -1;
    IflRun run = {{qtype, N, K, group, data, (const uint16_t *)scales, zeros, scales_per_row}, 0, 0, 0, 0, NULL, NULL, NULL};
    return iflq_runs(&run, 1, x, M, y, N, bias, nthreads);
}

/* A fused layer's weights of several layouts, one product: run r (qtypes[r], Ns[r] rows, K
 * columns each) writes y's columns from sum(Ns[:r]); bias: sum(Ns) or NULL. Returns as above. */
int ifl_quant_matmul_runs(int nruns, const int *qtypes, const int *Ns, int K, const int *groups,
                          const uint8_t *const *datas, const void *const *scales, const uint8_t *const *zeros,
                          const int *scales_per_row, const float *x, int M, float *y, const float *bias, int nthreads) {
    if (nruns <= 0 || nruns > IFL_MAX_RUNS || M <= 0 || nthreads <= 0) return -1;
    IflRun runs[IFL_MAX_RUNS];
    int col = 0;
    for (int r = 0; r < nruns; ++r) {
        if (Ns[r] <= 0) return -1;
        runs[r] = (IflRun){{qtypes[r], Ns[r], K, groups[r], datas[r], (const uint16_t *)scales[r], zeros[r],
                            scales_per_row[r]}, col, 0, 0, 0, NULL, NULL, NULL};
        col += Ns[r];
    }
    return iflq_runs(runs, nruns, x, M, y, col, bias, nthreads);
}

static inline uint16_t iflq_f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, 0);
#else /* round to nearest even; the scales here are finite and >= 0 */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) { /* subnormal half */
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - exp;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) ++h;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
    return (uint16_t)(sign | h);
#endif
}

/* w (N, K) float -> Q8_0 blocks (N, K / 32 * 34), as llama.cpp's quantize_row_q8_0_ref. */
int ifl_quantize_q8_0(const float *w, int N, int K, uint8_t *out, int nthreads) {
    if (N <= 0 || K <= 0 || K % 32 || nthreads <= 0) return -1;
    const int nb = K / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b) {
            const float *x = w + (size_t)n * K + 32 * b;
            uint8_t *blk = out + ((size_t)n * nb + b) * 34;
            float amax = 0.f;
            for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
            float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
            uint16_t h = iflq_f2h(d);
            memcpy(blk, &h, 2);
            for (int i = 0; i < 32; ++i) blk[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
        }
    return 0;
}

/* Rows rows[0..nrows) of a GGML-layout weight (N, K) -> out (nrows, K) float32: the embedding's
 * lookup (quant/embedding.py), 1 row a decode step, where gguf-py's numpy formula costs ~70 us
 * (0.5B, Zen 4) against ~1 us here. Bit-exact to gguf-py's dequantize: every product below is the
 * format's own single rounding (d * sc, d * q and sc * q of a f16 d are exact in float32; the
 * signed offsets are applied to the integer q, as gguf-py does, before the one rounded multiply).
 * With out_bf (out NULL) each row then rounded to bf16 as torch's .to(torch.bfloat16) rounds (to
 * nearest even; a NaN to 0x7FC0, as torch's scalar path): a bf16 model's rows, without a torch op a
 * step (one_decode.py).
 * Returns 0, -1 on a bad argument (a row outside [0, N); i4g / i8c: not GGML layouts), -2 out of memory. */
static int dequantize_rows(int qtype, int N, int K, const uint8_t *data, const int64_t *rows, int nrows, float *out,
                           uint16_t *out_bf) {
    const QWeight w = {qtype, N, K, 0, data, NULL, NULL, 0};
    if (qtype == QT_I4G || qtype == QT_I8C || nrows < 0 || iflq_check(&w)) return -1;
    for (int r = 0; r < nrows; ++r)
        if (rows[r] < 0 || rows[r] >= N) return -1;
    uint8_t *q = malloc((size_t)K);
    float *ws = malloc(sizeof(float) * (size_t)(K / 16)), *wm = malloc(sizeof(float) * (size_t)(K / 16));
    float *tmp = out_bf ? malloc(sizeof(float) * (size_t)K) : NULL;
    if (!q || !ws || !wm || (out_bf && !tmp)) { free(q); free(ws); free(wm); free(tmp); return -2; }
    const int off = qtype == QT_Q4_0 || qtype == QT_Q4_0G ? -8 : qtype == QT_Q5_0 || qtype == QT_Q5_0G ? -16 : qtype == QT_Q6_K ? -32 : 0;
    for (int r = 0; r < nrows; ++r) {
        float *o = out_bf ? tmp : out + (size_t)r * K;
        iflq_unpack_row(&w, (int)rows[r], q, ws, wm);
        if (qtype == QT_Q8_0) {
            for (int i = 0; i < K; ++i) o[i] = (float)(int8_t)q[i] * ws[i / 16];
        } else if (off) {
            for (int i = 0; i < K; ++i) o[i] = ws[i / 16] * (float)((int)q[i] + off);
        } else { /* q4_1 q5_1 q4_k q5_k: ws * q is exact, so fused or not the sum rounds once */
            for (int i = 0; i < K; ++i) o[i] = ws[i / 16] * (float)q[i] + wm[i / 16];
        }
        for (int i = 0; out_bf && i < K; ++i) {
            uint32_t u;
            memcpy(&u, &o[i], 4);
            out_bf[(size_t)r * K + i] = o[i] != o[i] ? 0x7FC0 : (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
        }
    }
    free(q); free(ws); free(wm); free(tmp);
    return 0;
}

int ifl_quant_dequantize_rows(int qtype, int N, int K, const uint8_t *data, const int64_t *rows, int nrows, float *out) {
    return dequantize_rows(qtype, N, K, data, rows, nrows, out, NULL);
}

int ifl_quant_dequantize_rows_bf16(int qtype, int N, int K, const uint8_t *data, const int64_t *rows, int nrows,
                                   uint16_t *out) {
    return dequantize_rows(qtype, N, K, data, rows, nrows, NULL, out);
}

/* argmax[r] = torch's argmax of row r of x (rows, n) float32, row stride ld (the first maximum; the
 * first NaN if any); logprob[r], when not NULL: that token's log-softmax (float64; NaN as torch's).
 * The sampler's greedy rows (sample/sampler.py): torch's log_softmax + gather + argmax read a 32 x
 * 152k batch three times cache-cold (~4 ms a step on 2 Zen 4 threads, ~2 % of a 32-row
 * Qwen2.5-0.5B decode step); here one max pass and one sum of e^(x - max) per slice of a row, the
 * slices of long rows spread over the threads (row_stats.h, the decode kernel's own). */
int ifl_row_stats(const float *x, int rows, int64_t n, int64_t ld, int64_t *argmax, double *logprob, int nthreads) {
    if (rows < 0 || n <= 0 || ld < n || nthreads <= 0) return -1;
    if (rows == 0) return 0;
    const int S = n >= 32768 ? nthreads : 1; /* slices a row: a short row in one piece */
    SliceStat *st = malloc(sizeof(SliceStat) * (size_t)rows * S);
    if (!st) return -2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int t = 0; t < rows * S; ++t) {
        const int m = t / S, c = t % S;
        slice_stat(x + (size_t)m * (size_t)ld, n * c / S, n * (c + 1) / S, logprob != NULL, st + t);
    }
    row_stats_merge(st, rows, S, argmax, logprob);
    free(st);
    return 0;
}

/* out (T, I) = SiLU(y[:, :I]) * y[:, I:] of a [gate; up] product y (T, 2 I): QuantLinear's MLP
 * activation in one pass over y, SiLU as x / (1 + e^-x) with vec_exp.h's exp (2 ulp; the decode
 * kernel's), instead of torch's silu of the strided gate view and a multiply (two passes and a
 * temporary: 3.0 + ~1.5 ms of a 32-row Qwen2.5-0.5B decode step, ~130 ms of a 512-token chunk). */
int ifl_silu_mul(const float *y, int64_t T, int64_t I, float *out, int nthreads) {
    if (T < 0 || I <= 0) return -1;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const float *g = y + (size_t)t * 2 * I, *u = g + I;
        float *o = out + (size_t)t * I;
        int64_t i = 0;
#if defined(__AVX512F__)
        const __m512 one16 = _mm512_set1_ps(1.f);
        for (; i + 16 <= I; i += 16) {
            const __m512 v = _mm512_loadu_ps(g + i);
            const __m512 s = _mm512_div_ps(v, _mm512_add_ps(one16, ifl_exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
            _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
        }
#endif
#ifdef IFLQ_AVX2
        const __m256 one8 = _mm256_set1_ps(1.f);
        for (; i + 8 <= I; i += 8) {
            const __m256 v = _mm256_loadu_ps(g + i);
            const __m256 s = _mm256_div_ps(v, _mm256_add_ps(one8, ifl_exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    return 0;
}

/* RMSNorm of T rows of H floats, a residual added first when res is given (the decoder layer's
 * x + attention(x) before its post-attention norm): sum = x + res (written to sum, which may be
 * x), out = w * sum / sqrt(mean(sum^2) + eps), in float32 as Hugging Face computes a float32 model.
 * One pass per row where torch runs add, rms_norm and a multiply by w (three passes and two
 * temporaries; ~110 us a call at 32 x 896 on 2 Zen 4 threads, 96 calls a Qwen2.5-0.5B step). */
int ifl_rms_norm(const float *x, const float *res, const float *w, int64_t T, int64_t H, float eps, float *sum,
                 float *out, int nthreads) {
    if (T < 0 || H <= 0) return -1;
/* one thread below ~256 K floats: a 32 x 896 decode step's norm is ~3 us, less than waking a thread */
#pragma omp parallel for num_threads(nthreads) schedule(static) if (T * H >= 262144)
    for (int64_t t = 0; t < T; ++t) {
        const float *a = x + (size_t)t * H, *r = res ? res + (size_t)t * H : NULL;
        float *sm = sum ? sum + (size_t)t * H : NULL, *o = out + (size_t)t * H;
        const float *v = a;
        if (r) {
            for (int64_t i = 0; i < H; ++i) sm[i] = a[i] + r[i];
            v = sm;
        }
        float ss = 0.f;
        int64_t i = 0;
#ifdef IFLQ_AVX2
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (; i + 16 <= H; i += 16) {
            const __m256 p = _mm256_loadu_ps(v + i), q = _mm256_loadu_ps(v + i + 8);
            acc0 = _mm256_fmadd_ps(p, p, acc0);
            acc1 = _mm256_fmadd_ps(q, q, acc1);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(acc0, acc1));
        for (int j = 0; j < 8; ++j) ss += lanes[j];
#endif
        for (; i < H; ++i) ss += v[i] * v[i];
        const float inv = 1.0f / sqrtf(ss / (float)H + eps);
        for (i = 0; i < H; ++i) o[i] = w[i] * (v[i] * inv);
    }
    return 0;
}
